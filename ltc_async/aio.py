"""trio twins of the blocking API.

Design note.  Each is the same body as its blocking twin (`executor/steps.py`, a generator of
waits), driven by an awaiting runner instead of a blocking one (`executor/futures.py: twin`):
a device worker completing an execution calls `trio_token.run_sync_soon`, which wakes the task
through the event loop's token, so no thread is parked per await and nothing polls.  Nothing
here blocks the event loop: scheduling never compiles (the compiler thread does), a full device
queue is awaited (its oldest execution), and step closures run after their step's executions
are awaited.  Cancelling (a trio cancel scope) returns at once; the executions go on and their
results stay valid for later syncs.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from .api import inner_list
from .executor import arena, steps

__all__ = ["mark_step_async", "wait_device_ops_async", "sync_async", "to_cpu_async"]


async def mark_step_async(device: Any = None) -> None:
    """`mark_step` for trio: returns once the step is queued (a full queue is awaited)."""
    await steps.mark_step.aio(arena.resolve(device))


async def wait_device_ops_async(devices: Any = None) -> None:
    """`wait_device_ops` for trio.  Cancelling returns at once; executions keep running and a
    captured error stays pending for the next barrier."""
    await steps.wait_device_ops.aio(arena.resolve(devices))


async def sync_async(tensors: Sequence[torch.Tensor]) -> None:
    """`sync` for trio: schedule these tensors and await exactly their executions."""
    await steps.sync.aio(inner_list(tensors))


async def to_cpu_async(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """`to_cpu` for trio: host copies, awaiting only the executions these tensors need."""
    tensors = list(tensors)
    await sync_async(tensors)
    return [t.to("cpu") for t in tensors]
