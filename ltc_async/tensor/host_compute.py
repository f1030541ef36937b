"""Small values computed on the host from values already known there, instead of read.

Design note.  Two kinds of host reads are often exact functions of a few small values the host
already has, and then need no device round trip:

* **mask counts.**  A mixture of experts takes `torch.where(chosen == e)` for each expert `e`, a
  per-class loss `x[labels == c]` for each class: every mask needs its count before its
  indices have a shape, one size read each (`data_dependent.py`) -- though every one of those
  masks is an exact integer function of the same small tensor (`chosen`, `labels`).  When a
  mask's count is read, the values its mask is computed from -- its *frontier*: walking down
  from the mask through exact integer ops (comparisons, logical and bitwise ops, integer
  arithmetic, casts and views) to the first value that is not computed by one -- are read in
  the same graph, when they are small integer tensors, and kept by IR value; a later mask
  whose frontier is known is counted on the host (`count`, `SizeReadOnHost`).
* **scalar reads** (`.item()`, `bool(t)`, `if t1 >= t[j]`) of values computed from constants:
  an ODE solver compares its time grid with the user's `t` at every step (torchdiffeq: 27 reads
  a step), a loop tests a step counter.  When the read value's graph reaches only values the
  host has -- small device data of a CPU-backed device that was uploaded or made by an
  execution a barrier (a read, `wait_device_ops`) has covered, values read before -- through
  ops whose results are the same bits on every device, it is computed on the host (`scalar`,
  `ReadOnHost`): no cut, no wait for the device, the step stays one pending graph.  The read is
  still a data-dependent read of the program: `DataDependentSync` counts it and the sync guard
  sees it, as before.  It is not a barrier: a failure of work queued before it is raised by
  the next read that syncs, or `wait_device_ops`.

Exact by construction: the replayed ops (`Interpreter.run_node`, eager on the CPU) are integer
and boolean ops, and for float32/float64 only correctly rounded IEEE operations (arithmetic,
comparisons, rounding, selection, casts, views, copies, `arange`/`full`): no reduction over
floats, no transcendental function, no random op.  Values are kept by IR value in
`host_values.py` (as "host": the whole tensor on the CPU), weakly: they go with the step's graph
(the next step's masks are new values; a mask rebuilt each step from the same data is recalled
by `data_dependent._recall` instead), at most `_MAX_ELEMENTS` elements each.
"""
from __future__ import annotations

from typing import Any

import torch

from ..ir.interpreter import Interpreter
from ..ir.node import RNG, Node, Tag
from . import host_values

_EXACT_OPS = frozenset({
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "add", "sub", "mul", "remainder",
    "where", "isin", "_to_copy", "clone", "view_copy", "expand_copy", "select_copy", "slice_copy",
    "unsqueeze_copy", "squeeze_copy", "permute_copy", "t_copy", "transpose_copy", "count_nonzero",
})
_INTEGER = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
_MAX_ELEMENTS = 1 << 16
_MAX_NODES = 64          # a mask computed by more ops than this is read as before
_CPU = torch.device("cpu")


def _numel(m: Any) -> int:
    n = 1
    for s in m.shape:
        n *= s
    return n


def _draws_random(node: Node) -> bool:
    return any(type(e) is tuple and e and type(e[0]) is Tag and e[0] is RNG for e in node.template)


def _exact(node: Node) -> bool:
    """Does `node` compute integers from integers with an op whose result is device-independent?"""
    op = node.op
    if getattr(op, "namespace", None) != "aten" or op._opname not in _EXACT_OPS:
        return False
    if any(m.dtype not in _INTEGER for m in node.outputs):
        return False
    if any(o.outputs[i].dtype not in _INTEGER for o, i in node.operands):
        return False
    if any(type(v) not in (int, bool) for v in node.scalars):
        return False
    return not _draws_random(node)


def _known(value: tuple[Node, int]) -> torch.Tensor | None:
    return host_values.get(value, "host")


# ops whose float32/float64 results are correctly rounded (the same bits on every device)
_FLOAT_OPS = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "ceil", "floor", "round", "trunc", "maximum",
    "minimum", "eq", "ne", "lt", "le", "gt", "ge", "where", "logical_and", "logical_or",
    "logical_not", "logical_xor", "all", "any", "_to_copy", "clone", "copy", "lift_fresh_copy",
    "alias_copy", "view_copy", "expand_copy", "select_copy", "slice_copy", "unsqueeze_copy",
    "squeeze_copy", "permute_copy", "t_copy", "transpose_copy", "unbind_copy", "split_copy",
    "select_scatter", "slice_scatter",
    "_is_all_true", "_is_any_true", "isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit",
    "sign", "nan_to_num", "arange", "full", "scalar_tensor", "zeros", "ones", "zeros_like",
    "ones_like", "full_like",
})
_FLOATS = frozenset({torch.float32, torch.float64})
_SMALL = 4096        # elements of any value a scalar read is computed from on the host


