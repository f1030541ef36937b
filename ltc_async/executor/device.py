"""Per-device state (LTC's `DeviceContextArena` + `DeviceLocker`): one `DeviceContext` per lazy
device, the single mechanism behind the blocking API, the trio API, transfers, `DataParallel`
and `DeviceLoader`.

Design note.  Every lazy device `ltc:N` owns:

* a **queue**: a `Worker` thread running `Execution`s (graph executions, transfers) in FIFO
  order.  Each execution gets the next sequence number `seq`; FIFO means executions complete
  in `seq` order, so waiting for the newest one waits for everything queued before it, and a
  graph consuming another graph's placeholder outputs on the same device needs no host wait;
* the **in-flight bound**: at most `max_inflight` executions queued or running.  A slot is
  taken *before* the device lock (`acquire_slot`, or `try_acquire_slot` + awaiting `oldest()`
  from trio) and given back by the worker when the execution ends, so a full queue waits for
  its oldest execution, never for the whole queue;
* the **pending errors**: every failed execution leaves one `ExecutionError` tagged with its
  `seq`.  A barrier raises those it covers (see `raise_errors`), each exactly once;
* the **live tensor registry** (tensors with pending IR, in creation order) and the **RNG
  state** (seed and draw counter: every random op draws its own seed at trace time).

Locking rules (the argument that nothing deadlocks):

1. `lock` (an RLock, LTC's DeviceLocker) guards cutting graphs and every rebinding of a lazy
   tensor's value (`rebind`, the executor's cut): one writer, so a concurrent `mark_step`
   never loses an update or unregisters a tensor that holds pending IR.  Several devices'
   locks are always taken in index order (`lock_devices`).
2. Nothing blocks while holding a device lock: in-flight slots are acquired before it, and
   compilation happens on the compiler thread (`executor/compiler.py`), never under it.
3. Workers (device queues, the compiler, step closures, loaders) never take a device lock.
   They only wait for futures of work queued *before* theirs (an input from another device,
   a compile), which never waits for them, so every wait chain ends.
4. `_qlock`, `_error_lock` and `_rng_lock` are leaves: held for a few assignments, nothing is
   acquired or awaited under them.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch

from ..base import events
from .futures import Execution, ExecutionError, Failed, Worker, typed_error

_MASK64 = (1 << 64) - 1
_MAX_PENDING_ERRORS = 64   # per device, until a barrier reports them


def _mix64(x: int) -> int:
    """splitmix64 finalizer: decorrelates (seed, counter) pairs into generator seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def run_claimed(ex: Execution, job: Callable[[], Any]) -> None:
    """Run `job`, the work of `ex` that this thread claimed, and complete `ex` with its outcome."""
    try:
        result, error = job(), None
    except BaseException as e:  # noqa: BLE001 - completes the execution, as on the worker
        result, error = None, e
    Worker._complete(ex, result, error)


#: per thread: while a blocking read schedules, the list of executions it queued on idle CPU
#: devices (`read_here.reading`): it runs them itself, or releases them to their workers
reads = threading.local()


