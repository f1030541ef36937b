"""`GraphFunction`: a captured FX graph as a callable that records one IR node per call.

Design note.  AOTAutograd hands the backend aten-level FX graphs (forward, backward, or an
inference graph) and later calls what the backend returned with the real arguments: here,
`ltc` tensors (functional wrappers), Python numbers and None.  The first call for a given set
of argument metadata *captures* the graph:

1. each tensor argument is replaced by a placeholder, a DEVICE_DATA node of the argument's
   shape, strides and dtype holding zeros (never read when capture succeeds);
2. the FX graph runs once through ordinary lazy tracing (`GraphModule.forward` on the
   placeholders, autograd off, traced privately: no other thread cuts it, its random draws
   leave the device's generator as it was): the IR it produces is exactly what uncompiled
   tracing of the same ops produces;
3. that IR, from the outputs back to the placeholders, becomes the body of a `Subgraph`
   (`subgraph.py`).

Every later call with the same metadata costs a dict lookup, unwrapping the arguments and
building ONE `Node(subgraph, operands, (), scalars, output metas)` plus the output tensors:
no per-op dispatch, no schema binding, no shape inference.  The outputs are ordinary pending
lazy tensors; `mark_step` cuts them with whatever else is live, and the executor keys,
caches, compiles (the TorchScript lowering inlines the body) and runs the step as before.

Capture keys on what shapes the IR: each tensor argument's (shape, strides, dtype), the
values of non-tensor arguments (SymInts of dynamic-shape graphs, floats), and the device.
Dynamo's guards already fix most of this; the key makes a different layout or size (a
dynamic-shape graph called at a new size) capture again instead of lying about strides.

A graph that cannot be captured runs by *replay*: `GraphModule.forward` on the real arguments
through ordinary lazy tracing, every call (still lazy and asynchronous, never eager).  That
happens when an argument is a tensor on another device type (a CPU step count), an output is
not an `ltc` tensor (a SymInt), or capture saw something that is not a pure function of the
placeholders: an eager fallback, a host read, a transfer, an exception.  Counters:
`CompiledGraphCapture` (captures), `CompiledGraphCall` (calls that recorded one node),
`CompiledGraphReplay` (calls replayed), `CompiledGraphReplay::<reason>` (why, once per key).

Threads: `_capture_lock` (re-entrant) runs one capture at a time (one per key).  The recording
traces privately (`DeviceContext.private_tracing`): its tensors are not live tensors of the
device, so another thread's `mark_step` on the same device neither runs the recording on its
placeholders nor cuts it (it did: the step failed with a None input once the placeholders were
dropped, or read wrong values), and its random ops do not advance the device's generator, which
other threads keep drawing from meanwhile.  Replaying a captured graph takes no lock of its own
(it traces one node, like any op).
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..base import counters
from ..executor.futures import BackendData
from ..ir.node import DEVICE_DATA, Node, TensorMeta, make_data_node, post_order
from ..tensor.lazy_tensor import LtcTensor, make_tensor, unwrap, wrap
from ..tensor.writeback import write
from .subgraph import Subgraph

_wrap = torch._to_functional_tensor
_from_functional = torch._from_functional_tensor
_sync = torch._functionalize_sync   # `torch._sync` minus its FunctionalTensor (AOT) case
_is_functional = torch._is_functional_tensor

# Counters that mean the capture run did something other than trace the graph's ops.
_IMPURE = ("EagerFallback", "DataDependentSync", "HostMutation", "TransferToDevice", "TensorToHost")

_capture_lock = threading.RLock()   # one capture at a time: a key is captured once

_ARG, _OUT, _NONE, _CONST, _BARE = 0, 1, 2, 3, 4   # how a graph output is produced (Capture.outs)


class _Replay:
    """A capture key whose graph runs by replay (`reason` says why)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Capture:
    """One captured body and how a call maps onto it."""

    __slots__ = ("consts", "formals", "mutations", "op", "outs")

    def __init__(self, op: Subgraph | None, formals: tuple[int, ...], consts: tuple,
                 outs: tuple, mutations: tuple) -> None:
        self.op = op                # None: every output is an argument or None
        self.formals = formals      # per body leaf that is an argument: its index among tensors
        self.consts = consts        # (node, 0) of each captured constant leaf
        # per graph output: (_OUT | _BARE, body root, meta) | (_ARG, argument index) | (_NONE,)
        # | (_CONST, a Python number); _BARE: no functional wrapper (see `bare_from`)
        self.outs = outs
        # per input the graph writes (`copy_` into it, AOTAutograd's kept input mutations):
        # (argument index, (_OUT, body root, meta) | (_ARG, argument index))
        self.mutations = mutations


