"""Graphs that mix host (CPU) tensors with lazy ones: run the host part eagerly, capture the rest.

Design note.  On devices other than CUDA, `torch.optim` keeps each parameter's `step` count
as a 0-dim CPU tensor, and under Dynamo (`torch.compile(opt.step)`) Adam's bias corrections
become CPU tensor arithmetic on those counts (`_foreach_add_(steps, 1)`, `_foreach_pow(beta,
steps)`, ...) whose results scale the lazy updates.  A captured body can only hold lazy
values, and moving the counts to the device would make their in-place `+= 1` a device-to-host
read every step.  So such a graph is split in two:

* the *host graph*: the writes into CPU inputs (`step += 1`), CPU outputs, what they read,
  and CPU factories, in the original order, run eagerly at each call: the same kernels eager
  runs, and the CPU tensors hold their new values right away;
* the *device graph*: everything else, captured as usual (`capture.py`), including the CPU
  arithmetic on the host values (bias corrections: dozens of tiny kernels per step, cheaper
  in the compiled program than eagerly).  The 0-dim host values it reads arrive packed in one
  1-D CPU tensor per dtype (one upload per call, not one per value) and are unpacked by
  `select` nodes at its start, which the body records like any other view.

A host node that reads a lazy value (a device-to-host read), or a non-0-dim host tensor read
by a lazy op, makes the split refuse (`None`): the graph then runs by replay.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ..base import counters
from ..tensor.host import upload
from ..tensor.lazy_tensor import LtcTensor, unwrap
from .capture import GraphFunction
from .vectorize import vectorize_scalar_foreach

_select = torch.ops.aten.select.int
_stack = torch.ops.aten.stack.default
_copy_ = torch.ops.aten.copy_.default


def _vals(v: Any) -> list:
    """The tensor values in a node's `meta["val"]` (a tensor, or a list/tuple of them)."""
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [e for e in v if isinstance(e, torch.Tensor)]
    return []


def _is_cpu(v: Any) -> bool | None:
    """True: CPU tensors only; False: some tensor elsewhere; None: no tensor."""
    ts = _vals(v)
    if not ts:
        return None
    return all(t.device.type == "cpu" for t in ts)


class HostSplit:
    """The two graphs and how a call's arguments and results map onto them."""

    def __init__(self, host_gm: fx.GraphModule, device_gm: fx.GraphModule, device_args: list[int],
                 packed_dtypes: list[torch.dtype], outputs: list[tuple[str, int]]) -> None:
        self.host_gm = host_gm
        self.device_gm = device_gm
        self.device_args = device_args        # positions of the call's args the device graph takes
        self.packed_dtypes = packed_dtypes    # one packed host tensor per dtype, in this order
        self.outputs = outputs                # per original output: ("host" | "device", index)


