"""The entry point of every aten call that reaches an `LtcTensor`: route it to its op path.

Design note.  LTC generates a C++ IR class and kernel per op with torchgen; ltc_async reads each
op's schema once (`ir/schema.py`) and routes every call by what the schema says:

* a few ops have explicit handlers (`special.py`: device transfers, uploads through `copy`,
  identity ops, batch norm's hidden running-stat update);
* ops that write their arguments with no functional form run on host copies (`host.py`);
* ops returning non-tensors (`.item()`, `bool(t)`) sync their inputs (`host.py`);
* everything else is traced into an IR node (`trace.py`), random ops through their
  `Generator?` overload so they draw from the per-device seed.

The module layout follows the pipeline: `dispatch` -> `trace` (+ `shapes`) / `host` /
`special`; nothing here reaches past the executor.  An op failing inside a C++ autograd formula
is the one error not raised on the spot (`_defer_backward_error`).
"""
from __future__ import annotations

from typing import Any

import torch

import threading

from .. import metrics
from ..executor import arena
from ..ir.schema import TENSOR, OpInfo, op_info
from . import lazy_tensor
from .host import adopt, host_op, mutating_host_op
from .lazy_tensor import LtcTensor
from .special import SPECIAL
from .trace import trace

_entries: dict[int, tuple[Any, OpInfo]] = {}  # id(op) -> (special handler, OpInfo)


def dispatch(func: torch._ops.OpOverload, args: tuple, kwargs: dict | None) -> Any:
    try:
        return _route(func, args, kwargs)
    except Exception as e:
        if torch._C._current_graph_task_id() == -1:  # not inside a backward pass
            raise
        return _defer_backward_error(func, args, e)


def _route(func: torch._ops.OpOverload, args: tuple, kwargs: dict | None) -> Any:
    entry = _entries.get(id(func))  # by id: OpOverload.__hash__ is slow Python code
    if entry is None:
        entry = _entries[id(func)] = (SPECIAL.get(func), op_info(func))
    handler, info = entry
    if handler is not None:
        return handler(func, args, kwargs or {})
    metrics.counter(info.counter)
    if info.is_inplace_or_out:
        return mutating_host_op(func, info, args, kwargs or {})
    if not info.returns_only_tensors:
        return host_op(func, info, args, kwargs or {})
    full = info.bind(args, kwargs) if (kwargs or len(args) != len(info.kinds)) else list(args)
    if info.seeded and not info.has_generator:
        return _seeded(func, info, full)
    return trace(func, info, full)


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
    """The first error an op raised inside the current thread's backward pass (see below)."""

    def __init__(self) -> None:
        self.first: BaseException | None = None


backward_errors = BackwardErrors()


def _defer_backward_error(func: Any, args: tuple, error: Exception) -> Any:
    """An op failed inside a C++ autograd formula.  Raising there would abort the process:
    while the exception unwinds, the engine's stream guard calls PyTorch's Python-backed
    PrivateUse1 device guard (`type()`) in a noexcept destructor with the Python error still
    set, and C++ terminates.  So the error is kept for `registration`'s backward wrapper to
    raise once the engine returns, and the op yields an empty stand-in meanwhile."""
    if backward_errors.first is None:
        backward_errors.first = error
    info = op_info(func)
    if not info.returns_only_tensors:
        raise error
    ctx = next((a._ctx for a in args if type(a) is LtcTensor), None) or arena.get(None)
    stand_in = [adopt(ctx, torch.empty(0, device=ctx.backend_device)) if k == TENSOR else []
                for k in info.returns]
    return stand_in[0] if len(stand_in) == 1 else tuple(stand_in)


lazy_tensor._dispatch = dispatch