class GraphFunction:
    """The callable the `ltc` backend returns for one AOTAutograd graph (boxed convention:
    called with a list of arguments, returns a list)."""

    def __init__(self, gm: torch.fx.GraphModule, label: str, bare_from: int | None = None) -> None:
        # an instance attribute: AOTAutograd wraps backward compilers' results with
        # `functools.wraps`, which copies the instance `__dict__`, not class attributes
        self._boxed_call = True
        self.gm = gm
        self.label = label
        # outputs from this index on are only saved for the backward graph (a forward graph's
        # activations): they stay bare `LtcTensor`s, never seen by user code or autograd, so
        # they skip functionalization's wrapper (and the backward skips unwrapping them)
        self.bare_from = bare_from
        self._captures: dict[Any, Capture | _Replay] = {}
        self._last: tuple[Any, Capture | _Replay] | None = None   # (key, capture), one object:
        # threads calling the same compiled function never pair one's key with another's capture

    def __call__(self, args: list) -> list:
        inner: list[LtcTensor] = []     # the LtcTensor of each tensor argument, in order
        others: list[Any] = []          # the other arguments (SymInt values, ...)
        ctx = None
        for a in args:
            if isinstance(a, torch.Tensor):
                if _is_functional(a):
                    _sync(a)                    # apply pending view updates (as `unwrap`)
                    t = _from_functional(a)
                else:
                    t = a
                if type(t) is not LtcTensor:
                    return self._replay(args, "non_ltc_tensor_argument")
                if ctx is None:
                    ctx = t._ctx
                elif t._ctx is not ctx:
                    return self._replay(args, "several_devices")
                inner.append(t)
            else:
                others.append(a)
        key = (ctx, tuple([t._m for t in inner]), tuple(others))
        last = self._last
        cap = last[1] if last is not None and last[0] == key else self._captures.get(key)
        if cap is None:
            with _capture_lock:
                cap = self._captures.get(key) or self._capture(args, inner, ctx, key)
        self._last = (key, cap)
        if type(cap) is _Replay:
            counters.counter("CompiledGraphReplay")
            return list(self.gm(*args))
        counters.counter("CompiledGraphCall")
        node = None
        op = cap.op
        if op is not None:
            operands = tuple([inner[k]._v for k in cap.formals]) + cap.consts
            node = Node(op, operands, op.template, op.call_scalars(ctx), op.outputs, op.out_spec,
                        key=op.node_key)
        out: list[Any] = []
        for o in cap.outs:
            kind = o[0]
            if kind is _OUT:
                out.append(_wrap(make_tensor(ctx, node, o[1], o[2])))
            elif kind is _BARE:
                out.append(make_tensor(ctx, node, o[1], o[2]))
            elif kind is _ARG:
                out.append(args[o[1]])
            elif kind is _CONST:
                out.append(o[1])
            else:
                out.append(None)
        if cap.mutations:
            _apply_mutations(ctx, node, args, cap.mutations)
        return out

    # -- capture ----------------------------------------------------------------------

    def _replay(self, args: list, reason: str) -> list:
        """Run the graph by ordinary lazy tracing (arguments the fast path cannot take)."""
        if reason not in self._captures:
            self._captures[reason] = _Replay(reason)
            counters.counter("CompiledGraphReplay::" + reason)
        counters.counter("CompiledGraphReplay")
        return list(self.gm(*args))

    def _capture(self, args: list, inner: list[LtcTensor], ctx: Any, key: Any) -> Capture | _Replay:
        placeholders: list[Node] = []
        try:
            cap: Capture | _Replay = self._record(args, inner, ctx, placeholders)
        except Exception as e:  # noqa: BLE001 - the real run (replay) raises what applies
            cap = _Replay(f"capture_raised:{type(e).__name__}")
        # the recording's tensors are gone with `_record`'s frame (or, if something still
        # holds one, are no longer pending work of the device): a body keeps its leaves'
        # structure, not their placeholder values
        _forget(ctx, placeholders)
        for node in placeholders:
            node.data = None
        if type(cap) is _Replay:
            counters.counter("CompiledGraphReplay::" + cap.reason)
        else:
            counters.counter("CompiledGraphCapture")
        self._captures[key] = cap
        return cap

    def _record(self, args: list, inner: list[LtcTensor], ctx: Any,
                placeholder_nodes: list[Node]) -> Capture | _Replay:
        """Trace the graph once on placeholders (see the module note)."""
        if ctx is None:
            return _Replay("no_ltc_tensor")
        placeholders: dict[int, int] = {}       # id(placeholder node) -> argument index
        ph_nodes: dict[int, Node] = {}          # argument index -> its placeholder node
        ph_args: list[Any] = []
        k = 0
        for j, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                m = inner[k]._m
                node = make_data_node(BackendData(ctx, m, value=_placeholder_value(m, ctx.backend_device)), m)
                placeholders[id(node)] = j
                ph_nodes[j] = node
                placeholder_nodes.append(node)
                ph_args.append(wrap(make_tensor(ctx, node, 0, m)))
                k += 1
            else:
                ph_args.append(a)
        before = {c: counters._counters.get(c, 0) for c in _IMPURE}
        # no dispatch modes: AOTAutograd runs the first call under an analysis mode, whose
        # re-dispatch would take factory results out of functionalization.  Privately: another
        # thread's `mark_step` on this device must not cut the recording (module note)
        with torch.no_grad(), _disable_current_modes(), ctx.private_tracing():
            outs = self.gm(*ph_args)
        if any(counters._counters.get(c, 0) != n for c, n in before.items()):
            return _Replay("impure_capture")

        roots: list[tuple[Node, int]] = []
        root_index: dict[tuple[int, int], int] = {}

        def source(v: tuple[Node, int]) -> list:
            n, i = v
            if n.op is DEVICE_DATA and id(n) in placeholders:
                return [_ARG, placeholders[id(n)]]
            r = root_index.get((id(n), i))
            if r is None:
                r = root_index[(id(n), i)] = len(roots)
                roots.append(v)
            return [_OUT, r, None]

        result: list[list] = []
        for o in outs:
            if o is None:
                result.append([_NONE])
            elif isinstance(o, torch.Tensor) and o.device.type == "ltc":
                t = unwrap(o)
                if t._ctx is not ctx:
                    return _Replay("several_devices")
                result.append(source(t._v))
            elif type(o) in (int, float, bool):
                # a size (a SymInt of a dynamic-shape graph): fixed by the capture key
                result.append([_CONST, o])
            else:
                return _Replay("non_tensor_output")
        mutated: list[tuple[int, list]] = []
        for j, node in ph_nodes.items():
            t = unwrap(ph_args[j])
            if t._v != (node, 0):
                mutated.append((j, source(t._v)))

        formals: list[tuple[int, Node]] = []
        consts: list[Node] = []
        ops: list[Node] = []
        for n in post_order([n for n, _ in roots]):
            if n.op is DEVICE_DATA:
                if id(n) in placeholders:
                    formals.append((placeholders[id(n)], n))
                elif n.data is not None and n.data.future is None:
                    consts.append(n)    # a value captured as a constant (0-dim upload, ...)
                else:
                    return _Replay("pending_leaf")
            else:
                ops.append(n)
        formals.sort(key=lambda p: p[0])
        tensor_index = {j: i for i, j in enumerate(ph_nodes)}
        op = Subgraph([n for _, n in formals] + consts, ops, roots, self.label) if roots else None

        bare_from = len(result) if self.bare_from is None else self.bare_from

        def final(s: list, k: int = -1) -> tuple:      # k: output index (-1: a mutation)
            if s[0] is _OUT:
                return (_BARE if 0 <= bare_from <= k else _OUT, s[1], op.outputs[s[1]])
            return tuple(s)
        return Capture(op, tuple(tensor_index[j] for j, _ in formals), tuple((n, 0) for n in consts),
                       tuple(final(s, k) for k, s in enumerate(result)),
                       tuple((j, final(s)) for j, s in mutated))


