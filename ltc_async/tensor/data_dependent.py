"""Ops whose output *size* depends on values, computed on the device with one small size read.

Design note.  Eager runs `nonzero`, `masked_select`, boolean indexing, `unique` (and
`unique_consecutive`), `bincount` and `repeat_interleave(repeats)` as one kernel that sizes its
output from the data.  Shape inference cannot (there is no value at trace time), so these ops
took the eager fallback: the step's graph cut, every input read to the host, the result
uploaded.  Here each becomes

1. a count computed on the device (`count_nonzero`, a sum, a max) and read to the host: one
   0-dim read, of the count's own small graph only (`graph_executor.materialize`), so the rest of
   the step stays pending and is still cut as one graph at `mark_step` (the count's inputs are
   computed twice, in its graph and in the step's; random values are fixed at trace time, so
   both see the same);
2. the op itself, traced with the count as a static size: `nonzero_static(x, size=n)`, an
   `index_select` of the sorted values, a `searchsorted` of `n` slots in the repeats' cumsum, a
   `scatter_add` into `n` bins -- ordinary nodes, lowered and cached like any other.

Boolean indexing and `index_put` with a mask are rewritten into long indices from `nonzero`
(one read); a masked write of one value needs no read at all (`torch.where`).  `torch.where(c)`,
`argwhere` and `masked_select` reach `nonzero` through PyTorch's own decompositions or below.

Each read counts `SizeRead` and `SizeRead::<op>` and is published as `events.host_read` (the
sync guard names it; `ltc.metrics.report()` lists it).  A value is read once: what was read is
kept by IR node, and by how it is computed from which device data, across steps (`_recall`:
a mask a library rebuilds every step from the same data is read once; `SizeReadReused` counts
the reads saved).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from ..base import counters, events
from ..executor import graph_executor as gx
from ..ir.node import post_order
from ..ir.schema import op_info
from . import host_compute, host_values
from .dispatch import dispatch, register_handlers
from .lazy_tensor import LtcTensor, make_tensor
from .trace import check_host_arguments, planned

aten = torch.ops.aten

__all__ = ["read_int"]


def _read(tensors: list[LtcTensor], func: Any) -> list[torch.Tensor]:
    """The values of lazy tensors that size an output of `func`: one read of their own graph,
    counted and published (see the module note)."""
    name = op_info(func).name
    counters.counter("SizeRead")
    counters.counter("SizeRead::" + name)
    counters.round_trip("size", name)
    events.host_read(func, f"the output size of aten::{name.split('.')[0]} (a data-dependent shape)")
    return gx.read_size(tensors)


def read_int(t: LtcTensor, func: Any) -> int:
    """The value of the 0-dim lazy tensor `t`, an output size of `func`: one small read."""
    return int(_read([t], func)[0].item())


# Values already read are kept by the lazy value they were read from (`host_values.py`): a mask
# used twice (`logits[mask]`, `labels[mask]`, the backward) has its count read once, CTC lengths
# are read once for the loss and its backward.  And by how the value is computed (`_provenance`),
# across steps: a mask that a library rebuilds every step from the same device data (PyG's
# self-loop mask of a fixed `edge_index`, a padding mask of fixed labels) is read in the first
# step only.  Entries hold their leaves' data weakly: a leaf that is gone (a parameter updated, a
# new batch) can never match again.
_by_provenance: dict[tuple, tuple[Any, tuple]] = {}   # key -> (value, weakrefs of leaf data)
_PROVENANCE_MAX_NODES = 2048      # larger graphs are not keyed (the walk would cost a trace)
_PROVENANCE_MAX_ENTRIES = 1024
_provenance_lock = threading.Lock()    # guards `_by_provenance`


def _provenance(t: LtcTensor) -> tuple[tuple, list] | None:
    """`t`'s value named by its computation: every op of its graph (node key, scalars -- random
    seeds included --, output metas, operand positions) down to device-data leaves, which are
    named by the identity of their data.  Equal keys whose leaves are the same live data
    objects compute equal values.  None for a graph too large to walk per read."""
    node, out = t._v
    order = post_order([node])
    if len(order) > _PROVENANCE_MAX_NODES:
        return None
    index = {id(n): i for i, n in enumerate(order)}
    parts, leaves = [], []
    for n in order:
        if n.is_data:
            parts.append((id(n.data), n.outputs))
            leaves.append(n.data)
        else:
            parts.append((n.key, n.scalars, n.outputs, tuple([(index[id(o)], i) for o, i in n.operands])))
    try:
        hash(key := (tuple(parts), out))
    except TypeError:   # an unhashable scalar: not keyed
        return None
    return key, leaves


def _recall(t: LtcTensor, what: str) -> tuple[Any, Any]:
    """(the value read before, or None; a token for `_remember`)."""
    known = host_values.get(t._v, what)
    if known is not None:
        return known, None
    prov = _provenance(t)
    if prov is None:
        return None, None
    key = (prov[0], what)
    with _provenance_lock:
        hit = _by_provenance.get(key)
    if hit is not None and all(r() is not None for r in hit[1]):
        counters.counter("SizeReadReused")
        _remember(t, what, hit[0], None)
        return hit[0], None
    return None, (key, prov[1])


def _remember(t: LtcTensor, what: str, value: Any, token: Any) -> None:
    host_values.put(t._v, what, value)
    if token is not None:
        with _provenance_lock:
            if len(_by_provenance) >= _PROVENANCE_MAX_ENTRIES:
                _by_provenance.clear()
            _by_provenance[token[0]] = (value, tuple(weakref.ref(d) for d in token[1]))


def _op(func: Any, *args: Any, **kwargs: Any) -> Any:
    return dispatch(func, args, kwargs or None)


def _bound(handler: Any) -> Any:
    """A handler taking `(func, *bound arguments)`, which eager CUDA's device rules checked as on
    the generic path, as the `(func, args, kwargs)` handler `dispatch` calls."""
    def route(func: Any, args: tuple, kwargs: dict) -> Any:
        info = op_info(func)
        full = info.bind(args, kwargs)
        check_host_arguments(info, full)
        return handler(func, *full)
    route.__name__ = handler.__name__
    return route


def _nonzero(func: Any, x: LtcTensor) -> Any:
    n, token = _recall(x, "count_nonzero")
    if n is None:
        count = _op(aten.count_nonzero.default, x)
        n = host_compute.count(count)
        if n is not None:   # an exact function of small values read before: no round trip
            counters.counter("SizeReadOnHost")
        else:   # read, with the small values the mask is computed from (`host_compute.py`)
            below = host_compute.frontier(x)
            extra = [make_tensor(x._ctx, node, i, node.outputs[i]) for node, i in below]
            values = _read([count, *extra], func)
            host_compute.remember(below, values[1:])
            n = int(values[0].item())
        _remember(x, "count_nonzero", n, token)
    return _op(aten.nonzero_static.default, x, size=n, fill_value=-1)


def _is_mask(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _check_masks(x: Any, indices: list) -> None:
    """Eager's check of each mask against the dims it indexes (`expandTensors`): a mask of
    another shape would silently select (or write) the wrong elements."""
    dim = 0
    for t in indices:
        if _is_mask(t):
            for j in range(t.dim()):
                if dim + j >= x.dim() or t.shape[j] != x.shape[dim + j]:
                    raise IndexError(f"The shape of the mask {list(t.shape)} at index {j} does not match "
                                     f"the shape of the indexed tensor {list(x.shape)} at index {dim + j}")
            dim += t.dim()
        else:
            dim += 1


def _long_indices(indices: list, func: Any) -> list:
    """Boolean / byte masks among `Tensor?[]` indices as long index tensors, one per masked
    dimension (eager's `expandTensors`): the columns of `nonzero(mask)`.  Checked first by
    `_check_masks`."""
    out: list = []
    for t in indices:
        if _is_mask(t) and type(t) is not LtcTensor:   # a host mask: its indices, on the host
            out.extend(torch.nonzero(t).unbind(1))
        elif _is_mask(t):
            mask = t if t.dtype == torch.bool else _op(aten._to_copy.default, t, dtype=torch.bool)
            nz = _nonzero(aten.nonzero.default, mask)
            out.extend(_op(aten.select_copy.int, nz, 1, j) for j in range(mask.dim()))
        else:
            out.append(t)
    return out


def _index(func: Any, x: Any, indices: Any) -> Any:
    if not any(_is_mask(t) for t in indices):
        return _traced(func, x, indices)
    _check_masks(x, list(indices))
    return _traced(func, x, _long_indices(list(indices), func))


def _masked_select(func: Any, x: Any, mask: Any) -> Any:
    if mask.dtype != torch.bool:
        return _traced(func, x, mask)   # eager's error
    shape = list(torch.broadcast_shapes(x.shape, mask.shape))
    xb = x if list(x.shape) == shape else _op(aten.expand_copy.default, x, shape)
    mb = mask if list(mask.shape) == shape else _op(aten.expand_copy.default, mask, shape)
    return _traced(aten.index.Tensor, xb, _long_indices([mb], func))   # the mask fits: broadcast


def _traced(func: Any, *args: Any) -> Any:
    """`func` traced (the call as given, or rewritten to static sizes), through its plan."""
    info = op_info(func)
    return planned(func, info, list(args) + [None] * (len(info.arg_names) - len(args)))


def _index_put(func: Any, x: Any, indices: Any, values: Any, accumulate: Any) -> Any:
    masks = [t for t in indices if _is_mask(t)]
    if not masks:
        return _traced(func, x, indices, values, accumulate)
    _check_masks(x, list(indices))
    if (len(indices) == 1 and not accumulate and values.numel() == 1
            and tuple(indices[0].shape) == tuple(x.shape)[: indices[0].dim()]):
        # `x[mask] = v`: a select, no read
        mask = indices[0] if indices[0].dtype == torch.bool else \
            _op(aten._to_copy.default, indices[0], dtype=torch.bool)
        shape = list(mask.shape) + [1] * (x.dim() - mask.dim())
        m = _op(aten.view_copy.default, mask, shape)
        v = _op(aten._to_copy.default, _op(aten.view_copy.default, values, []), dtype=x.dtype)
        return _op(aten.where.self, m, v, x)
    return _traced(func, x, _long_indices(list(indices), func), values, accumulate)


_BINCOUNT_DTYPES: dict[tuple, torch.dtype] = {}


def _bincount(func: Any, x: Any, weights: Any, minlength: Any) -> Any:
    if x.dim() != 1 or x.dtype.is_floating_point or x.dtype == torch.bool:
        return _traced(func, x, weights, minlength)   # eager's errors, through the fallback
    n = minlength
    if x.numel():
        n = max(n, read_int(_op(aten.max.default, x), func) + 1)
    key = (x.dtype, None if weights is None else weights.dtype)
    dtype = _BINCOUNT_DTYPES.get(key)
    if dtype is None:   # eager's result type, asked of eager once per dtype pair
        w = None if weights is None else torch.zeros(1, dtype=weights.dtype)
        dtype = _BINCOUNT_DTYPES[key] = torch.bincount(torch.zeros(1, dtype=x.dtype), w).dtype
    src = (_op(aten.ones_like.default, x, dtype=dtype) if weights is None
           else _op(aten._to_copy.default, weights, dtype=dtype))
    zeros = _op(aten.zeros.default, [n], dtype=dtype, device=x.device)
    return _op(aten.scatter_add.default, zeros, 0, _op(aten._to_copy.default, x, dtype=torch.long), src)


def _unique2(func: Any, x: Any, is_sorted: Any, return_inverse: Any,
             return_counts: Any) -> Any:
    if not is_sorted or x.dtype.is_complex:
        # unsorted order is the CPU kernel's hash order: eager's answer.  (NaNs sort last and
        # compare unequal, so each stays its own value, as in eager's sorted unique.)
        return _traced(func, x, is_sorted, return_inverse, return_counts)
    values, perm = _op(aten.sort.default, _flat(x))
    return _runs(func, x, values, perm, return_inverse, return_counts)


def _unique_consecutive(func: Any, x: Any, return_inverse: Any, return_counts: Any, dim: Any) -> Any:
    if dim is not None or x.dtype.is_complex:
        return _traced(func, x, return_inverse, return_counts, dim)   # eager, per slice
    return _runs(func, x, _flat(x), None, return_inverse, return_counts)


_UNIQUE_DIM_MAX_WIDTH = 64   # elements per slice: one stable sort each (wider: eager fallback)


def _unique_dim(func: Any, x: Any, dim: int, is_sorted: Any, return_inverse: Any,
                return_counts: Any) -> Any:
    """`torch.unique(x, dim=d)` (deduplicating edges: `unique(edge_index, dim=1)`): the slices
    along `d` as rows, sorted lexicographically by one stable sort per element position, last
    to first (eager's order: it always sorts), then `unique`'s runs over whole rows."""
    if not -x.dim() <= dim < x.dim() or x.dtype.is_complex:
        return _traced(func, x, dim, is_sorted, return_inverse, return_counts)   # eager's errors
    d = dim % x.dim()
    n = x.shape[d]
    width = x.numel() // n if n else 0
    if n == 0 or width == 0 or width > _UNIQUE_DIM_MAX_WIDTH:
        return _traced(func, x, dim, is_sorted, return_inverse, return_counts)
    moved = _op(aten.movedim.int, x, d, 0)
    rows = _op(aten.view_copy.default, _op(aten.clone.default, moved, memory_format=torch.contiguous_format),
               [n, width])
    perm = _op(aten.arange.default, n, dtype=torch.long, device=x.device)
    for c in range(width - 1, -1, -1):
        column = _op(aten.index_select.default, _op(aten.select_copy.int, rows, 1, c), 0, perm)
        order = _op(aten.sort.stable, column, stable=True, dim=0)[1]
        perm = _op(aten.index_select.default, perm, 0, order)
    ordered = _op(aten.index_select.default, rows, 0, perm)
    head = _op(aten.ones.default, [1], dtype=torch.bool, device=x.device)
    if n > 1:
        step = _op(aten.any.dim, _op(aten.ne.Tensor, _op(aten.slice_copy.Tensor, ordered, 0, 1, n),
                                     _op(aten.slice_copy.Tensor, ordered, 0, 0, n - 1)), 1)
        first = _op(aten.cat.default, [head, step])
    else:
        first = head
    where = _op(aten.view_copy.default, _nonzero(func, first), [-1])
    m = where.shape[0]
    picked = _op(aten.index_select.default, ordered, 0, where)
    out = _op(aten.movedim.int, _op(aten.view_copy.default, picked, [m, *moved.shape[1:]]), 0, d)
    out = _op(aten.clone.default, out, memory_format=torch.contiguous_format)
    group = _op(aten.sub.Tensor, _op(aten.cumsum.default, first, 0), 1)
    inverse = _op(aten.scatter.src, _op(aten.zeros_like.default, group), 0, perm, group) \
        if return_inverse else _op(aten.zeros.default, [0], dtype=torch.long, device=x.device)
    if return_counts:
        zeros = _op(aten.zeros.default, [m], dtype=torch.long, device=x.device)
        counts = _op(aten.scatter_add.default, zeros, 0, group, _op(aten.ones_like.default, group))
    else:
        counts = _op(aten.zeros.default, [0], dtype=torch.long, device=x.device)
    return out, inverse, counts


def _flat(x: Any) -> Any:
    return _op(aten.view_copy.default, _op(aten.clone.default, x, memory_format=torch.contiguous_format), [-1])


def _runs(func: Any, x: Any, values: Any, perm: Any, return_inverse: Any, return_counts: Any) -> Any:
    """`unique`'s outputs from `values`, the flat elements in an order where equal ones are
    adjacent (sorted: `perm` maps them back to `x`; None: `x`'s own order, `unique_consecutive`):
    the first element of each run of equal values, one size read for their number."""
    m = values.shape[0]
    if m == 0:
        first = _op(aten.ones_like.default, values, dtype=torch.bool)
    else:
        head = _op(aten.ones.default, [1], dtype=torch.bool, device=x.device)
        step = _op(aten.ne.Tensor, _op(aten.slice_copy.Tensor, values, 0, 1, m),
                   _op(aten.slice_copy.Tensor, values, 0, 0, m - 1))
        first = _op(aten.cat.default, [head, step])
    where = _op(aten.view_copy.default, _nonzero(func, first), [-1])
    n = where.shape[0]
    out = _op(aten.index_select.default, values, 0, where)
    group = _op(aten.sub.Tensor, _op(aten.cumsum.default, first, 0), 1)   # long, per slot of `values`
    empty = _op(aten.zeros.default, [0], dtype=torch.long, device=x.device)
    inverse = empty
    if return_inverse:
        inv = group if perm is None else \
            _op(aten.scatter.src, _op(aten.zeros_like.default, group), 0, perm, group)
        inverse = _op(aten.view_copy.default, inv, list(x.shape))
    counts = empty
    if return_counts:
        zeros = _op(aten.zeros.default, [n], dtype=torch.long, device=x.device)
        counts = _op(aten.scatter_add.default, zeros, 0, group, _op(aten.ones_like.default, group))
    return out, inverse, counts


def _int_lists(ts: list, func: Any) -> list[list[int]]:
    """The values of 1-D length tensors as Python ints: a host tensor's directly, the lazy ones'
    in one read (remembered by value: the backward reads the forward's lengths again)."""
    recalled = [([int(v) for v in t.tolist()], None) if type(t) is not LtcTensor else _recall(t, "ints")
                for t in ts]
    out = [v for v, _ in recalled]
    todo = [i for i, v in enumerate(out) if v is None]
    for i, v in zip(todo, _read([ts[i] for i in todo], func) if todo else ()):
        out[i] = [int(e) for e in v.tolist()]
        _remember(ts[i], "ints", out[i], recalled[i][1])
    return out


def _ctc_loss(func: Any, lp: Any, tg: Any, il: Any, tl: Any, blank: Any,
              zero_infinity: Any) -> Any:
    """`nn.CTCLoss` with length tensors: the lengths become int lists (eager reads them to the
    host too, also on CUDA), the loss and its gradient run on the device."""
    return _traced(aten._ctc_loss.default, lp, tg, *_int_lists([il, tl], func), blank,
                   zero_infinity)


def _ctc_loss_backward(func: Any, grad: Any, lp: Any, tg: Any, il: Any, tl: Any, nll: Any,
                       alpha: Any, blank: Any, zero_infinity: Any) -> Any:
    return _traced(aten._ctc_loss_backward.default, grad, lp, tg, *_int_lists([il, tl], func),
                   nll, alpha, blank, zero_infinity)


def _repeat_interleave(func: Any, repeats: Any, output_size: Any) -> Any:
    """`repeat_interleave(repeats)`: output slot j holds the i with cumsum[i-1] <= j < cumsum[i],
    `searchsorted(cumsum(repeats), arange(n), right=True)`, n read with the smallest repeat
    (eager's "repeats can not be negative") or the caller's `output_size`.  Not traced as
    `repeat_interleave(repeats, output_size=n)`: shape inference runs integer ops once on
    zero stand-ins on the backing device (`shapes._run_like_eager`), where that call breaks the
    kernel's contract (output_size == sum(repeats), Repeat.cu `compute_cuda_kernel`'s
    CUDA_KERNEL_ASSERT): a RuntimeError on the CPU, dropped there, but a device-side assert on
    CUDA, which leaves the CUDA context unusable."""
    if repeats.dim() != 1 or repeats.dtype not in (torch.int32, torch.int64):
        return _traced(func, repeats, output_size)   # eager's errors
    if output_size is not None and repeats._ctx.backend_device.type == "cpu":
        # the caller's size, checked by the kernel when the graph runs as in eager (a wrong one
        # fails at the next barrier); the stand-ins' error is a RuntimeError on the CPU, dropped
        return _traced(func, repeats, output_size)
    if repeats.numel() == 0:   # eager: an empty result, whatever output_size says
        return _op(aten.zeros.default, [0], dtype=repeats.dtype, device=repeats.device)
    if output_size is None:
        total, low = _read([_op(aten.sum.default, repeats), _op(aten.min.default, repeats)], func)
        if int(low.item()) < 0:
            raise RuntimeError("repeats can not be negative")
        output_size = int(total.item())
    bounds = _op(aten.cumsum.default, repeats, 0)   # int64
    slots = _op(aten.arange.default, output_size, dtype=torch.long, device=repeats.device)
    return _op(aten.searchsorted.Tensor, bounds, slots, out_int32=repeats.dtype == torch.int32,
               right=True)


register_handlers({
    aten.nonzero.default: _bound(_nonzero),
    aten.index.Tensor: _bound(_index),
    aten.index_put.default: _bound(_index_put),
    aten.masked_select.default: _bound(_masked_select),
    aten.bincount.default: _bound(_bincount),
    aten._unique2.default: _bound(_unique2),
    aten.unique_consecutive.default: _bound(_unique_consecutive),
    aten.unique_dim.default: _bound(_unique_dim),
    aten.repeat_interleave.Tensor: _bound(_repeat_interleave),
    aten._ctc_loss.Tensor: _bound(_ctc_loss),
    aten._ctc_loss_backward.Tensor: _bound(_ctc_loss_backward),
})
