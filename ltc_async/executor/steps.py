"""The user's barriers, written once for the blocking API and its trio twins.

Design note.  `ltc.mark_step` / `ltc.mark_step_async`, `ltc.wait_device_ops` / `_async` and
`ltc.sync` / `ltc.sync_async` are each one generator here (a `twin`, see `futures.py`):
`api.py` drives them blocking, `aio.py` awaiting, so the two can never drift apart.  A step is

1. `events.step_begins` (the timeline numbers steps and times a wait for a queue slot);
2. the cut: every live tensor's graph on the devices, queued (`graph_executor.mark_step`);
3. `events.step_done`;
4. the step closures added since the last step (`add_step_closure`): synchronous ones run
   once the step's executions finished; asynchronous ones go to the closure worker;
5. an error raised by an earlier asynchronous closure is re-raised.

Step closures.  Synchronous closures run on the caller's thread (or task) before `mark_step`
returns; asynchronous ones on one `Worker` thread, in step order, each batch after its step's
executions finished.  Reads inside closures are explicit (`events.explicit_reads`: the sync
guard exempts them).  Errors of asynchronous closures are kept under `_lock` (a leaf) and
re-raised once by the next `mark_step` or `wait_device_ops`.  At exit the closure worker is
drained after the device queues and stopped with the other workers (`events.exit_drain`,
`events.exit_stop`).
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable, Sequence

from ..base import events
from . import graph_executor as gx
from .device import DeviceContext
from .futures import Execution, Steps, Worker, run, strip_frames, twin, wait_all

__all__ = ["mark_step", "wait_device_ops", "sync", "closures"]


def _run_all(closures: list[tuple[Callable, tuple]]) -> None:
    for fn, a in closures:
        (events.explicit_reads.wrap(fn) if events.explicit_reads.on else fn)(*a)


class StepClosures:
    """`add_step_closure` bookkeeping (see the module note)."""

    def __init__(self) -> None:
        self._pending: list[tuple[Callable, tuple, bool]] = []
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._worker = Worker("ltc-step-closures")
        self._last: cf.Future | None = None
        events.exit_drain.subscribe(lambda: run(self.drain()))
        events.exit_stop.subscribe(self._worker.stop)

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
        for c in closures:
            try:
                _run_all([c])
            except BaseException as e:  # noqa: BLE001 - re-raised at the next barrier
                with self._lock:
                    self._errors.append(strip_frames(e))

    def drain(self) -> Steps:
        """Wait until every queued asynchronous closure has run."""
        f = self._last
        if f is not None:
            yield [f]

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


closures = StepClosures()


@twin
def mark_step(ctxs: Sequence[DeviceContext], wait: bool = False) -> Steps:
    """`ltc.mark_step` (see the module note); `wait=True` also waits for the executions."""
    if events.step_begins.on:
        events.step_begins()
    executions = yield from gx.mark_step.steps(ctxs)
    if events.step_done.on:
        events.step_done(ctxs)
    sync_closures = closures.after_step(executions)
    if sync_closures:
        yield executions
        _run_all(sync_closures)
    if wait:
        yield from gx.wait_device_ops.steps(ctxs)
    closures.check()


@twin
def wait_device_ops(ctxs: Sequence[DeviceContext]) -> Steps:
    """`ltc.wait_device_ops`: asynchronous closures, then every execution on `ctxs`."""
    yield from closures.drain()
    yield from gx.wait_device_ops.steps(ctxs)
    closures.check()


@twin
def sync(tensors: Sequence[Any]) -> Steps:
    """`ltc.sync`: schedule exactly these tensors' pending IR and wait for their executions."""
    return (yield from gx.materialize.steps(tensors))
