"""trio twins of the blocking API.

Design note.  They run the same executor code as the blocking calls, with every wait turned
into an await on the same futures (`executor/futures.py: wait_async`): a device worker
completing an execution calls `trio_token.run_sync_soon`, which wakes the task through the
event loop's token, so no thread is parked per await and nothing polls.  Nothing here blocks
the event loop: scheduling never compiles (the compiler thread does), a full device queue is
awaited (its oldest execution), and step closures run after their step's executions are
awaited.  Cancelling (a trio cancel scope) returns at once; the executions go on and their
results stay valid for later syncs.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from . import api
from .diagnostics import hooks as _dx
from .executor import arena
from .executor import graph_executor as gx
from .executor.futures import wait_async

__all__ = ["mark_step_async", "wait_device_ops_async", "sync_async", "to_cpu_async"]


async def mark_step_async(device: Any = None) -> None:
    """`mark_step` for trio: returns once the step is queued (a full queue is awaited)."""
    ctxs = arena.resolve(device)
    if _dx.on:   # diagnostics: the timeline's step numbers, time waiting for a queue slot
        _dx.step_begins()
    executions = await gx.mark_step_async(ctxs)
    if _dx.on:   # diagnostics: the timeline's step numbers
        _dx.step_done(ctxs)
    sync_closures = api._closures.after_step(executions)
    if sync_closures:
        await wait_async(executions)
        api._run_all(sync_closures)
    api._closures.check()


async def wait_device_ops_async(devices: Any = None) -> None:
    """`wait_device_ops` for trio.  Cancelling returns at once; executions keep running and a
    captured error stays pending for the next barrier."""
    ctxs = arena.resolve(devices)
    await api._closures.drain_async()
    await gx.wait_device_ops_async(ctxs)
    api._closures.check()


async def sync_async(tensors: Sequence[torch.Tensor]) -> None:
    """`sync` for trio: schedule these tensors and await exactly their executions."""
    await gx.materialize_async(api._inner_list(tensors))


async def to_cpu_async(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """`to_cpu` for trio: host copies, awaiting only the executions these tensors need."""
    tensors = list(tensors)
    await sync_async(tensors)
    return [t.to("cpu") for t in tensors]
