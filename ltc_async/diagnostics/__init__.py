"""Diagnostics beyond torch._lazy: why a step recompiles, where it syncs, where its time goes.

Every module here is a *subscriber* to the events the core publishes (`base/events.py`); the
core never imports diagnostics.  Importing this package subscribes them (`import ltc_async`
does).

* `recompiles.py`: `ltc.debug.explain_recompiles` -- each graph-cache miss at a call site after
  its first names the closest cached graph and the first difference (`ltc.RecompileWarning`);
* `sync_guard.py`: `ltc.sync_guard` -- implicit device-to-host syncs warn or raise;
* `timeline.py`: `ltc.debug.timeline` -- spans per device (trace, compile, queue, execute,
  transfer) as a Chrome trace and a per-step summary; `torch.profiler` ranges;
* `findings.py`: what `ltc.metrics.report()` concludes, each finding with its fix;
* `location.py`: the user's `file:line` of an event.
"""
from . import findings, recompiles, sync_guard, timeline  # noqa: F401 - they subscribe at import
