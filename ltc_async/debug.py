"""IR dumps and graph hashes (LTC's `ir_dump_util`, `torch._lazy.debug`), and the diagnostics:
recompile explanations and step timelines (`diagnostics/`)."""
from __future__ import annotations

import hashlib
import os
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import torch

from .base import events
from .base.config import config
from .diagnostics import recompiles as _recompiles
from .diagnostics.recompiles import RecompileWarning
from .diagnostics.timeline import Span, Timeline, timeline
from .executor import arena as _arena
from .executor import graph_executor as gx
from .executor import tiers as _tiers
from .ir.node import (
    DEVICE_DATA,
    NUM,
    RNG,
    SCALAR,
    TENSOR,
    TENSOR_LIST,
    Node,
    Tag,
    const_value,
    post_order,
)
from .tensor import shapes
from .tensor.lazy_tensor import unwrap

__all__ = ["dump_ir", "graph_hash", "explain_recompiles", "recompile_log", "timeline", "Timeline",
           "Span", "RecompileWarning"]


def wait_compiles(timeout: float | None = None) -> bool:
    """Block until every background (top-tier) compile queued so far has finished, for
    benchmarks and tests; False on timeout (`executor/tiers.py`).  Executions still queued on
    the devices run first (they are what queues builds)."""
    end = None if timeout is None else time.monotonic() + timeout

    def left() -> float | None:
        return None if end is None else max(0.0, end - time.monotonic())
    for ctx in _arena.started():   # errors stay for the next barrier
        if not ctx.wait(left()):
            return False
    return _tiers.wait_compiles(left())


def explain_recompiles(enabled: bool = True) -> None:
    """Explain every graph-cache miss at a call site after its first graph there (also
    `LTC_ASYNC_EXPLAIN_RECOMPILES=1`): an `ltc.RecompileWarning` at the user's `mark_step` /
    sync line names the call site, the closest cached graph and the first difference (node,
    op, which of shape / dtype / constant / op / input differs with both values, and the line
    that traced the node).  While on, node origins are recorded (`LTC_ASYNC_IR_DEBUG`) and
    `mark_step` returns once its graph is compiled (the warning comes from the caller's line)."""
    _recompiles.enable(enabled)


def recompile_log() -> list[str]:
    """The most recent recompile explanations, oldest first."""
    return _recompiles.recompile_log()


def _roots(tensors: Sequence[torch.Tensor]) -> list[tuple[Node, int]]:
    roots: list[tuple[Node, int]] = []
    for t in tensors:
        inner = unwrap(t)
        if inner._v not in roots:
            roots.append(inner._v)
    return roots


def _fmt_arg(e: object, names: dict[tuple[int, int], str], node: Node) -> str:
    if type(e) is tuple and e and type(e[0]) is Tag:
        if e[0] is TENSOR:
            o, i = node.operands[e[1]]
            return names[(id(o), i)]
        if e[0] is TENSOR_LIST:
            return "[" + ", ".join("None" if r is None else names[(id(node.operands[r][0]), node.operands[r][1])]
                                   for r in e[1]) + "]"
        if e[0] is SCALAR:
            return f"scalar<{e[2].__name__}>={node.scalars[e[1]]!r}"
        if e[0] is RNG:
            return f"rng_seed={node.scalars[e[1]]}"
        if e[0] is NUM:
            return repr(const_value(e))
    return repr(e)


def dump_ir(tensors: Sequence[torch.Tensor], fmt: str = "text") -> str:
    """The pending IR graph producing `tensors`: `fmt` is "text", "dot" (Graphviz) or
    "backend" (the backend's lowered program, e.g. TorchScript IR)."""
    return _dump_roots(_roots(tensors), fmt, tensors)


def _dump_roots(roots: list[tuple[Node, int]], fmt: str, tensors: Sequence[torch.Tensor] = ()) -> str:
    if fmt == "backend":
        order = post_order([n for n, _ in roots])
        ctx = unwrap(tensors[0])._ctx
        return ctx.backend.compile(order, roots, ctx.backend_device).backend_text
    order = post_order([n for n, _ in roots])
    names: dict[tuple[int, int], str] = {}
    lines = []
    for k, n in enumerate(order):
        outs = []
        for i, m in enumerate(n.outputs):
            names[(id(n), i)] = f"%{k}" if len(n.outputs) == 1 else f"%{k}.{i}"
            outs.append(f"{names[(id(n), i)]}: {str(m.dtype).replace('torch.', '')}{list(m.shape)}")
        if n.op is DEVICE_DATA:
            body = "device_data()"
        else:
            body = f"{n.name}({', '.join(_fmt_arg(e, names, n) for e in n.template)})"
        origin = f"  # {n.origin}" if n.origin else ""
        lines.append(f"  {', '.join(outs)} = {body}{origin}")
    if fmt == "text":
        roots_s = ", ".join(names[(id(n), i)] for n, i in roots)
        return "IR {\n" + "\n".join(lines) + f"\n  ROOT: ({roots_s})\n}}\n"
    if fmt == "dot":
        dot = ["digraph G {"]
        for k, n in enumerate(order):
            shape = "box" if n.op is DEVICE_DATA else "ellipse"
            dot.append(f'  node{k} [label="{n.name}\\n{[list(m.shape) for m in n.outputs]}", shape={shape}]')
        pos = {id(n): k for k, n in enumerate(order)}
        for k, n in enumerate(order):
            for j, (o, i) in enumerate(n.operands):
                dot.append(f'  node{pos[id(o)]} -> node{k} [label="o{i}->i{j}"]')
        dot.append("}")
        return "\n".join(dot) + "\n"
    raise ValueError(f"dump_ir: unknown fmt {fmt!r}; use 'text', 'dot' or 'backend'")