def split_host(gm: fx.GraphModule) -> HostSplit | None:
    """Split `gm` into a host graph and a device graph, or None when it has no CPU tensor
    placeholder or cannot be split (see the module note)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if not any(_is_cpu(n.meta.get("val")) for n in placeholders):
        return None
    if any(n.op not in ("placeholder", "call_function", "output") for n in nodes):
        return None
    out_node = next(n for n in nodes if n.op == "output")
    out_args = list(out_node.args[0])
    # What must run on the host: writes into CPU inputs, CPU outputs, and what they read.
    # Any other CPU arithmetic (Adam's bias corrections) runs on the device, on the uploaded
    # 0-dim values: one kernel launch per value is cheaper in a compiled program than eagerly.
    cpu_inputs = {n for n in placeholders if _is_cpu(n.meta.get("val"))}
    sinks = [n for n in nodes if n.op == "call_function" and n.target is _copy_
             and n.args[0] in cpu_inputs]
    sinks += [a for a in out_args if isinstance(a, fx.Node) and _is_cpu(a.meta.get("val"))]
    host: set[fx.Node] = set(cpu_inputs)
    stack = list(sinks)
    while stack:
        n = stack.pop()
        if n in host:
            continue
        if not _is_cpu(n.meta.get("val")):
            return None          # a host value computed from a lazy one: a device-to-host read
        host.add(n)
        stack.extend(n.all_input_nodes)
    # CPU factories (no tensor input) stay on the host too
    for n in nodes:
        if n.op == "call_function" and n not in host and _is_cpu(n.meta.get("val")) and not any(
                _is_cpu(a.meta.get("val")) is not None for a in n.all_input_nodes):
            host.add(n)
    # host values the device side reads, which must be 0-dim to be packed
    boundary: list[fx.Node] = []
    for n in nodes:
        if n in host or n.op == "output":
            continue
        for a in n.all_input_nodes:
            if a in host and a not in boundary:
                v = a.meta.get("val")
                if not isinstance(v, torch.Tensor) or v.dim() != 0:
                    return None
                boundary.append(a)
    host_outs = [a for a in out_args if isinstance(a, fx.Node) and a in host]

    dtypes: list[torch.dtype] = []
    groups: dict[torch.dtype, list[fx.Node]] = {}
    for b in boundary:
        dt = b.meta["val"].dtype
        if dt not in groups:
            groups[dt] = []
            dtypes.append(dt)
        groups[dt].append(b)

    # host graph: every placeholder (the call's arguments as they are), the host nodes,
    # returning the packed boundary values and the host outputs
    hg = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        if n.op == "placeholder":
            env[n] = hg.placeholder(n.name)
            env[n].meta["val"] = n.meta.get("val")
        elif n in host and n.op != "placeholder":
            env[n] = hg.node_copy(n, lambda a: env[a])
    packed = [hg.call_function(_stack, ([env[b] for b in groups[dt]],)) for dt in dtypes]
    hg.output(tuple(packed + [env[a] for a in host_outs]))

    # device graph: the other placeholders, then one per packed dtype unpacked by `select`
    dg = fx.Graph()
    denv: dict[fx.Node, fx.Node] = {}
    device_args = []
    for i, n in enumerate(placeholders):
        if n not in host:
            denv[n] = dg.placeholder(n.name)
            device_args.append(i)
    for dt in dtypes:
        p = dg.placeholder(f"host_values_{str(dt).replace('torch.', '')}")
        p.meta["val"] = torch.empty(len(groups[dt]), dtype=dt, device="meta")
        for k, b in enumerate(groups[dt]):
            denv[b] = dg.call_function(_select, (p, 0, k))
            denv[b].meta["val"] = b.meta["val"]
    for n in nodes:
        if n.op in ("placeholder", "output") or n in host:
            continue
        denv[n] = dg.node_copy(n, lambda a: denv[a])
    outputs: list[tuple[str, int]] = []
    dev_outs: list[Any] = []
    for a in out_args:
        if isinstance(a, fx.Node) and a in host:
            outputs.append(("host", len(dtypes) + host_outs.index(a)))
        else:
            outputs.append(("device", len(dev_outs)))
            dev_outs.append(denv[a] if isinstance(a, fx.Node) else a)
    dg.output(tuple(dev_outs))
    host_gm, device_gm = fx.GraphModule(gm, hg), fx.GraphModule(gm, dg)
    vectorize_scalar_foreach(host_gm)
    vectorize_scalar_foreach(device_gm)
    return HostSplit(host_gm, device_gm, device_args, dtypes, outputs)


class SplitGraphFunction:
    """A `GraphFunction` for a graph with host tensors: the host graph eagerly, then the device
    graph captured, its host inputs uploaded in one packed tensor per dtype."""

    def __init__(self, split: HostSplit, label: str) -> None:
        self._boxed_call = True     # see GraphFunction
        self.split = split
        self.device_fn = GraphFunction(split.device_gm, label)

    def __call__(self, args: list) -> list:
        s = self.split
        host_out = s.host_gm(*args)
        ctx = None
        for i in s.device_args:
            a = args[i]
            if isinstance(a, torch.Tensor) and a.device.type == "ltc":
                ctx = (a if type(a) is LtcTensor else unwrap(a))._ctx
                break
        n = len(s.packed_dtypes)
        if ctx is None:     # nothing lazy after all: the device graph runs as it is
            dev_in = [args[i] for i in s.device_args] + list(host_out[:n])
        else:
            counters.counter("CompiledGraphHostSplit")
            dev_in = [args[i] for i in s.device_args] + [upload(ctx, p) for p in host_out[:n]]
        dev_out = self.device_fn(dev_in)
        return [host_out[k] if where == "host" else dev_out[k] for where, k in s.outputs]
