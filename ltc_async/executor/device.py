"""Per-device state (LTC's `DeviceContextArena` + `DeviceLocker`) and the device workers.

Design note.  Every lazy device `ltc:N` owns:

* a **worker**: one daemon thread draining a FIFO of closures.  Executions are queued in the
  order their graphs were cut, so a graph that consumes another graph's placeholder outputs on
  the same device runs after it without any host wait;
* a **locker** (`lock`): held while a graph is cut and queued, so concurrent `mark_step`s on one
  device enqueue whole graphs atomically and in a well-defined order.  Operations spanning
  several devices take the lockers in device-index order (`lock_devices`), whatever order the
  caller named them in, so they cannot deadlock;
* the **live tensor registry**: tensors with pending IR, in creation order (what `mark_step`
  syncs);
* the **RNG state**: a seed from `torch.manual_seed` and a counter, from which every random op
  draws its own seed at trace time;
* the **pending error**: the first exception raised by an execution, re-raised once by the next
  barrier (`wait_device_ops`, a sync touching the device), then cleared.
"""
from __future__ import annotations

import contextlib
import itertools
import queue
import sys
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch

from .futures import Future

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64 finalizer: decorrelates (seed, counter) pairs into generator seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


class ExecutionError(RuntimeError):
    """An asynchronous execution on a lazy device failed (the original exception is chained)."""


class DeviceWorker:
    """One daemon thread running closures in FIFO order."""

    _STOP = object()

    def __init__(self, name: str, init: Callable[[], None]) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._init = init
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._start_lock = threading.Lock()

    def submit(self, fn: Callable[[], None]) -> None:
        if not self._started:
            with self._start_lock:
                if not self._started:
                    self._thread.start()
                    self._started = True
        self._queue.put(fn)

    def _run(self) -> None:
        self._init()
        while True:
            fn = self._queue.get()
            if fn is self._STOP:
                return
            fn()  # closures capture their own errors (see GraphExecutor._run)

    def stop(self, timeout: float | None) -> None:
        if self._started:
            self._queue.put(self._STOP)
            self._thread.join(timeout)

    @property
    def on_worker(self) -> bool:
        return threading.current_thread() is self._thread


class DeviceContext:
    """Everything ltc_async keeps per lazy device (see the module docstring)."""

    def __init__(self, index: int, backend: Any, backend_device: torch.device, threads: int) -> None:
        self.index = index
        self.device = torch.device("ltc", index)
        self.backend = backend
        self.backend_device = backend_device
        self.lock = threading.RLock()  # re-entrant: a barrier may hold it around a sync
        self.worker = DeviceWorker(f"ltc:{index}-worker",
                                   lambda: backend.worker_init(backend_device, threads))
        self._live: dict[int, weakref.ref] = {}
        self._ids = itertools.count()
        self.seed = torch.initial_seed()
        self._rng_counter = 0
        self._rng_lock = threading.Lock()
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self.last: Future | None = None       # the most recently queued execution
        self.inflight = threading.BoundedSemaphore(1 << 30)  # replaced by the arena

    def __repr__(self) -> str:
        return f"ltc:{self.index}"

    # -- live tensors -------------------------------------------------------------------
    def register(self, t: Any) -> None:
        k = next(self._ids)
        t._id = k
        live = self._live
        live[k] = weakref.ref(t, lambda _r, k=k, live=live: live.pop(k, None))

    def unregister(self, t: Any) -> None:
        self._live.pop(t._id, None)

    def rebind(self, t: Any, value: tuple) -> None:
        """The one writer of an existing lazy tensor's value `t._v` (a `(Node, index)` pair):
        under the device lock, so a concurrent `mark_step` never reads a half-updated tensor,
        loses the update or unregisters a tensor that holds pending IR again."""
        with self.lock:
            t._v = value
            if value[0].is_data:
                self._live.pop(getattr(t, "_id", None), None)
            elif getattr(t, "_id", None) not in self._live:
                self.register(t)

    def live_tensors(self) -> list[Any]:
        """Tensors with pending IR, oldest first (a stable order keeps graph keys stable)."""
        out = []
        for r in self._live.copy().values():
            t = r()
            if t is not None and not t._v[0].is_data:
                out.append(t)
        return out

    def live_count(self) -> int:
        return len(self._live)

    # -- RNG --------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        self.set_rng_state(int(seed), 0)

    def next_seed(self) -> int:
        with self._rng_lock:
            k = self._rng_counter
            self._rng_counter = k + 1
            return _mix64((self.seed & _MASK64) * 0x100000001B3 + k)

    def rng_state(self) -> tuple[int, int]:
        """(seed, draws so far): everything the per-device generator is."""
        with self._rng_lock:
            return self.seed, self._rng_counter

    def set_rng_state(self, seed: int, counter: int) -> None:
        with self._rng_lock:
            self.seed, self._rng_counter = seed, counter

    # -- errors -----------------------------------------------------------------------
    def record_error(self, error: BaseException) -> None:
        with self._error_lock:
            if self._error is None:
                self._error = error

    def take_error(self) -> BaseException | None:
        with self._error_lock:
            err, self._error = self._error, None
            return err

    def discard_error(self, error: BaseException) -> None:
        """Forget `error` if it is the pending one (it was just raised some other way)."""
        with self._error_lock:
            if self._error is error or (self._error is not None and self._error.__cause__ is error):
                self._error = None

    def check_error(self) -> None:
        """Re-raise (once) the first error an execution on this device raised."""
        err = self.take_error()
        if err is not None:
            raise err

    def wait(self, timeout: float | None = None) -> bool:
        """Block until everything queued so far has run (errors are not raised here)."""
        f = self.last
        if f is None:
            return True
        if not f.wait(timeout):
            return False
        if f.marker is not None:  # kernels launched asynchronously (CUDA): wait for them too
            self.backend.wait_marker(f.marker)
        return True


@contextlib.contextmanager
def lock_devices(ctxs: Sequence[DeviceContext]) -> Iterator[None]:
    """Hold several devices' lockers, always taken in index order (no lock-order deadlock)."""
    ordered = sorted({c.index: c for c in ctxs}.values(), key=lambda c: c.index)
    with contextlib.ExitStack() as stack:
        for c in ordered:
            stack.enter_context(c.lock)
        yield


_SKIP_PREFIXES: tuple[str, ...] = ()


def _skip_prefixes() -> tuple[str, ...]:
    global _SKIP_PREFIXES
    if not _SKIP_PREFIXES:
        import os
        import ltc_async
        here = os.path.dirname(os.path.abspath(ltc_async.__file__))
        devs = os.path.join(os.path.dirname(here), "devices")
        _SKIP_PREFIXES = (here, devs, os.path.dirname(torch.__file__), "<frozen")
    return _SKIP_PREFIXES


def caller_location() -> str:
    """`file:line (function)` of the innermost frame outside ltc_async, its backends and torch."""
    skip = _skip_prefixes()
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip) and "ltc_async_devices" not in fn:
            return f"{fn}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "<unknown>"
