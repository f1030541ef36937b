"""Diagnostics beyond torch._lazy: why a step recompiles, where it syncs, where its time goes.

* `recompiles.py`: `ltc.debug.explain_recompiles` -- each graph-cache miss at a call site after
  its first names the closest cached graph and the first difference (`ltc.RecompileWarning`);
* `sync_guard.py`: `ltc.sync_guard` -- implicit device-to-host syncs warn or raise;
* `timeline.py`: `ltc.debug.timeline` -- spans per device (trace, compile, queue, execute,
  transfer) as a Chrome trace and a per-step summary; `torch.profiler` ranges;
* `findings.py`: what `ltc.metrics.report()` concludes, each finding with its fix;
* `hooks.py`: the few calls the executor makes into all of this (one flag, zero cost when off);
* `location.py`: the user's `file:line` of an event.
"""
