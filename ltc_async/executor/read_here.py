"""A blocking read runs the graph it waits for on its own thread, when the device is idle.

Design note.  A host read (`.item()`, `bool(t)`, `.cpu()`, a data-dependent size) cuts a graph
and blocks until it has run.  Queued to the device worker, that costs two thread hand-offs on
top of the execution: the worker waking up to the queued item (~0.07 ms here) and the reader
waking up once it is done (~0.19 ms: the futex wake, then the GIL).  A token of a tiny Llama's
`generate()` paid both at every stopping-criteria read: ~0.27 of its 1.35 ms read.  LTC's C++
executor runs such syncs on the calling thread; here the reader does so too, but only when
nothing else could run meanwhile:

* the execution is the device's next one: every execution queued before it has finished when
  the read queues it (the device would idle while the reader waited).  It is then *reserved*
  for the reader (`reading`, `DeviceContext.submit`) and not put on the worker's queue: a
  worker woken for it ran Python beside the reader for nothing, costing the reader the GIL
  (measured: a small read-step 198-203 us queued, 169-180 us reserved, 237-247 us queued and
  then taken from the queue by the reader).  The reader either claims it (`Execution.claim`)
  and runs it, or releases it to the worker's queue (`DeviceContext.release`: a read that
  turned out to need several devices' executions, or an exception on the way).  An item
  queued on the device after a reserved one waits, on the worker, for the reader's decision
  and then for the reserved execution (running it itself if it was released first), so the
  device's executions still run one at a time, in queue order.  The reservation is made when
  the execution is queued, before the reader looks its graph up (`compiler.prepare`'s `later`);
* CPU-backed devices only (a CUDA worker launches kernels and returns; the read then waits
  for their event anyway), and with no Python dispatch mode active on the reading thread (a
  user's mode would see the backend's ops).

What the reading thread brings with it is set aside while it runs the graph: its number of
intra-op threads becomes the worker's (a reduction split another way rounds another way;
OpenMP's and MKL's settings are per thread; PyTorch's own record of the count, which only
threads initialized meanwhile read, is global); its dispatch key state (a read from inside
functionalization's kernel excludes that key; autocast, inference mode) becomes a fresh
thread's, as on the worker; and on the main thread, a Ctrl-C arriving
meanwhile is held until the graph has run and then raised, so it interrupts the read, as it
does when the read waits, never the execution half-way (its outputs would become `Failed`:
queued work lost).  Everything else -- errors recorded for the next barrier, the in-flight
slot given back, the tier trial's timing -- is the worker's own code (`DeviceContext._run`),
run on this thread.
"""
from __future__ import annotations

import _signal
import contextlib
import signal
import threading
from typing import Any, Iterator, Sequence

import torch

from ..base import counters
from ..base.config import config
from .device import reads, run_claimed
from .futures import Execution, wait_all

_fresh: tuple[Any, Any] | None = None
_SIGINT = int(signal.SIGINT)


def _fresh_tls() -> tuple[Any, Any]:
    """The dispatch key sets (included, excluded) of a fresh thread: the worker's."""
    global _fresh
    if _fresh is None:
        seen: list = []

        def look() -> None:
            seen.append((torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()))
        t = threading.Thread(target=look, name="ltc-tls-probe")
        t.start()
        t.join()
        _fresh = seen[0]
    return _fresh


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """On the main thread: a SIGINT arriving inside is delivered to the program's own handler
    once the block has finished.  (`_signal`, the C module under `signal`: `signal.signal`
    converts handlers to enums, ~8 us a read.)"""
    if threading.current_thread() is not threading.main_thread():   # (after a fork: the forking thread)
        yield
        return
    previous = _signal.getsignal(_SIGINT)
    if not callable(previous):   # ignored, or the OS default: nothing Python would raise
        yield
        return
    held: list = []
    _signal.signal(_SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        _signal.signal(_SIGINT, previous)
        if held:
            previous(_SIGINT, held[0])


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """Around a blocking read: the executions it queues on idle CPU devices are reserved for
    this thread (the worker waits for them), run here by `run_or_wait`, and any left over --
    not needed by the read, or an exception on the way -- released to their workers."""
    outer = getattr(reads, "reserved", None)
    if outer is not None:
        # a read inside a read (a finalizer or a diagnostics hook run while the outer one
        # prepares): what the outer one reserved goes to the workers now, or the worker would
        # wait for the outer read while the outer read waits inside the inner one
        for ex in outer:
            if ex.reserved:
                ex.ctx.release(ex)
        yield
        return
    if not config.read_here or torch._C._len_torch_dispatch_stack():
        yield
        return
    reads.reserved = reserved = []
    try:
        yield
    finally:
        reads.reserved = None
        for ex in reserved:
            if ex.reserved:
                ex.ctx.release(ex)


def run_or_wait(futures: Sequence[Any]) -> None:
    """Wait for `futures` (`futures.wait_all`), first running here the execution this thread
    reserved if the read needs just that one.  Every other reservation of this thread is
    released before any wait (a read of several devices' executions lets their workers run them
    side by side; and a wait must never depend on a reservation only this thread can end)."""
    reserved = getattr(reads, "reserved", None) or ()
    target = futures[0] if len(futures) == 1 and futures[0] in reserved else None
    for ex in reserved:
        if ex is not target and ex.reserved:
            ex.ctx.release(ex)
    if target is not None and target.reserved:
        _run(target)
    wait_all(futures)


def _run(ex: Execution) -> None:
    """Claim `ex` and run it on this thread as its worker would (see the module note)."""
    ctx = ex.ctx
    job = ex.job
    if job is None or not ex.claim():
        return
    counters.counter("ExecutedOnReader")
    include, exclude = _fresh_tls()
    threads = torch.get_num_threads()
    with _ctrl_c_held():
        try:
            if threads != ctx.threads:   # this thread's own setting (OpenMP's and MKL's are per thread)
                torch.set_num_threads(ctx.threads)
            if torch.is_inference_mode_enabled():
                with torch.inference_mode(False), torch._C._ForceDispatchKeyGuard(include, exclude):
                    run_claimed(ex, job)
            else:
                with torch._C._ForceDispatchKeyGuard(include, exclude):
                    run_claimed(ex, job)
        finally:
            if threads != ctx.threads:
                torch.set_num_threads(threads)
