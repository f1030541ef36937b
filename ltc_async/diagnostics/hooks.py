"""The calls the executor makes into the diagnostics: one flag, a few cheap calls.

Design note.  Diagnostics must cost nothing when off, so the executor's hot paths test one
module attribute, `on` (True while recompile explanations are on or a timeline is open), and
the two closures handed to other threads are wrapped only when it is set or the PyTorch
profiler runs (`torch.autograd.profiler._is_profiler_enabled`, a plain Python bool).  All
per graph, none per traced op: tracing itself has no hook at all.  The slow paths call
unconditionally: an eager fallback or an implicit read waits for the device anyway, and a cache
miss compiles, so recording their user line for the findings costs nothing that matters.

Where the executor calls (thread; lock held):

* `compiler.prepare` -- `prepare_job(job, ctx, label, fut)` (user thread; device lock):
  wraps the prepare job (timeline, profiler) and notes the future (recompile warnings);
* `compiler._prepare` -- `looked_up(ctx, plan, label, hit)` after the cache lookup, on a miss
  or when `on` (compiler thread): findings, recompile explanations, the timeline's hit flag;
* `device.DeviceContext.submit` -- `execution_job(fn, ex)` (user thread; device lock): wraps
  the worker's closure (timeline, profiler);
* `graph_executor.schedule` / `schedule_async` -- `scheduled()` / `await scheduled_async()`
  when it returns (user thread; no lock): recompile warnings at the user's line;
* `graph_executor.needed` / `collect` -- `read_begins()` / `read_ends(tensors)` around a host
  read's wait and copy (user thread; no lock);
* `api.mark_step` / `aio.mark_step_async` -- `step_begins()` / `step_done(ctxs)` on entry and
  after the cut (user thread; no lock);
* `host.host_op` / `host.eager_fallback` -- `host_read(func)` / `fallback(name, args)`, always
  (user thread; no lock): findings and the sync guard.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.autograd import profiler

from .._config import config
from . import findings, location, recompiles, sync_guard, timeline

__all__ = ["on", "profiler"]

#: True while recompile explanations are on or a timeline is open (the executor tests it)
on = False


def refresh() -> None:
    global on
    on = recompiles.enabled or timeline.any_open()


def prepare_job(job: Callable[[], Any], ctx: Any, label: str, fut: Any) -> Callable[[], Any]:
    if recompiles.enabled:
        recompiles.track(fut)
    if timeline.any_open() or profiler._is_profiler_enabled:
        return timeline.compile_job(job, ctx, label)
    return job


def looked_up(ctx: Any, plan: Any, label: str, hit: bool) -> None:
    if not hit:
        findings.compiled(label, str(ctx.device))
    if on:
        timeline.looked_up(hit)
        if recompiles.enabled:
            recompiles.looked_up(ctx, plan, label, hit)


def execution_job(fn: Callable[[Any], Any], ex: Any) -> Callable[[Any], Any]:
    if timeline.any_open() or profiler._is_profiler_enabled:
        return timeline.execution_job(fn, ex)
    return fn


def scheduled() -> None:
    if recompiles.enabled:
        recompiles.emit()


async def scheduled_async() -> None:
    if recompiles.enabled:
        await recompiles.emit_async()


def read_begins() -> None:
    timeline.read_begins()


def read_ends(tensors: Any) -> None:
    timeline.read_ends(tensors)


def step_begins() -> None:
    timeline.step_begins()


def step_done(ctxs: Any) -> None:
    timeline.step_done(ctxs)


_SCALAR_READ = ".item() / bool(t) / float(t) / int(t) (a tensor's Python value)"


def host_read(func: Any) -> None:
    """`host.host_op`: an op returning a Python value is about to read device data."""
    if sync_guard.inside_method():
        return
    name = str(func)
    what = _SCALAR_READ if name == "aten._local_scalar_dense.default" else f"torch op {name}"
    sync_guard.implicit(what)


def fallback(name: str, args: Any) -> None:
    """`host.eager_fallback`: op `name` runs eagerly on `args` (its bound arguments)."""
    where = location.describe(location.user_frame())
    name = name if "::" in name else f"aten::{name}"
    findings.fallback(name, where)
    if not sync_guard.inside_method() and _reads_lazy(args):
        sync_guard.implicit(f"eager fallback of {name} (reads device data)")


def _reads_lazy(args: Any) -> bool:
    from ..tensor.lazy_tensor import LtcTensor
    for a in args:
        if type(a) is LtcTensor:
            return True
        if type(a) in (list, tuple) and any(type(e) is LtcTensor for e in a):
            return True
    return False


refresh()
if config.explain_recompiles:   # LTC_ASYNC_EXPLAIN_RECOMPILES=1
    recompiles.enable(True)