def _forget(ctx: Any, placeholders: list[Node]) -> None:
    """Unregister the capture's tensors that are still alive (a reference cycle, a tensor a
    graph stored on the side): their IR reads placeholders whose values are dropped, so the next
    step must not cut them.  Only tensors whose IR reaches a placeholder are touched; other
    threads' tensors on the same device are not."""
    if ctx is None or not placeholders:
        return
    reaches: dict[int, bool] = {id(n): True for n in placeholders}

    def built_on_placeholders(node: Node) -> bool:
        stack = [(node, False)]
        while stack:   # iterative post-order (graphs are deep), memoized across tensors
            n, expanded = stack.pop()
            if id(n) in reaches:
                continue
            if expanded:
                reaches[id(n)] = any(reaches[id(o)] for o, _ in n.operands)
            else:
                stack.append((n, True))
                stack.extend((o, False) for o, _ in n.operands if id(o) not in reaches)
        return reaches[id(node)]
    for t in ctx.live_tensors():
        if built_on_placeholders(t._v[0]):
            ctx.unregister(t)


def _apply_mutations(ctx: Any, node: Node | None, args: list, mutations: tuple) -> None:
    """Write the graph's kept input mutations into the arguments, in order, as `copy_` would
    (`tensor/writeback.py`: the new value seen through every alias, the version counter
    bumped; a parameter, a view nobody shares, takes a fresh storage holding its new value, so
    its later reads replay no view chain -- the largest per-tensor cost of a compiled step)."""
    with torch.no_grad():
        for j, src in mutations:
            if src[0] is _OUT:
                new = make_tensor(ctx, node, src[1], src[2])
            else:
                v = _inner(args[src[1]])
                new = make_tensor(ctx, v._v[0], v._v[1], v._m)
            write([args[j]], [new])


def _inner(a: torch.Tensor) -> LtcTensor:
    if _is_functional(a):
        _sync(a)
        return _from_functional(a)
    return a


def _placeholder_value(m: TensorMeta, device: torch.device) -> torch.Tensor:
    """A placeholder's value, with exactly the layout `m` (strides may overlap: expanded).
    Never read when the capture succeeds; if a host read during the capture runs it anyway,
    integer tensors hold zeros (valid indices), floating ones are left uninitialized."""
    size = 1 + sum((s - 1) * st for s, st in zip(m.shape, m.stride)) if all(m.shape) else 0
    make = torch.empty if m.dtype.is_floating_point or m.dtype.is_complex else torch.zeros
    return make(size, dtype=m.dtype, device=device).as_strided(m.shape, m.stride)
