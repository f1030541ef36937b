"""The entry point of every aten call that reaches an `LtcTensor`: route it to its op path.

Design note.  LTC generates a C++ IR class and kernel per op with torchgen; ltc_async reads each
op's schema once (`ir/schema.py`) and routes every call by what the schema says:

* a few ops have explicit handlers (`special.py`: device transfers, uploads through `copy`,
  identity ops, batch norm's hidden running-stat update), a few are traced as the ops they
  decompose into (`decompositions.py`: `_foreach_*` with scalar lists, the fused RNN cells;
  `strided.py`: `as_strided` views that are slices of a contiguous base);
* ops that write their arguments with no functional form run on host copies (`host.py`);
* ops returning non-tensors (`.item()`, `bool(t)`) sync their inputs (`host.py`);
* everything else is traced into an IR node (`trace.py`), random ops through their
  `Generator?` overload so they draw from the per-device seed.

The module layout follows the pipeline: `dispatch` -> `trace` (+ `shapes`) / `host` /
`special`; nothing here reaches past the executor.  Errors raise on the spot, also inside a
backward pass (`registration._LtcDeviceGuard` keeps the engine from aborting on them).

The per-op path (every traced op pays it; see "Per-op path profile" in benchmarks/README.md):
the route of an overload -- for traced ops its plan (`trace.make_plan`), which also counts the
call and binds the arguments -- is decided on its first call and kept by `id(op)`;
`torch_dispatch` is `LtcTensor.__torch_dispatch__` itself (no extra frame).  Thread
safety: `_routes`, the plans, the shape cache and the other per-signature caches of this
package are plain dicts read and filled by every tracing thread without a lock.  Each holds
values computed only from its key (immutable once stored), single dict operations are atomic
under the GIL, and a racing miss computes an equal value twice and keeps one.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from ..base import counters
from ..ir.schema import OpInfo, op_info
from . import collectives, lazy_tensor
from .host import host_op, mutating_host_op
from .trace import make_plan, trace

# Ops with a path of their own (`special.py`, `decompositions.py`, `strided.py`): each of those
# modules registers its table here when it loads (`tensor/__init__.py` loads them, before any op
# is dispatched), and calls `dispatch` for the ops it decomposes into.  By op overload, and by
# qualified name for ops that may not exist yet when the table loads (Inductor's prims).
_handlers: dict[Any, Callable[[Any, tuple, dict], Any]] = {}
_handlers_by_name: dict[str, Callable[[Any, tuple, dict], Any]] = {}


def register_handlers(table: dict, by_name: dict | None = None) -> None:
    """Route the ops of `table` (and of `by_name`, by qualified name) to their handlers
    `handler(func, args, kwargs)`.  An op has one handler: a second claim is a bug."""
    for mine, theirs in ((_handlers, table), (_handlers_by_name, by_name or {})):
        for op, handler in theirs.items():
            if mine.setdefault(op, handler) is not handler:
                raise RuntimeError(f"ltc_async: two handlers for {op}")

# How each op overload is handled, decided on its first call and kept by id (OpOverload.__hash__
# is slow Python code): a function of (args, kwargs) -- the traced path unrolled for this op
# (`trace.make_plan`), a special handler or decomposition, or a host path.
_routes: dict[int, Callable[[tuple, dict | None], Any]] = {}


def _route(func: torch._ops.OpOverload) -> Callable[[tuple, dict | None], Any]:
    info = op_info(func)
    handler = _handlers.get(func) or _handlers_by_name.get(info.qualname)
    if handler is not None:
        def route(args: tuple, kwargs: dict | None) -> Any:
            return handler(func, args, kwargs or {})
    elif info.is_inplace_or_out:
        collective = info.qualname.startswith("c10d::")

        def route(args: tuple, kwargs: dict | None) -> Any:
            counters.counter(info.counter)
            if collective:   # torch.distributed: queued on the device
                out = collectives.queue(func, info, args, kwargs or {})
                if out is not NotImplemented:
                    return out
            return mutating_host_op(func, info, args, kwargs or {})
    elif not info.returns_only_tensors:
        def route(args: tuple, kwargs: dict | None) -> Any:
            counters.counter(info.counter)
            return host_op(func, info, args, kwargs or {})
    elif info.seeded and not info.has_generator:
        def route(args: tuple, kwargs: dict | None) -> Any:
            counters.counter(info.counter)
            return _seeded(func, info, info.bind(args, kwargs))
    else:
        route = make_plan(func, info)   # the traced path, unrolled for this op
    _routes[id(func)] = route   # a racing thread stores an equivalent route
    return route


def torch_dispatch(cls: Any, func: torch._ops.OpOverload, types: Any, args: tuple = (),
                   kwargs: dict | None = None) -> Any:
    """`LtcTensor.__torch_dispatch__`: every aten call on lazy tensors."""
    route = _routes.get(id(func))
    if route is None:
        route = _route(func)
    return route(args, kwargs)


def dispatch(func: torch._ops.OpOverload, args: tuple, kwargs: dict | None) -> Any:
    """The op path for `func(*args, **kwargs)` on inner lazy tensors (also called directly by
    handlers and the PrivateUse1 fallback, skipping the dispatcher)."""
    route = _routes.get(id(func))
    if route is None:
        route = _route(func)
    return route(args if type(args) is tuple else tuple(args), kwargs)


def _seeded(func: Any, info: OpInfo, full: list) -> Any:
    """Random ops with no Generator argument: use the overload that has one, or PyTorch's
    decomposition into ones that do (`native_dropout` -> `rand_like` -> `rand.generator`)."""
    twin = info.generator_twin
    if twin is not None:
        tinfo = op_info(twin)
        by_name = dict(zip(info.arg_names, full))
        return trace(twin, tinfo, [by_name.get(n) for n in tinfo.arg_names])
    from torch._decomp import decomposition_table
    decomp = decomposition_table.get(func)
    if decomp is not None:
        args, kwargs = info.split(full)
        return decomp(*args, **kwargs)
    return trace(func, info, full)  # eager fallback or backend RNG: still correct in distribution


class BackwardErrors(threading.local):
    """The first error taken from the current thread's backward pass by the device guard (see
    `registration._LtcDeviceGuard`), raised when the autograd engine returns."""

    def __init__(self) -> None:
        self.first: BaseException | None = None


backward_errors = BackwardErrors()


lazy_tensor.LtcTensor.__torch_dispatch__ = classmethod(torch_dispatch)  # type: ignore[assignment]
