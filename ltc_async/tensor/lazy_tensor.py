"""`LtcTensor`: what the dispatcher sees on an `ltc` device.

Users hold a *functional wrapper* (PyTorch's `FunctionalTensorWrapper`, what LTC itself uses)
around an `LtcTensor`.  Functionalization turns in-place ops and views into functional ops
(`add_` -> `add`, `x[0]` -> `select_copy`, `v.add_()` -> `select_scatter` on the base) before
they reach `LtcTensor.__torch_dispatch__`, so the IR stays purely functional while users keep
eager aliasing semantics.  Autograd runs on the wrapper, above all of this.

An `LtcTensor` is immutable in value: it names output `_v[1]` of IR node `_v[0]`.  Syncing only
swaps that pair for a DEVICE_DATA node holding (a placeholder for) the same value.

Threads: `_v` is rebound only by `DeviceContext.rebind` and by the cut, both under the device
lock (one tuple store: a reader on another thread sees the old pair or the new one, never a
mix); `_m`, `_ctx` and `_id` never change.
"""
from __future__ import annotations

import gc
import itertools
from typing import Any

import torch

from ..base import events
from ..base.counters import _counters
from ..ir.node import DEVICE_DATA as _DEVICE_DATA
from ..ir.node import Node, TensorMeta

_make_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided


class LtcTensor(torch.Tensor):
    """A lazy tensor: output `_v[1]` of IR node `_v[0]`, on lazy device `_ctx`.

    `_v` is one tuple so that readers on other threads see a consistent (node, index) pair
    while `mark_step` swaps it for device data; `_m` is the (fixed) shape/stride/dtype.
    """

    # slots, not a __dict__: one object less for the garbage collector per traced op
    __slots__ = ("_v", "_m", "_ctx", "_id")
    _v: tuple[Node, int]
    _m: TensorMeta
    _ctx: Any
    _id: int

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
        # replaced by the op path's entry point when `tensor/dispatch.py` loads (the class sits
        # below the path it enters); reaching this means the package was not imported
        raise RuntimeError(f"ltc_async: {func} reached an ltc tensor before the op path was "
                           f"installed; import ltc_async first")

    def __repr__(self) -> str:  # the inner tensor: users normally see the functional wrapper
        meta = self._m
        return f"LtcTensor({self._v[0].name}, shape={tuple(meta.shape)}, dtype={meta.dtype}, device={self._ctx.device})"


def make_tensor(ctx: Any, node: Node, idx: int, meta: TensorMeta) -> LtcTensor:
    # positional (size, strides, storage_offset, memory_format, dtype, layout, device): the
    # keyword form costs ~15% more in PyTorch's argument parser, on every traced op
    t = _make_wrapper(LtcTensor, meta.shape, meta.stride, None, None, meta.dtype, _STRIDED, ctx.device)
    _counters["CreateLtcTensor"] = _counters.get("CreateLtcTensor", 0) + 1
    t._v = (node, idx)
    t._m = meta
    t._ctx = ctx
    t._id = next(_serial)
    if node.op is not _DEVICE_DATA:
        ctx.register(t)
    return t


_serial = itertools.count()   # creation serials (`LtcTensor._id`, the live registry's keys)
_serial_at_reset = 0


def _destroyed() -> int:
    """`DestroyLtcTensor`: lazy tensors created since the last `ltc.metrics.reset()` and gone
    since, computed when read: created minus those still alive, found by a scan of the objects
    the garbage collector tracks (every tensor is one).  A `__del__` counting each destruction
    would cost every traced op more than the rest of its tensor's deallocation."""
    first = _serial_at_reset
    alive = sum(1 for o in gc.get_objects() if type(o) is LtcTensor and o._id >= first)
    return max(0, _counters.get("CreateLtcTensor", 0) - alive)


@events.counters_read.subscribe
def _count_destroyed(name: str | None) -> None:
    if name == "DestroyLtcTensor" or name == "*":
        _counters["DestroyLtcTensor"] = _destroyed()


@events.counters_reset.subscribe
def _on_reset() -> None:
    global _serial_at_reset
    _serial_at_reset = next(_serial)


def tensors_in(v: Any, cls: type = torch.Tensor) -> list:
    """The instances of `cls` in an op argument: `v` itself, or those in (nested) lists and
    tuples (the one walk over arguments that the seam, collectives and host paths share)."""
    if isinstance(v, cls):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for e in v for t in tensors_in(e, cls)]
    return []


def wrap(t: torch.Tensor) -> torch.Tensor:
    """The user-facing functional wrapper of an inner `LtcTensor`."""
    return torch._to_functional_tensor(t)


def inner_of(t: Any) -> LtcTensor | None:
    """The current inner `LtcTensor` of a user's `ltc` tensor (pending view updates applied),
    or None for anything else: what functionalization's kernels unwrap, for the code paths
    that stand in for them (in-place foreach ops, repeated in-place calls)."""
    if not isinstance(t, torch.Tensor) or not torch._is_functional_tensor(t):
        return None
    torch._functionalize_sync(t)
    inner = torch._from_functional_tensor(t)
    return inner if type(inner) is LtcTensor else None


def unwrap(t: torch.Tensor) -> LtcTensor:
    """The current inner `LtcTensor` of a user tensor (applying pending view updates first)."""
    if type(t) is LtcTensor:
        return t
    if not isinstance(t, torch.Tensor) or t.device.type != "ltc":
        raise TypeError(f"expected a tensor on an 'ltc' device, got {_describe(t)}")
    if torch._is_functional_tensor(t):
        torch._sync(t)
        inner = torch._from_functional_tensor(t)
        if type(inner) is LtcTensor:
            return inner
    raise TypeError(f"not an ltc_async tensor: {_describe(t)}")


def _describe(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"{type(t).__name__}(device={t.device}, shape={tuple(t.shape)})"
    return type(t).__name__