class DeviceContext:
    """Everything ltc_async keeps per lazy device (see the module docstring)."""

    def __init__(self, index: int, backend: Any, backend_device: torch.device, threads: int,
                 max_inflight: int = 4) -> None:
        self.index = index
        self.device = torch.device("ltc", index)
        self.backend = backend
        self.backend_device = backend_device
        self.threads = threads          # intra-op threads of the worker (CPU devices)
        self.lock = threading.RLock()  # re-entrant: a barrier may hold it around a sync
        self.worker = Worker(f"ltc:{index}-worker",
                             lambda: backend.worker_init(backend_device, threads))
        self._live: dict[int, weakref.ref] = {}
        self._purge_at = 4096
        self._private: set[int] = set()   # threads tracing privately (`private_tracing`)
        self.seed = torch.initial_seed()
        self._rng_counter = 0
        self._rng_lock = threading.Lock()
        # queue state, guarded by _qlock
        self._qlock = threading.Lock()
        self._reserved: Execution | None = None   # queued by a reader to run itself (`read_here.py`)
        self._seq = 0                   # seq of the newest queued execution
        self._inflight: collections.deque[Execution] = collections.deque()
        self._last: Execution | None = None
        self.max_inflight = max(1, max_inflight)
        self._slots = threading.Semaphore(self.max_inflight)
        self._errors: list[ExecutionError] = []
        self._dropped = 0
        # the newest seq a barrier has covered: those executions have finished and their errors
        # were taken (`raise_errors`); values they made may be read without a barrier
        # (`tensor/host_compute.py`).  A plain attribute: two barriers racing to raise it may
        # leave the lower value, and a reader may see an older one -- either way a read then
        # takes the barrier it would have taken anyway, never a wrong value
        self.covered_upto = 0
        self._error_lock = threading.Lock()
        # `graph_executor.before_backward`: the seq of the newest execution queued when the
        # last backward pass over this device's tensors began (None before the first), and
        # whether a host read has since read a value computed after it.  Plain attributes: a
        # racing read and backward only move one cut, never change a value
        self.backward_seq: int | None = None
        self.read_since_backward = False

    def __repr__(self) -> str:
        return f"ltc:{self.index}"

    # -- live tensors ---------------------------------------------------------------------
    def register(self, t: Any) -> None:
        if self._private and threading.get_ident() in self._private:
            return                      # traced privately: no cut sees it (`private_tracing`)
        # A plain weak reference, no callback: a callback is a Python call when each
        # intermediate tensor dies (most die before `mark_step`).  Dead entries are dropped by
        # `live_tensors` / `has_pending` and, so that a loop that never syncs stays bounded,
        # whenever the registry has doubled since the last purge.
        k = t._id                       # the tensor's creation serial (`make_tensor`)
        live = self._live
        live[k] = weakref.ref(t)
        if len(live) > self._purge_at:
            self._purge()

    def _purge(self) -> None:
        live = self._live
        for k, r in list(live.items()):
            if r() is None:
                live.pop(k, None)
        self._purge_at = max(4096, 2 * len(live))

    @contextlib.contextmanager
    def private_tracing(self) -> Iterator[None]:
        """Tensors the calling thread makes on this device inside are not live tensors: no
        `mark_step` and no other thread's cut takes their IR.  `torch.compile`'s capture traces
        a graph once on placeholder data (`compile/capture.py`); a concurrent `mark_step` on the
        same device must neither run that graph on the placeholders nor turn the recording's
        tensors into data under it.  Random ops traced privately do not advance the device's
        generator (`next_seed`).  The set is changed only by its own thread (a thread id is
        added and removed around its recording); `register` reads it."""
        me = threading.get_ident()
        if me in self._private:         # nested (a capture inside a capture): the outer ends it
            yield
            return
        self._private.add(me)
        try:
            yield
        finally:
            self._private.discard(me)

    def unregister(self, t: Any) -> None:
        self._live.pop(t._id, None)

    def rebind(self, t: Any, value: tuple) -> None:
        """The one writer of an existing lazy tensor's value `t._v` (a `(Node, index)` pair):
        under the device lock, so a concurrent `mark_step` never reads a half-updated tensor,
        loses the update or unregisters a tensor that holds pending IR again."""
        with self.lock:
            t._v = value
            if value[0].is_data:
                self._live.pop(t._id, None)
            elif t._id not in self._live:
                self.register(t)

    def _pending(self) -> Iterator[Any]:
        """Live tensors holding pending IR, oldest first; drops dead entries on the way."""
        live = self._live
        for k, r in live.copy().items():
            t = r()
            if t is None:
                live.pop(k, None)
            elif not t._v[0].is_data:
                yield t

    def live_tensors(self) -> list[Any]:
        """Tensors with pending IR, oldest first (a stable order keeps graph keys stable)."""
        return list(self._pending())

    def has_pending(self) -> bool:
        """Does any live tensor hold pending IR?  (`live_tensors()` without building a list.)"""
        return next(self._pending(), None) is not None

    def live_count(self) -> int:
        self._purge()
        return len(self._live)

    # -- RNG ------------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        self.set_rng_state(int(seed), 0)

    def next_seed(self) -> int:
        if self._private and threading.get_ident() in self._private:
            # a private recording's draws are placeholders (a captured body draws afresh at
            # each call): they do not advance the generator other threads draw from
            return _mix64((self.seed & _MASK64) * 0x100000001B3 + self._rng_counter)
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

    # -- the queue ------------------------------------------------------------------------
    def try_acquire_slot(self) -> bool:
        return self._slots.acquire(blocking=False)

    def acquire_slot(self) -> None:
        """Block until fewer than `max_inflight` executions are queued (never call this while
        holding a device lock)."""
        self._slots.acquire()

    def release_slot(self) -> None:
        self._slots.release()

    def oldest(self) -> Execution | None:
        """The oldest execution still queued or running (what a full queue waits for)."""
        with self._qlock:
            return self._inflight[0] if self._inflight else None

    @property
    def last(self) -> Execution | None:
        """The newest queued execution (done when everything queued so far is done)."""
        return self._last

    def submit(self, fn: Callable[[Execution], Any], label: str, slot: bool) -> Execution:
        """Queue `fn(execution)` (its return value is the execution's list of outputs).  With
        `slot`, the caller holds an in-flight slot, which the worker gives back when the work
        ends."""
        reserving = getattr(reads, "reserved", None)
        with self._qlock:
            self._seq += 1
            ex = Execution(label, self, self._seq)
            reserve = reserving is not None and not self._inflight and self.backend_device.type == "cpu"
            if reserve:                     # the device is idle: the reader that queues it runs it
                ex.reserved = True
                self._reserved = ex
            self._inflight.append(ex)
            self._last = ex
        if events.execution_job.on:   # the timeline, the profiler
            fn = events.execution_job.wrap(fn, ex)
        ex.job = job = lambda: self._run(fn, ex, slot)
        if reserve:   # not queued: run by its reader, or queued when released (`release`)
            reserving.append(ex)
            return ex
        return self.worker.submit(job, ex)

    def release(self, ex: Execution) -> None:
        """A reserved execution its reader will not run: queued for the worker.  A later item
        the worker reached first has run it already (`_run`); then its queue entry is skipped."""
        job = ex.job
        ex.unreserve()
        if job is not None:
            self.worker.submit(job, ex)

    def _run(self, fn: Callable[[Execution], Any], ex: Execution, slot: bool) -> Any:
        """Worker side (or a reader's, `read_here.py`): the error is recorded and the slot freed
        *before* the future completes, so whoever wakes up on it sees both."""
        ex.job = None
        before = self._reserved
        if before is not None and before is not ex:
            # queued after an execution a reader reserved (`read_here.py`): that one first,
            # run here if the reader released it, else waited for
            before.wait_decided()
            job = before.job
            if job is not None and before.claim():
                run_claimed(before, job)
            before.wait()
        try:
            try:
                outs = fn(ex)
            except BaseException as e:  # noqa: BLE001 - recorded, then re-raised into the future
                self._record_error(ex, Failed(e, "execution"))
                raise
            if ex.failure is not None:   # some outputs could not be computed (see _execute)
                self._record_error(ex, ex.failure)
            return outs
        finally:
            with self._qlock:
                if self._inflight and self._inflight[0] is ex:
                    self._inflight.popleft()
                else:
                    self._inflight.remove(ex)
                if self._reserved is ex:
                    self._reserved = None
            if slot:
                self._slots.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until everything queued so far has run, kernels included (errors are not
        raised here); False on timeout."""
        f = self._last
        return True if f is None else f.wait(timeout)

    # -- errors ---------------------------------------------------------------------------
    def _record_error(self, ex: Execution, failed: Failed) -> None:
        """One `ExecutionError` for execution `ex`, naming its own failure, or the failed input
        it could not do without (`upstream`)."""
        if failed.ctx is None:
            failed.ctx, failed.label = self, ex.label
        if failed.ctx is self and failed.label == ex.label:
            text = (f"execution on {self.device} of the graph scheduled at {ex.label} failed: "
                    f"{failed.where}: {type(failed.error).__name__}: {failed.error}")
            upstream = None
        else:
            upstream = f"the graph scheduled at {failed.label} on {failed.ctx}"
            text = (f"execution on {self.device} of the graph scheduled at {ex.label} could not "
                    f"compute some outputs: their input from {upstream} had failed (reported "
                    f"separately): {type(failed.error).__name__}: {failed.error}")
        err = typed_error(ExecutionError, failed.error, text)
        err.__cause__ = failed.error
        err.upstream = upstream
        err.seq = ex.seq
        err.device = self.device
        err.errors = [err]
        with self._error_lock:
            self._errors.append(err)
            if len(self._errors) > _MAX_PENDING_ERRORS:  # nobody is looking: keep memory flat
                self._dropped += 1
                del self._errors[0]

    def take_errors(self, upto: int | None = None) -> tuple[list[ExecutionError], int]:
        """Remove and return the pending errors of executions with `seq <= upto` (all: None),
        and how many older ones were dropped unreported (more than `_MAX_PENDING_ERRORS`)."""
        with self._error_lock:
            if not self._errors:
                return [], 0
            if upto is None:
                taken, self._errors = self._errors, []
            else:
                taken = [e for e in self._errors if e.seq <= upto]
                self._errors = [e for e in self._errors if e.seq > upto]
            dropped, self._dropped = (self._dropped, 0) if taken else (0, self._dropped)
            return taken, dropped

    def discard_error(self, seq: int) -> None:
        """Forget the pending error of execution `seq`: a read just reported it."""
        with self._error_lock:
            self._errors = [e for e in self._errors if e.seq != seq]



def raise_errors(covered: Sequence[tuple[DeviceContext, int | None]]) -> None:
    """Raise (once) the pending errors a barrier covers: for each `(ctx, upto)`, the failed
    executions on `ctx` with `seq <= upto` (all when None).  Several become one
    `ExecutionError` listing them all in `.errors`, in device and queue order."""
    taken: list[ExecutionError] = []
    dropped = 0
    for ctx, upto in covered:
        ctx.covered_upto = max(ctx.covered_upto, ctx._seq if upto is None else upto)
        errors, n = ctx.take_errors(upto)
        taken.extend(errors)
        dropped += n
    if not taken:
        return
    if len(taken) == 1 and not dropped:
        raise taken[0]
    first = taken[0]
    more = "\n".join(f"  - {e}" for e in taken[1:])
    lost = f"\n(and {dropped} earlier failures not kept: no barrier ran)" if dropped else ""
    err = typed_error(ExecutionError, first.__cause__, f"{len(taken) + dropped} executions failed; "
                      f"the first: {first}\nand {len(taken) - 1} more:\n{more}{lost}")
    err.__cause__ = first.__cause__
    err.upstream, err.seq, err.device = first.upstream, first.seq, first.device
    err.errors = taken
    raise err


@contextlib.contextmanager
def lock_devices(ctxs: Sequence[DeviceContext]) -> Iterator[None]:
    """Hold several devices' lockers, always taken in index order (no lock-order deadlock)."""
    ordered = sorted({c.index: c for c in ctxs}.values(), key=lambda c: c.index)
    with contextlib.ExitStack() as stack:
        for c in ordered:
            stack.enter_context(c.lock)
        yield