def graph_hash(tensors: Sequence[torch.Tensor]) -> str:
    """A hex digest of the exact graph key `mark_step` would compile these tensors under."""
    roots = _roots(tensors)
    pending = [(n, i) for n, i in roots if n.op is not DEVICE_DATA]
    key = gx.GraphPlan(pending).key if pending else ()
    return hashlib.sha1(repr(_stable(key)).encode()).hexdigest()


def _stable(x: object) -> object:
    """A process-independent rendering of a graph key (ops by name, tags by name)."""
    if isinstance(x, tuple):
        return tuple(_stable(e) for e in x)
    if isinstance(x, torch._ops.OpOverload):
        return str(x)
    if isinstance(x, type):
        return x.__name__
    return x



# -- torch._lazy's debugging switches: forcing the eager fallback, saving every cut graph ----

class _Restorer:
    """What `force_fallback` / `save_graphs` return: the setting is made by the call; used as a
    context manager, the previous setting comes back on exit."""

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo = undo

    def __enter__(self) -> "_Restorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self._undo()


def _overloads(name: str) -> set[str]:
    """Schema names ("aten::sub.Tensor", "aten::relu") of "aten::sub" (every overload),
    "aten::sub.Tensor" (that one) or "sub" (short for aten::sub)."""
    qual = name if "::" in name else "aten::" + name
    base, _, overload = qual.partition(".")
    ns, _, op = base.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        schemas = [getattr(packet, ov)._schema for ov in ([overload] if overload else packet.overloads())]
    except (AttributeError, RuntimeError):
        raise ValueError(f"force_fallback: no op named {name!r}") from None
    return {s.name + ("." + s.overload_name if s.overload_name else "") for s in schemas}


def _set_forced(names: frozenset) -> None:
    config.force_fallback = names
    shapes.cache.clear()  # it remembers per signature whether an op lowers: decide again


def force_fallback(ops: str | Iterable[str] = ()) -> _Restorer:
    """Make the named aten ops run through the eager fallback instead of into graphs
    (torch._lazy's `config.set_force_fallback("aten::sub")`), to test the fallback path or to
    rule an op's lowering out while debugging.  `ops`: "aten::sub" (every overload),
    "aten::sub.Tensor" (one overload), "sub", a comma-separated string or a list of these;
    empty restores normal lowering.  Replaces the current set.  Used as a context manager
    (`with ltc.debug.force_fallback("aten::sub"):`) the previous set comes back on exit.
    Unknown names raise `ValueError`.  Ops with their own handlers (device copies and
    transfers, batch norm's entry point) are not affected; `EagerFallback::<op>` counts."""
    names = [n.strip() for n in ops.split(",")] if isinstance(ops, str) else list(ops)
    forced: set[str] = set()
    for n in names:
        if n:
            forced |= _overloads(n)
    prev = config.force_fallback
    _set_forced(frozenset(forced))
    return _Restorer(lambda: _set_forced(prev))


def save_graphs(path: str | os.PathLike | None) -> _Restorer:
    """Append every graph cut from now on (by `mark_step`, a sync or a read) to the text file
    `path`, as `dump_ir` text with a header naming the device, the graph hash and the user's
    `file:line` that cut it (torch._lazy's `LTC_SAVE_TENSORS_FILE`); `None` stops.  Also
    `LTC_ASYNC_SAVE_GRAPHS=<path>`.  With `LTC_ASYNC_IR_DEBUG=1` every node also names the
    user line that traced it.  Graphs are written by the compiler thread, in cut order, before
    they compile; used as a context manager, the previous setting comes back on exit."""
    prev = config.save_graphs
    config.save_graphs = os.fspath(path) if path else ""
    return _Restorer(lambda: setattr(config, "save_graphs", prev))


_saved = [0]            # graphs written by this process
_save_failed: set = set()


@events.looked_up.subscribe
def _save_graph(ctx: Any, plan: Any, label: str, _hit: bool) -> None:
    """On the compiler thread, after each cache lookup: append the graph while `save_graphs`
    is on."""
    path = config.save_graphs
    if not path:
        return
    _saved[0] += 1
    digest = hashlib.sha1(repr(_stable(plan.key)).encode()).hexdigest()
    text = (f"[ltc_async graph {_saved[0]}] {ctx.device}, {len(plan.order)} nodes, hash {digest}\n"
            f"cut at {label}\n{_dump_roots(plan.roots, 'text')}\n")
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:  # a debugging aid must not fail the step
        if path not in _save_failed:
            _save_failed.add(path)
            warnings.warn(f"ltc_async: cannot save graphs to {path!r}: {e}")


__all__ += ["force_fallback", "save_graphs"]
