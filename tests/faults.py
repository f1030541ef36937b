"""Fault injection through the backend seam, for the reliability tests.

`FaultyBackend` wraps the real backend of a device: every program it compiles fails at random
(`InjectedFault`) with probability `rate` when it executes on one of the chosen devices.
`MarkerBackend` makes completion asynchronous, as CUDA's is: `execute` returns at once and a
completion marker (an event set by a timer thread) says when the work is really done, so
tests can check that every wait also waits for the markers.
"""
from __future__ import annotations

import contextlib
import random
import threading
from typing import Any, Iterator, Sequence

from ltc_async.backend import Computation
from ltc_async.executor import arena, compiler


class InjectedFault(RuntimeError):
    pass


class _Delegating:
    """Everything not overridden goes to the wrapped backend."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultInjector:
    def __init__(self, rate: float, devices: Sequence[int], seed: int = 0) -> None:
        self.rate = rate
        self.devices = {f"ltc:{d}-worker" for d in devices}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.injected = 0
        self.executed = 0

    def maybe_fail(self) -> None:
        here = threading.current_thread().name
        with self._lock:
            self.executed += 1
            if here in self.devices and self._rng.random() < self.rate:
                self.injected += 1
                raise InjectedFault(f"injected fault #{self.injected} on {here}")


class _FaultyComputation(Computation):
    def __init__(self, inner: Computation, injector: FaultInjector) -> None:
        self.inner = inner
        self.injector = injector
        self.backend_text = inner.backend_text

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        self.injector.maybe_fail()
        return self.inner.execute(inputs)


class FaultyBackend(_Delegating):
    def __init__(self, inner: Any, injector: FaultInjector) -> None:
        super().__init__(inner)
        self.injector = injector

    def compile(self, order, roots, device):  # noqa: ANN001
        return _FaultyComputation(self._inner.compile(order, roots, device), self.injector)


class _MarkerComputation(Computation):
    def __init__(self, inner: Computation) -> None:
        self.inner = inner
        self.backend_text = inner.backend_text

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        return self.inner.execute(inputs)


class MarkerBackend(_Delegating):
    """Completion markers that fire `delay` seconds after the execution returned."""

    def __init__(self, inner: Any, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay
        self.fired: list[threading.Event] = []

    def completion_marker(self, device):  # noqa: ANN001
        event = threading.Event()
        self.fired.append(event)
        threading.Timer(self.delay, event.set).start()
        return event

    def wait_marker(self, marker: threading.Event) -> None:
        marker.wait()


@contextlib.contextmanager
def backend_wrapped(make: Any, devices: Sequence[int] | None = None) -> Iterator[list[Any]]:
    """Replace the backend of `devices` (all by default) by `make(real_backend)` for the
    block; the compile cache is emptied before and after, so programs compiled by one backend
    never run under the other."""
    ctxs = arena.contexts() if devices is None else [arena.get(d) for d in devices]
    saved = [c.backend for c in ctxs]
    compiler.cache.clear()
    wrapped = []
    try:
        for c in ctxs:
            c.backend = make(c.backend)
            wrapped.append(c.backend)
        yield wrapped
    finally:
        for c, b in zip(ctxs, saved):
            c.backend = b
        compiler.cache.clear()
