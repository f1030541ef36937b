"""Stepping, waiting and reading values (mirrors `torch._lazy`)."""
from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable, Iterable, Sequence

import torch

from .diagnostics import hooks as _dx
from .diagnostics.sync_guard import exempt as _reads_allowed
from .executor import arena
from .executor import graph_executor as gx
from .executor.futures import Execution, ExecutionError, Worker, strip_frames, wait_all, wait_async
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
    `wait_device_ops` or read that covers them (see `executor/graph_executor.py`).
    """
    ctxs = arena.resolve(device)
    if _dx.on:   # diagnostics: the timeline's step numbers, time waiting for a queue slot
        _dx.step_begins()
    executions = gx.mark_step(ctxs)
    if _dx.on:   # diagnostics: the timeline's step numbers
        _dx.step_done(ctxs)
    sync_closures = _closures.after_step(executions)
    if sync_closures:
        wait_all(executions)
        _run_all(sync_closures)
    if wait:
        gx.wait_device_ops(ctxs)
    _closures.check()


def wait_device_ops(devices: Any = None) -> None:
    """Block until every execution scheduled on `devices` (all when None) has finished.

    An error raised by an execution is re-raised here (an `ExecutionError` chained to the
    original exception, naming where the graph was scheduled), exactly once; the device stays
    usable afterwards.
    """
    ctxs = arena.resolve(devices)
    _closures.drain()
    gx.wait_device_ops(ctxs)
    _closures.check()


def _inner_list(tensors: Any) -> list[LtcTensor]:
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return [unwrap(t) for t in tensors]


def sync(tensors: Sequence[torch.Tensor], wait: bool = True) -> None:
    """Materialize just these tensors (torch._lazy's `sync_multi`); `wait=False` only
    schedules them."""
    inner = _inner_list(tensors)
    if wait:
        gx.materialize(inner)  # raises for failed computations / covered device errors
    else:
        gx.sync_multi(inner)


def to_cpu(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of lazy tensors, waiting only for the executions they need (pending ones
    are cut together: one graph per device)."""
    tensors = list(tensors)
    gx.sync_multi(_inner_list(tensors))
    return [t.to("cpu") for t in tensors]


# -- step closures --------------------------------------------------------------------------

def _run_all(closures: list[tuple[Callable, tuple]]) -> None:
    with _reads_allowed():   # reads in step closures are explicit (`ltc.sync_guard`)
        for fn, a in closures:
            fn(*a)


class _StepClosures:
    """`add_step_closure` bookkeeping: synchronous closures run at the end of `mark_step`;
    asynchronous ones on one `Worker` thread, in step order, each batch after its step's
    executions finished.  Their errors are kept (under `_lock`) for the next barrier."""

    def __init__(self) -> None:
        self._pending: list[tuple[Callable, tuple, bool]] = []
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._worker = Worker("ltc-step-closures")
        self._last: cf.Future | None = None
        arena.on_exit(self.drain, self._worker.stop)

    def add(self, fn: Callable, args: tuple, run_async: bool) -> None:
        with self._lock:
            self._pending.append((fn, args, run_async))

    def after_step(self, executions: list[Execution]) -> list[tuple[Callable, tuple]]:
        """Queue this step's asynchronous closures; return its synchronous ones."""
        with self._lock:
            todo, self._pending = self._pending, []
        async_ones = [(fn, a) for fn, a, r in todo if r]
        if async_ones:
            self._last = self._worker.submit(lambda: self._run(executions, async_ones), cf.Future())
        return [(fn, a) for fn, a, r in todo if not r]

    def _run(self, executions: list[Execution], closures: list[tuple[Callable, tuple]]) -> None:
        wait_all(executions)
        for fn, a in closures:
            try:
                with _reads_allowed():   # reads in step closures are explicit
                    fn(*a)
            except BaseException as e:  # noqa: BLE001 - re-raised at the next barrier
                with self._lock:
                    self._errors.append(strip_frames(e))

    def drain(self) -> None:
        """Block until every queued asynchronous closure has run."""
        f = self._last
        if f is not None:
            cf.wait([f])

    async def drain_async(self) -> None:
        f = self._last
        if f is not None:
            await wait_async([f])

    def check(self) -> None:
        """Re-raise (once) the errors of asynchronous closures that finished so far."""
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            first = errors[0]
            err = RuntimeError(f"an asynchronous step closure failed: {type(first).__name__}: "
                               f"{first}{more}")
            err.errors = errors   # every failure, each reported once
            raise err from first


_closures = _StepClosures()


def add_step_closure(fn: Callable, args: tuple = (), run_async: bool = False) -> None:
    """Run `fn(*args)` on the host after the next `mark_step` has executed.

    With `run_async=False` it runs before that `mark_step` returns; otherwise on a background
    thread in step order, and an exception it raises is re-raised by the next `mark_step` or
    `wait_device_ops`.  The closure sees the step's real values (read them with `.item()` or
    `.cpu()` inside it).
    """
    _closures.add(fn, tuple(args), run_async)


__all__ = ["init", "devices", "backend_device", "mark_step", "wait_device_ops", "sync", "to_cpu",
           "add_step_closure", "ExecutionError"]
