"""`as_strided` views on the device when they are slices of a contiguous base.

`as_strided_copy` and `as_strided_scatter` (what functionalization makes of an `as_strided` view
and of a write through it) read raw memory, so the generic path runs them eagerly on values
laid out as eager would (`trace._LAYOUT_DEPENDENT`): a host round trip each.  The common case
needs no memory: a contiguous block of a contiguous base -- DDP's gradient buckets
(`bucket.as_strided(grad.shape, grad.stride(), offset)`), flat parameter buffers, views of views
that functionalization replays as `as_strided` -- is `base.view(-1)[offset:offset + n].view(size)`,
and writing it is a `slice_scatter` on the flat base.  Those are traced; anything else (other
strides, a base whose value is not contiguous, out of bounds) keeps the eager path, whose
errors are eager's.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..ir.schema import op_info
from .dispatch import dispatch, register_handlers
from .lazy_tensor import LtcTensor
from .trace import trace

aten = torch.ops.aten


def _contiguous(shape: tuple) -> tuple:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _dense(t: LtcTensor) -> bool:
    m = t._m
    return all(s == c for s, c, n in zip(m.stride, _contiguous(m.shape), m.shape) if n > 1)


def _block(x: LtcTensor, size: Any, stride: Any, offset: Any) -> tuple[int, int] | None:
    """(start, length) if `as_strided(x, size, stride, offset)` is a contiguous block of the
    contiguous `x`, else None."""
    if not all(type(v) is int for v in (*size, *stride)) or not _dense(x):
        return None
    offset = 0 if offset is None else offset
    if type(offset) is not int or offset < 0:
        return None
    size = tuple(size)
    if any(s != c for s, c, n in zip(stride, _contiguous(size), size) if n > 1):
        return None
    n = math.prod(size)
    return (offset, n) if offset + n <= math.prod(x._m.shape) else None


def _op(func: Any, *args: Any) -> Any:
    return dispatch(func, args, None)


def _flat(t: LtcTensor) -> Any:
    if not _dense(t):
        t = _op(aten.clone.default, t)   # a contiguous value (clone keeps dense layouts dense)
        if not _dense(t):
            t = dispatch(aten.clone.default, (t,), {"memory_format": torch.contiguous_format})
    return _op(aten.view_copy.default, t, [-1])


def as_strided_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    info = op_info(func)
    full = info.bind(args, kwargs)
    x, size, stride, offset = full[:4]
    block = _block(x, size, stride, offset) if type(x) is LtcTensor else None
    if block is None:
        try:
            return trace(func, info, full)   # eager, on eager's layout
        except RuntimeError as e:
            if "out of bounds for storage" not in str(e):
                raise
            # functionalization gives `as_strided` of a view the view's own elements, not its
            # base's storage: eager may read further there (a documented limit, said clearly)
            raise RuntimeError(
                f"ltc_async: as_strided{tuple(size), tuple(stride), offset} reads outside the "
                f"{tuple(x._m.shape)} tensor it is called on ({e}); eager reads the storage of a "
                f"view's base there, but an ltc view keeps only its own elements: call as_strided "
                f"on the base tensor") from None
    start, n = block
    part = _op(aten.slice_copy.Tensor, _flat(x), 0, start, start + n)
    return _op(aten.view_copy.default, part, list(size))


def as_strided_scatter(func: Any, args: tuple, kwargs: dict) -> Any:
    info = op_info(func)
    full = info.bind(args, kwargs)
    x, src, size, stride, offset = full[:5]
    block = _block(x, size, stride, offset) if type(x) is LtcTensor and type(src) is LtcTensor else None
    if block is None or tuple(src._m.shape) != tuple(size) or src._m.dtype != x._m.dtype:
        return trace(func, info, full)
    start, n = block
    out = _op(aten.slice_scatter.default, _flat(x), _flat(src), 0, start, start + n)
    return _op(aten.view_copy.default, out, list(x._m.shape))


DECOMPOSITIONS = {aten.as_strided_copy.default: as_strided_copy,
                  aten.as_strided_scatter.default: as_strided_scatter}
register_handlers(DECOMPOSITIONS)
