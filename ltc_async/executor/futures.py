"""Outcomes handed from worker threads to waiters: `Execution`, `BackendData`, `Worker`.

Design note.  Every piece of queued work (a graph execution, a cross-device transfer, a compile,
a batch the `DeviceLoader` prepared, a step closure) is a `concurrent.futures.Future`; device
work is the subclass `Execution`, which also knows its device, its place in the device queue
(`seq`), where it was scheduled (`label`) and, for backends whose kernels run asynchronously
(CUDA), a completion `marker`.

Waiting comes in two flavours over the same futures:

* threads block in `wait_all` (`concurrent.futures.wait`, then the markers);
* trio tasks `await wait_async(...)`: a done-callback calls `trio_token.run_sync_soon`, which
  wakes the task through the event loop's token.  No thread is parked per await, nothing polls,
  and a cancel scope aborts the await at once (the work itself goes on).

An operation that may wait (scheduling on a full queue, `mark_step`, a read, `wait_device_ops`)
is written once, as a generator that yields what it waits for -- a list of futures, or an empty
list for "let others run a moment" -- and returns its result.  `twin` turns it into the
blocking function (`run`: `wait_all` on each list) with an awaiting twin `.aio` (`run_async`:
`wait_async`) and the generator itself as `.steps`, for other operations to `yield from`.  So
`ltc.mark_step` and `ltc.mark_step_async` are one body.  A generator holds no lock across a
yield, so a trio task cancelled at a yield leaves nothing behind.

A `Worker` is one daemon thread running closures in FIFO order.  Nothing a closure or a
done-callback raises can kill it: closures report through their future, callbacks are guarded
by `concurrent.futures` (and by the worker loop as a last resort).  Idle for
`config.omp_idle_s` after some work, it frees its OpenMP helper threads (`base/openmp.py`: an
idle device worker's helpers made every parallel region of the user's eager code pay wake-ups).
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import queue
import threading
import time
from collections.abc import Generator
from typing import Any, Callable, Iterable, TypeVar

from ..base import openmp
from ..base.config import config
from ..base.errors import strip_frames  # noqa: F401 - re-exported
from ..ir.interpreter import Failed
from ..ir.node import TensorMeta

_log = logging.getLogger("ltc_async")


class ComputationError(RuntimeError):
    """Reading a tensor whose computation failed (the original exception is chained).

    `.device` / `.seq` name the execution that should have produced the tensor; `.upstream`
    is set when that execution could not compute it because an input had failed."""

    device: Any = None
    seq: int = 0
    upstream: str | None = None


class ExecutionError(RuntimeError):
    """An asynchronous execution on a lazy device failed (the original exception is chained).

    One `ExecutionError` is raised per barrier; when several executions failed before it, their
    individual errors are listed in `.errors` (each failed execution is reported exactly once).
    Each names its execution by `.device` and `.seq` (its place in that device's queue).
    `.upstream` is set when the execution failed only because one of its inputs (produced by
    another execution, whose own failure is reported separately) had failed.
    """

    errors: list["ExecutionError"]
    upstream: str | None = None
    device: Any = None
    seq: int = 0


_typed: dict[tuple[type, type], type] = {}


def typed_error(cls: type, cause: BaseException | None, text: str) -> Exception:
    """An instance of `cls` (`ComputationError`, `ExecutionError`) saying `text` that is also an
    instance of `cause`'s type where Python allows the mix: `except IndexError:` catches an
    index out of range that a kernel found at the barrier, as it catches eager's at the line.
    (A type whose instances need more than a message -- `UnicodeDecodeError` -- is left out.)"""
    kind = type(cause)
    if cause is None or not isinstance(cause, Exception) or issubclass(cls, kind):
        return cls(text)
    mixed = _typed.get((cls, kind))
    if mixed is None:
        try:
            mixed = type(f"{cls.__name__}[{kind.__name__}]", (cls, kind), {"__module__": cls.__module__})
            mixed(text)
        except TypeError:
            mixed = cls
        _typed[(cls, kind)] = mixed
    return mixed(text)


class Execution(cf.Future):
    """One piece of work queued on a device: its outputs (a list of values), or the error."""

    def __init__(self, label: str, ctx: Any = None, seq: int = 0) -> None:
        super().__init__()
        self.label = label      # where the work was scheduled (user file:line), for messages
        self.ctx = ctx          # the DeviceContext that runs it
        self.seq = seq          # position in the device queue (FIFO: completes in seq order)
        self.marker: Any = None  # backend completion marker (a CUDA event), see Backend
        self._wait_marker: Callable[[Any], None] | None = None
        self.failure: Any = None  # a `Failed` when some outputs could not be computed
        self.job: Callable[[], Any] | None = None  # the work (`DeviceContext.submit`); None once started
        self.reserved = False   # held for the reading thread that queued it (`read_here.py`)

    def claim(self) -> bool:
        """Make the calling thread the one that runs this execution: True when it had not
        started (nor been cancelled); it is then this thread's to run and complete."""
        with self._condition:   # an RLock: `set_running_or_notify_cancel` takes it again
            if self.running() or self.done():
                return False
            self.unreserve()
            return self.set_running_or_notify_cancel()

    def unreserve(self) -> None:
        """The reader will not run it: whoever waits for its decision goes on."""
        with self._condition:
            self.reserved = False
            self._condition.notify_all()

    def wait_decided(self) -> None:
        """Block while the reader that reserved this execution has not decided who runs it."""
        with self._condition:
            while self.reserved:
                self._condition.wait()

    def start_on_worker(self) -> bool:
        """The worker's claim of a queued item (`Worker._run`): False when cancelled or
        already run by another thread (a released reservation, `DeviceContext.release`)."""
        with self._condition:
            if self.running() or (self.done() and not self.cancelled()):
                return False
            return self.set_running_or_notify_cancel()

    def set_marker(self, backend: Any, device: Any) -> None:
        """Worker side, right after the backend returned: note how to wait for its kernels."""
        marker = backend.completion_marker(device)
        if marker is not None:
            self._wait_marker = backend.wait_marker
            self.marker = marker

    def wait_kernels(self) -> None:
        """Block until the kernels behind a completion marker finished (then forget it)."""
        marker, waiter = self.marker, self._wait_marker
        if marker is not None and waiter is not None:
            waiter(marker)
            self.marker = None

    @property
    def device(self) -> Any:   # kept for messages and older callers
        return self.ctx

    @property
    def error(self) -> BaseException | None:
        """The failure, once done (None while pending or when it succeeded)."""
        return self.exception(timeout=0) if self.done() and not self.cancelled() else None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the work *and its kernels* finished; False on timeout.  Never raises
        the work's error."""
        done, _ = cf.wait([self], timeout)
        if not done:
            return False
        self.wait_kernels()
        return True


def wait_all(futures: Iterable[cf.Future], timeout: float | None = None) -> bool:
    """Block until all `futures` (and their completion markers) are done."""
    futures = list(futures)
    done, pending = cf.wait(futures, timeout)
    if pending:
        return False
    for f in futures:
        if getattr(f, "marker", None) is not None:
            f.wait_kernels()
    return True


async def wait_async(futures: Iterable[cf.Future]) -> None:
    """Sleep without blocking the trio event loop until all `futures` (and their markers) are
    done.  Never raises their errors.  Cancellation returns at once; the work goes on."""
    import trio
    for f in futures:
        if not f.done():
            await _wait_one(f)
        if getattr(f, "marker", None) is not None:  # kernels still running on a GPU: the
            # event blocks, so a thread waits for it
            await trio.to_thread.run_sync(f.wait_kernels, abandon_on_cancel=True)
    await trio.lowlevel.checkpoint()


Steps = Generator[list, None, "T"]   # yields lists of futures to wait for, returns the result
T = TypeVar("T")


def run(steps: Steps, wait: Callable[[list], Any] = wait_all) -> Any:
    """Drive an operation written as a generator of waits on this thread, blocking (`wait`:
    how; a blocking read's runs its own graph first, `read_here.run_or_wait`)."""
    try:
        while True:
            waits = steps.send(None)
            if waits:
                wait(waits)
            else:
                time.sleep(0.001)
    except StopIteration as stop:
        return stop.value


async def run_async(steps: Steps) -> Any:
    """Drive the same generator in a trio task: every wait is an await, the loop never blocks."""
    import trio
    try:
        while True:
            waits = steps.send(None)
            if waits:
                await wait_async(waits)
            else:
                await trio.sleep(0.001)
    except StopIteration as stop:
        return stop.value


def twin(gen_fn: Callable[..., Steps]) -> Any:
    """`f = twin(gen_fn)`: `f(...)` blocks, `await f.aio(...)` awaits, `f.steps(...)` is the
    generator (see the module note)."""
    @functools.wraps(gen_fn)
    def blocking(*args: Any, **kwargs: Any) -> Any:
        return run(gen_fn(*args, **kwargs))

    async def awaiting(*args: Any, **kwargs: Any) -> Any:
        return await run_async(gen_fn(*args, **kwargs))
    awaiting.__name__ = awaiting.__qualname__ = gen_fn.__name__ + "_async"
    awaiting.__doc__ = f"`{gen_fn.__name__}` for trio: every wait is an await."
    blocking.aio = awaiting
    blocking.steps = gen_fn
    return blocking


async def _wait_one(f: cf.Future) -> None:
    import trio
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()
    state = {"waiting": True}

    def wake() -> None:  # runs on the event loop thread
        if state["waiting"]:
            state["waiting"] = False
            trio.lowlevel.reschedule(task)

    def on_done(_f: cf.Future) -> None:  # runs on whatever thread completed `f`
        try:
            token.run_sync_soon(wake)
        except trio.RunFinishedError:
            pass

    def abort(_raise_cancel: Any) -> Any:
        state["waiting"] = False
        return trio.lowlevel.Abort.SUCCEEDED

    f.add_done_callback(on_done)
    await trio.lowlevel.wait_task_rescheduled(abort)


def read_error(failed: Failed, f: Execution) -> Exception:
    """The error for reading a tensor execution `f` should have produced."""
    upstream = None
    if failed.ctx is f.ctx and failed.label == f.label:
        text = f"the computation producing this tensor failed: {failed.root_text}"
    else:
        upstream = f"the graph scheduled at {failed.label} on {failed.ctx}"
        text = (f"the computation producing this tensor on {f.ctx} (graph scheduled at "
                f"{f.label}) did not run because an input had failed: {failed.root_text}")
    err = typed_error(ComputationError, failed.error, text)
    err.upstream = upstream
    err.__cause__ = failed.error
    err.device, err.seq = f.ctx.device, f.seq
    return err


class BackendData:
    """A handle to one tensor's data on a backend device.

    Either holds the value already (uploads, eager fallbacks) or is a placeholder for output
    `index` of an `Execution` (what `mark_step` hands out before the device has run).
    """

    __slots__ = ("device", "meta", "seq", "_value", "_future", "_index", "__weakref__")

    def __init__(self, device: Any, meta: TensorMeta, value: Any = None,
                 future: Execution | None = None, index: int = 0) -> None:
        self.device = device
        self.meta = meta
        self.seq = future.seq if future is not None else 0  # producer's place in its queue
        self._value = value
        self._future = future
        self._index = index

    @property
    def future(self) -> Execution | None:
        """The pending execution producing this data (None once known to be available)."""
        f = self._future
        if f is not None and f.done() and f.marker is None and f.error is None:
            value = f.result()[self._index]
            if type(value) is not Failed:
                self._value = value
                self._future = None
                return None
        return f

    def is_ready(self) -> bool:
        f = self._future
        return f is None or f.done()

    def resolve(self) -> Any:
        """The backend value, or `Failed` if its execution could not produce it (waits)."""
        f = self._future
        if f is None:
            return self._value
        f.wait()
        error = f.error
        if error is not None:  # the whole execution failed (not a single op)
            failed = Failed(error, "execution")
            failed.ctx, failed.label = f.ctx, f.label
            return failed
        value = f.result()[self._index]
        if type(value) is not Failed:
            self._value = value
            self._future = None
        return value

    def get(self) -> Any:
        """The backend value, waiting for its execution if needed.

        Raises `ComputationError` (chained to the root exception) if it could not be computed.
        """
        value = self.resolve()
        if type(value) is Failed:
            raise read_error(value, self._future)
        return value


class Worker:
    """One daemon thread running closures in FIFO order (see the module docstring)."""

    def __init__(self, name: str, init: Callable[[], None] | None = None) -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._init = init
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stopping = False

    def submit(self, fn: Callable[[], Any], future: cf.Future) -> cf.Future:
        """Queue `fn`; its return value or exception completes `future` (returned)."""
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    t = threading.Thread(target=self._run, name=self.name, daemon=True)
                    t.start()
                    self._thread = t
        self._queue.put((fn, future))
        return future

    def _run(self) -> None:
        if self._init is not None:
            try:
                self._init()
            except BaseException:  # noqa: BLE001 - a bad init must not stop the queue
                _log.exception("ltc_async: worker %s failed to initialize", self.name)
        ran = False
        while True:
            idle = config.omp_idle_s if ran else 0   # after some work: wait that long, then
            try:                                     # give the OpenMP helpers back
                item = self._queue.get(timeout=idle if idle > 0 else None)
            except queue.Empty:
                ran = False
                self._release_openmp()
                continue
            if item is None:
                return
            ran = True
            fn, future = item
            if self._stopping:
                future.cancel()  # shutdown after Ctrl-C: waiters see it cancelled, never hang
            start = getattr(future, "start_on_worker", None)   # an Execution a reader may take
            if not (start() if start is not None else future.set_running_or_notify_cancel()):
                continue
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 - reported through the future
                outcome: tuple[Any, BaseException | None] = (None, e)
            else:
                outcome = (result, None)
            del fn, item
            self._complete(future, *outcome)
            del future, outcome

    def _release_openmp(self) -> None:
        try:
            openmp.release()
        except BaseException:  # noqa: BLE001 - the worker must survive anything
            _log.exception("ltc_async: worker %s could not release its OpenMP threads", self.name)

    @staticmethod
    def _complete(future: cf.Future, result: Any, error: BaseException | None) -> None:
        try:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(strip_frames(error))
        except BaseException:  # noqa: BLE001 - last resort: the worker must survive anything
            _log.exception("ltc_async: completing a future failed")

    def stop(self, timeout: float | None = None, cancel_queued: bool = False) -> bool:
        """Finish (or, with `cancel_queued`, skip) what is queued, then end the thread.
        Returns False if the thread is still running after `timeout`."""
        t = self._thread
        if t is None:
            return True
        if cancel_queued:
            self._stopping = True
        self._queue.put(None)
        t.join(timeout)
        return not t.is_alive()

    @property
    def on_worker(self) -> bool:
        return threading.current_thread() is self._thread
