"""Ops with explicit handlers instead of the generic op path (`trace.py`).

Design note.  Each handler exists because the generic path would compute the wrong thing or
lose a write:

* `_to_copy` leaves the lazy world (`.cpu()`: wait for exactly this tensor), moves between lazy
  devices (`transfer`), or is the identity on an immutable value;
* `copy` (functionalization's `copy_`) is where uploads and cross-device copies land;
* `native_batch_norm` updates its running stats in place without saying so in its schema;
* `lift_fresh` is where `torch.tensor(data, device="ltc")` enters the functional world;
* `copy_into` is `_copy_from` below functionalization (how factories fill their results).

Identity ops (`clone`, `detach`, `alias`, ...) are flagged on their `OpInfo`: values are
immutable, so the output can name the input's value.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..base import counters
from ..executor import arena
from ..executor import graph_executor as gx
from ..ir.schema import op_info, type_name
from .dispatch import dispatch, register_handlers
from .host import eager_layout, transfer, upload
from .lazy_tensor import LtcTensor, make_tensor, wrap
from .trace import check_host_arguments, trace

aten = torch.ops.aten
_LEGIT = aten._native_batch_norm_legit_functional.default


def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    device = kwargs.get("device")
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    counters.counter("ltc::_to_copy")
    if device is not None and device.type != "ltc":
        # Leaving the lazy world: wait for exactly this tensor, copy to the target device.
        counters.counter("TensorToHost")
        counters.round_trip("read", "_to_copy")
        value = gx.read([x])[0]
        out = func(value, **kwargs)
        if kwargs.get("memory_format") in (None, torch.preserve_format):
            out = eager_layout(out, x._m)  # eager's layout for this copy
        return out
    # Functionalization hands a user's `_to_copy` result back unwrapped (it expects it to leave
    # the functional world, as `.cpu()` does), so lazy results are wrapped here -- except for
    # the cast `FunctionalTensorWrapper::replace_` makes of an in-place op's result whose dtype
    # differs from its target's (`f32.add_(f64)`): it stores the result inside the wrapper.
    keep_bare = _casts_inplace_result(kwargs)
    if keep_bare and not torch.can_cast(x.dtype, kwargs["dtype"]):
        # eager rejects such a write; the checks in `patches/inplace.py` raise before functionalization
        # gets here for the Python entry points, this is the safety net for the others (`out=`)
        # (the target has taken the uncast result by then: an error, not a wrong value)
        raise RuntimeError(f"result type {type_name(x.dtype)} can't be cast to the desired output "
                           f"type {type_name(kwargs['dtype'])}")
    if device is not None and arena.get(device) is not x._ctx:
        x = transfer(x, arena.get(device))
    kwargs = dict(kwargs)
    kwargs["device"] = x._ctx.device if device is not None else None
    if kwargs.get("dtype") in (None, x.dtype) and kwargs.get("memory_format") in (None, torch.preserve_format):
        node, idx = x._v  # values are immutable: an unchanged copy is the same value
        out = make_tensor(x._ctx, node, idx, x._m)
    else:
        info = op_info(func)
        out = trace(func, info, info.bind((x,), kwargs))
    return out if keep_bare else wrap(out)


def _casts_inplace_result(kwargs: dict) -> bool:
    """Is this `_to_copy` the cast `FunctionalTensorWrapper::replace_` makes?  It is the one
    caller passing `dtype` and `layout` alone (`TensorOptions().dtype(..).layout(..)`): user
    calls reach here through `Tensor.to`, which passes a device with the layout, or no layout."""
    return len(kwargs) == 2 and "layout" in kwargs and "dtype" in kwargs


def _copy(func: Any, args: tuple, kwargs: dict) -> Any:
    """`copy(self, src)` (what functionalization makes of `copy_`): uploads end up here."""
    self, src = args[0], args[1]
    ctx = self._ctx
    counters.counter("ltc::copy")
    if type(src) is not LtcTensor:
        src = upload(ctx, src)
    elif src._ctx is not ctx:
        src = transfer(src, ctx)
    if src._m == self._m:  # same shape, dtype and layout: the copy is the source's value
        node, idx = src._v
        return make_tensor(ctx, node, idx, self._m)
    info = op_info(func)
    return trace(func, info, info.bind((self, src), kwargs))


def _native_batch_norm(func: Any, args: tuple, kwargs: dict) -> Any:
    """`native_batch_norm` updates the running stats in place although its schema does not say
    so (functionalization cannot see it).  Trace the functional variant and point the running
    stat tensors at its new values: they are the inner tensors of the module's buffers."""
    info = op_info(func)
    full = info.bind(args, kwargs)
    check_host_arguments(info, full)
    inp, weight, bias, rmean, rvar, training, momentum, eps = full
    if not training or rmean is None or rvar is None:
        counters.counter("ltc::native_batch_norm")
        return trace(func, info, full)
    # through the op path (its plan counts it as ltc::_native_batch_norm_legit_functional)
    out, mean, invstd, new_mean, new_var = dispatch(_LEGIT, tuple(full), None)
    for dst, src in ((rmean, new_mean), (rvar, new_var)):
        dst._ctx.rebind(dst, src._v)
    return out, mean, invstd


def copy_into(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """In-place copy across the lazy/host boundary, for the paths that bypass functionalization."""
    if type(dst) is LtcTensor:
        value = src if type(src) is LtcTensor else upload(dst._ctx, src)
        if value._ctx is not dst._ctx:
            value = transfer(value, dst._ctx)
        if value._m != dst._m:  # dst keeps its shape, dtype and layout
            info = op_info(aten.copy.default)
            value = trace(aten.copy.default, info, [dst, value, False])
        dst._ctx.rebind(dst, value._v)
        return dst
    return dst.copy_(gx.read([src])[0])


def _lift_fresh(func: Any, args: tuple, kwargs: dict) -> Any:
    """`torch.tensor(data, device="ltc")` fills a bare lazy tensor below functionalization and
    ends with `lift_fresh` on it: this is where it enters the functional world."""
    x = args[0]
    counters.counter("ltc::lift_fresh")
    node, idx = x._v
    return wrap(make_tensor(x._ctx, node, idx, x._m))


def _same_value(func: Any, args: tuple, kwargs: dict) -> Any:
    """`detach_copy` / `alias_copy`: the input's value and layout (the view ops' strides).
    Functionalization replays these whenever it regenerates a view of a written base (every
    parameter is a `detach` view), so they skip the generic path."""
    x = args[0]
    counters.counter("ltc::detach_copy" if func is aten.detach_copy.default else "ltc::alias_copy")
    return make_tensor(x._ctx, x._v[0], x._v[1], x._m)


_IDENTITY = {aten.detach_copy.default, aten.alias_copy.default, aten.lift_fresh_copy.default,
             aten.clone.default, aten.detach.default, aten.alias.default, aten.lift_fresh.default}
for _op in _IDENTITY:
    op_info(_op).identity = True

SPECIAL: dict[Any, Callable[[Any, tuple, dict], Any]] = {
    aten._to_copy.default: _to_copy,
    aten.copy.default: _copy,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.lift_fresh.default: _lift_fresh,
    aten.lift_fresh_copy.default: _lift_fresh,
    aten.detach_copy.default: _same_value,
    aten.alias_copy.default: _same_value,
}
register_handlers(SPECIAL)
