"""trio twins of the blocking API.

Design note.  A device worker completing a `Future` calls back on its own thread; the callback
only does `trio_token.run_sync_soon(reschedule)`, so the event loop is woken through its token:
no thread is parked per await and nothing polls.  Cancellation (a trio cancel scope) aborts the
wait immediately; the execution itself continues and its results stay valid for later syncs.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
import trio

from . import api
from .executor import arena
from .executor import graph_executor as gx
from .executor.futures import Future


async def wait_future(f: Future) -> None:
    """Sleep (without blocking the event loop) until `f` completes.  Never raises its error."""
    if f.done():
        await trio.lowlevel.checkpoint()
        return
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()
    aborted = False

    def wake() -> None:
        if not aborted:
            trio.lowlevel.reschedule(task)

    def on_done(_f: Future) -> None:
        try:
            token.run_sync_soon(wake)
        except trio.RunFinishedError:
            pass

    def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
        nonlocal aborted
        aborted = True
        return trio.lowlevel.Abort.SUCCEEDED

    f.add_done_callback(on_done)
    await trio.lowlevel.wait_task_rescheduled(abort)


async def mark_step_async(device: Any = None) -> None:
    """`mark_step` for trio: returns once the step is scheduled.  If a device already has the
    maximum number of executions queued, waits (cancellably) for it to drain first."""
    for ctx in arena.resolve(device):
        while ctx.inflight._value <= 0 and ctx.last is not None and not ctx.last.done():
            await wait_future(ctx.last)
    api.mark_step(device)
    await trio.lowlevel.checkpoint()


async def wait_device_ops_async(devices: Any = None) -> None:
    """`wait_device_ops` for trio.  Cancelling returns at once; executions keep running and a
    captured error stays pending for the next barrier."""
    ctxs = arena.resolve(devices)
    for ctx in ctxs:
        f = ctx.last
        if f is not None:
            await wait_future(f)
            if f.marker is not None:  # CUDA kernels still running: wait in a thread
                await trio.to_thread.run_sync(ctx.backend.wait_marker, f.marker, abandon_on_cancel=True)
    await trio.to_thread.run_sync(api._closures.drain) if api._closures._outstanding else None
    gx.wait_device_ops(ctxs)  # everything is complete: only re-raises a captured error
    api._closures.check()


async def sync_async(tensors: Sequence[torch.Tensor]) -> None:
    """`sync` for trio: schedule these tensors and wait for exactly their executions."""
    inner = api._inner_list(tensors)
    for f in api._schedule(inner):
        await wait_future(f)
    gx.materialize(inner)


async def to_cpu_async(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """`to_cpu` for trio: host copies, awaiting only the executions these tensors need."""
    tensors = list(tensors)
    await sync_async(tensors)
    return [t.to("cpu") for t in tensors]
