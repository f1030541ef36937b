"""Stepping, waiting and reading values (mirrors `torch._lazy`)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch

from .executor import arena, steps
from .executor import graph_executor as gx
from .executor.futures import ExecutionError
from .tensor.lazy_tensor import LtcTensor, unwrap


def init(devices: list[str] | None = None, backend: str | None = None) -> list[torch.device]:
    """Configure the lazy devices before first use, e.g. `ltc.init(devices=["cpu", "cpu"])`.

    Without arguments uses `LTC_ASYNC_DEVICES` or the backend default (one device per CUDA GPU,
    else one CPU device).  A bad entry raises `ValueError` naming it.
    """
    return arena.init(devices, backend)


def devices() -> list[torch.device]:
    """The lazy devices, `ltc:0 .. ltc:N-1`."""
    return [c.device for c in arena.contexts()]


def backend_device(device: Any) -> torch.device:
    """The `torch.device` backing a lazy device (`ltc.backend_device("ltc:1")`)."""
    return arena.get(device).backend_device


def mark_step(device: Any = None, wait: bool = False) -> None:
    """Cut the graph of every live lazy tensor on `device` (all devices when None), queue it on
    the device and return at once: tensors then refer to the (future) results, so the next
    step can be traced while this one runs.  `wait=True` returns after execution finished.

    Never compiles on the caller's thread (see `executor/compiler.py`).  Runs the step closures
    added since the last `mark_step` (see `add_step_closure`), then re-raises an error raised
    by an earlier asynchronous closure.  Execution errors are reported by the next
    `wait_device_ops` or read that covers them (see `executor/graph_executor.py`).  The body is
    shared with `mark_step_async` (`executor/steps.py`).
    """
    steps.mark_step(arena.resolve(device), wait)


def wait_device_ops(devices: Any = None) -> None:
    """Block until every execution scheduled on `devices` (all when None) has finished.

    An error raised by an execution is re-raised here (an `ExecutionError` chained to the
    original exception, naming where the graph was scheduled), exactly once; the device stays
    usable afterwards.
    """
    steps.wait_device_ops(arena.resolve(devices))


def inner_list(tensors: Any) -> list[LtcTensor]:
    """The inner lazy tensors of a user's tensor or tensors."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return [unwrap(t) for t in tensors]


def sync(tensors: Sequence[torch.Tensor], wait: bool = True) -> None:
    """Materialize just these tensors (torch._lazy's `sync_multi`); `wait=False` only
    schedules them."""
    inner = inner_list(tensors)
    if wait:
        steps.sync(inner)  # raises for failed computations / covered device errors
    else:
        gx.sync_multi(inner)


def to_cpu(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of lazy tensors, waiting only for the executions they need (pending ones
    are cut together: one graph per device)."""
    tensors = list(tensors)
    gx.sync_multi(inner_list(tensors))
    return [t.to("cpu") for t in tensors]


def add_step_closure(fn: Callable, args: tuple = (), run_async: bool = False) -> None:
    """Run `fn(*args)` on the host after the next `mark_step` has executed.

    With `run_async=False` it runs before that `mark_step` returns; otherwise on a background
    thread in step order, and an exception it raises is re-raised by the next `mark_step` or
    `wait_device_ops`.  The closure sees the step's real values (read them with `.item()` or
    `.cpu()` inside it).
    """
    steps.closures.add(fn, tuple(args), run_async)


__all__ = ["init", "devices", "backend_device", "mark_step", "wait_device_ops", "sync", "to_cpu",
           "add_step_closure", "ExecutionError"]
