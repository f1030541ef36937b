"""The entry point of every aten call that reaches an `LtcTensor`: route it to its op path.

Design note.  LTC generates a C++ IR class and kernel per op with torchgen; ltc_async reads each
op's schema once (`ir/schema.py`) and routes every call by what the schema says:

* a few ops have explicit handlers (`special.py`: device transfers, uploads through `copy`,
  identity ops, batch norm's hidden running-stat update), a few are traced as the ops they
  decompose into (`decompositions.py`: `_foreach_*` with scalar lists, the fused RNN cells);
* ops that write their arguments with no functional form run on host copies (`host.py`);
* ops returning non-tensors (`.item()`, `bool(t)`) sync their inputs (`host.py`);
* everything else is traced into an IR node (`trace.py`), random ops through their
  `Generator?` overload so they draw from the per-device seed.

The module layout follows the pipeline: `dispatch` -> `trace` (+ `shapes`) / `host` /
`special`; nothing here reaches past the executor.  Errors raise on the spot, also inside a
backward pass (`registration._LtcDeviceGuard` keeps the engine from aborting on them).
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from .. import metrics
from ..ir.schema import OpInfo, op_info
from . import collectives, lazy_tensor
from .decompositions import DECOMPOSITIONS
from .host import host_op, mutating_host_op
from .special import SPECIAL
from .trace import trace

_entries: dict[int, tuple[Any, OpInfo]] = {}  # id(op) -> (special handler or decomposition, OpInfo)


def dispatch(func: torch._ops.OpOverload, args: tuple, kwargs: dict | None) -> Any:
    entry = _entries.get(id(func))  # by id: OpOverload.__hash__ is slow Python code
    if entry is None:
        entry = _entries[id(func)] = (SPECIAL.get(func) or DECOMPOSITIONS.get(func), op_info(func))
    handler, info = entry
    if handler is not None:
        return handler(func, args, kwargs or {})
    metrics.counter(info.counter)
    if info.is_inplace_or_out:
        if info.qualname.startswith("c10d::"):   # torch.distributed: queued on the device
            out = collectives.queue(func, info, args, kwargs or {})
            if out is not NotImplemented:
                return out
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
    """The first error taken from the current thread's backward pass by the device guard (see
    `registration._LtcDeviceGuard`), raised when the autograd engine returns."""

    def __init__(self) -> None:
        self.first: BaseException | None = None


backward_errors = BackwardErrors()


lazy_tensor._dispatch = dispatch