def _small(m: Any) -> bool:
    return _numel(m) <= _SMALL


def _replayable(node: Node) -> bool:
    """Can `node` be computed on the host with the same bits (see the module note)?"""
    if _exact(node):
        return all(_small(m) for m in node.outputs)
    op = node.op
    if getattr(op, "namespace", None) != "aten" or op._opname not in _FLOAT_OPS:
        return False
    dtypes = [m.dtype for m in node.outputs] + [o.outputs[i].dtype for o, i in node.operands]
    if any(d not in _INTEGER and d not in _FLOATS for d in dtypes):
        return False
    if any(type(v) not in (int, bool, float) for v in node.scalars) or _draws_random(node):
        return False
    return all(_small(m) for m in node.outputs)


def _on_host(node: Node, idx: int) -> torch.Tensor | None:
    """A small device-data value the host has on a CPU-backed device, whose backend values are
    CPU tensors: uploaded from the host (or an eager fallback's result), or the output of a
    finished execution that a barrier has covered (its errors were raised there: a read of the
    value now would raise nothing, and which reads are computed here follows program order)."""
    data = node.data
    ctx = data.device
    if data.seq > ctx.covered_upto or data.future is not None or not _small(node.outputs[idx]):
        return None
    if ctx.backend_device.type != "cpu":
        return None
    value = ctx.backend.to_torch(data.resolve())
    return value if isinstance(value, torch.Tensor) and value.device.type == "cpu" else None


def _evaluate(root: tuple[Node, int], replayable: Any, leaf: Any) -> torch.Tensor | None:
    """The value of `root` computed on the host: known values (`host_values`), device data
    `leaf(node, idx)` gives, and at most `_MAX_NODES` nodes `replayable` accepts, replayed by
    eager on the CPU; None if anything on the way is neither."""
    memo: dict[tuple[int, int], Any] = {}
    budget = [_MAX_NODES]

    def value(v: tuple[Node, int]) -> torch.Tensor | None:
        node, idx = v
        k = (id(node), idx)
        if k in memo:
            return memo[k]
        got = _known(v)
        if got is None:
            if node.is_data:
                got = leaf(node, idx)
            elif budget[0] > 0 and replayable(node):
                budget[0] -= 1
                args = []
                for o in node.operands:
                    a = value(o)
                    if a is None:
                        break
                    args.append(a)
                else:
                    outs = Interpreter.run_node(node, args, _CPU)
                    for j, o in enumerate(outs):
                        memo[(id(node), j)] = o
                    got = outs[idx]
        memo[k] = got
        return got
    return value(root)


def scalar(t: Any) -> Any:
    """The value of the lazy tensor `t` (one element) as a host tensor, computed on the host if
    its graph reaches only values the host has through replayable ops; None otherwise."""
    m = t._m
    if any(s != 1 for s in m.shape) or (m.dtype not in _INTEGER and m.dtype not in _FLOATS):
        return None
    return _evaluate(t._v, _replayable, _on_host)


def count(c: Any) -> int | None:
    """The value of the 0-dim lazy count `c`, computed on the host if its graph is exact integer
    ops over known values; None otherwise."""
    out = _evaluate(c._v, _exact, lambda node, idx: None)
    return None if out is None else int(out)


def frontier(mask: Any) -> list[tuple[Node, int]]:
    """The small integer values `mask` is computed from through exact ops (see the module
    note), not yet known; empty when the mask is not such a function of small values."""
    node, _ = mask._v
    if node.is_data or not _exact(node):
        return []
    found: list[tuple[Node, int]] = []
    seen: set[tuple[int, int]] = set()
    stack = list(node.operands)
    walked = 0
    while stack:
        v = stack.pop()
        o, i = v
        if (id(o), i) in seen or _known(v) is not None:
            continue
        seen.add((id(o), i))
        walked += 1
        if walked > _MAX_NODES:
            return []
        if not o.is_data and _exact(o):
            stack.extend(o.operands)
            continue
        meta = o.outputs[i]
        if meta.dtype not in _INTEGER or _numel(meta) > _MAX_ELEMENTS:
            return []
        found.append(v)
    return found


def remember(values: list[tuple[Node, int]], hosts: list[torch.Tensor]) -> None:
    for v, h in zip(values, hosts):
        host_values.put(v, "host", h.cpu())   # a CUDA-backed device reads CUDA tensors
