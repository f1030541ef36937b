"""Stepping, waiting and reading values (mirrors `torch._lazy`)."""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Sequence

import torch

from .executor import arena
from .executor import graph_executor as gx
from .executor.device import ExecutionError
from .executor.futures import Future
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

    Also runs the step closures added since the last `mark_step` (see `add_step_closure`) and
    re-raises an error raised by an earlier asynchronous closure.
    """
    ctxs = arena.resolve(device)
    futures = gx.mark_step(ctxs, wait=wait)
    _closures.after_step(ctxs, futures)


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
    futures = _schedule(inner)
    if wait:
        for f in futures:
            f.wait()
        gx.materialize(inner)  # raises for failed computations / pending device errors


def _schedule(inner: list[LtcTensor]) -> list[Future]:
    gx.sync_multi(inner)
    futures = []
    for t in inner:
        f = t._v[0].data.future
        if f is not None:
            futures.append(f)
    return futures


def to_cpu(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of lazy tensors, waiting only for the executions they need (pending ones
    are cut together: one graph per device)."""
    tensors = list(tensors)
    _schedule(_inner_list(tensors))
    return [t.to("cpu") for t in tensors]


# -- step closures --------------------------------------------------------------------------

class _StepClosures:
    """`add_step_closure` bookkeeping: synchronous closures run at the end of `mark_step`,
    asynchronous ones on one background thread, in step order, after the step executed."""

    def __init__(self) -> None:
        self._pending: list[tuple[Callable, tuple, bool]] = []
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._outstanding = 0
        self._idle = threading.Condition()

    def add(self, fn: Callable, args: tuple, run_async: bool) -> None:
        with self._lock:
            self._pending.append((fn, args, run_async))

    def after_step(self, ctxs: list, futures: list[Future]) -> None:
        with self._lock:
            todo, self._pending = self._pending, []
        self.check()
        if not todo:
            return
        sync_ones = [(fn, a) for fn, a, r in todo if not r]
        async_ones = [(fn, a) for fn, a, r in todo if r]
        if async_ones:
            self._start()
            with self._idle:
                self._outstanding += 1
            self._queue.put((list(futures), async_ones))
        if sync_ones:
            for f in futures:
                f.wait()
            for fn, a in sync_ones:
                fn(*a)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ltc-step-closures", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            futures, items = self._queue.get()
            for f in futures:
                f.wait()
            for fn, a in items:
                try:
                    fn(*a)
                except BaseException as e:  # noqa: BLE001 - re-raised at the next barrier
                    if self._error is None:
                        self._error = e
            with self._idle:
                self._outstanding -= 1
                self._idle.notify_all()

    def drain(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._outstanding == 0)

    def check(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise RuntimeError(f"an asynchronous step closure failed: {type(err).__name__}: {err}") from err


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
