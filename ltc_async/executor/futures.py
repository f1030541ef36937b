"""Outcomes handed from device workers to waiters: `Future`, `BackendData`, `MultiWait`.

Worker threads never touch waiter state: they complete a `Future` (value or exception) and run
its callbacks, which is how the trio bridge wakes an event loop through its token without
parking a thread per await (see `ltc_async/aio.py`).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from ..ir.node import TensorMeta


class ComputationError(RuntimeError):
    """Reading a tensor whose computation failed (the original exception is chained)."""


class Future:
    """Result of one scheduled device execution: a list of output values, or an exception."""

    __slots__ = ("_event", "_result", "_error", "_callbacks", "_lock", "label", "device", "marker")

    def __init__(self, label: str = "", device: Any = None) -> None:
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Future"], None]] | None = []
        self._lock = threading.Lock()
        self.label = label      # where the work came from (for error messages)
        self.device = device    # the DeviceContext that runs it
        self.marker: Any = None  # backend completion marker (a CUDA event), see Backend

    def done(self) -> bool:
        return self._event.is_set()

    def _complete(self, result: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._callbacks is None:
                raise RuntimeError("future completed twice")
            self._result, self._error = result, error
            callbacks, self._callbacks = self._callbacks, None
            self._event.set()
        for cb in callbacks:
            cb(self)

    def set_result(self, result: Any) -> None:
        self._complete(result, None)

    def set_error(self, error: BaseException) -> None:
        self._complete(None, error)

    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        """Call `fn(self)` on completion (at once, here, if already complete)."""
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until complete; False if `timeout` expired first.  Never raises the error."""
        return self._event.wait(timeout)

    @property
    def error(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._result


class BackendData:
    """A handle to one tensor's data on a backend device.

    Either holds the value already (uploads, eager fallbacks) or is a placeholder for output
    `index` of an execution `Future` (what `mark_step` hands out before the device has run).
    """

    __slots__ = ("device", "meta", "_value", "_future", "_index", "__weakref__")

    def __init__(self, device: Any, meta: TensorMeta, value: Any = None,
                 future: Future | None = None, index: int = 0) -> None:
        self.device = device
        self.meta = meta
        self._value = value
        self._future = future
        self._index = index

    @property
    def future(self) -> Future | None:
        """The pending execution producing this data (None once known to be available)."""
        f = self._future
        if f is not None and f.done() and f.error is None:
            self._value = f._result[self._index]
            self._future = None
            return None
        return f

    def is_ready(self) -> bool:
        f = self._future
        return f is None or f.done()

    def get(self) -> Any:
        """The backend value, waiting for its execution if needed.

        Raises `ComputationError` (chained to the original exception) if that execution failed.
        """
        f = self._future
        if f is None:
            return self._value
        f.wait()
        if f.error is not None:
            raise ComputationError(
                f"the computation producing this tensor failed on {self.device} "
                f"(graph scheduled at {f.label}): {type(f.error).__name__}: {f.error}"
            ) from f.error
        self._value = f._result[self._index]
        self._future = None
        return self._value


class MultiWait:
    """Wait for `count` completions; the first error wins, the others still complete.

    LTC's `MultiWait`: used wherever several closures run at once (uploads, downloads, syncs of
    several devices), so a waiter sees every closure finished before it sees an error.
    """

    def __init__(self, count: int) -> None:
        self._count = count
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    def done(self, error: BaseException | None = None) -> None:
        with self._cond:
            if error is not None and self._error is None:
                self._error = error
            self._count -= 1
            if self._count <= 0:
                self._cond.notify_all()

    def completer(self, fn: Callable[..., Any], *args: Any) -> Callable[[], None]:
        """Wrap `fn(*args)` so that it reports its outcome here when run."""
        def run() -> None:
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                self.done(e)
            else:
                self.done()
        return run

    def wait(self, timeout: float | None = None) -> None:
        """Block until all completed, then raise the first error if there was one."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._count <= 0, timeout):
                raise TimeoutError(f"MultiWait: {self._count} completions still missing")
            if self._error is not None:
                raise self._error
