"""What `ltc.metrics.report()` concludes: findings, each with the fix (PyTorch/XLA's debug
analysis, `pt-xla-profiler`, is the model).

Design note.  The counters say *how often*; a user needs *where* and *what to change*.  The
slow paths record their user line as they happen, whether or not any diagnostic is on: an eager
fallback (by op and line), an implicit device-to-host sync (by kind and line) and a graph-cache
miss (by call site and device).  Each already costs a device wait or a compile, so the frame
walk is noise there; the hot paths (tracing, cache hits) record nothing.  `findings()` reads
these tables and the metrics into a short list:

1. eager fallbacks by op and user line;
2. recompiles by call site (plus the input shapes compiled, when several): sites that compiled
   a graph 2 or more `mark_step`s after their first (the first steps of a training loop
   differ legitimately: optimizer state appears), or more than 3 graphs;
3. host syncs per step (implicit ones by line, explicit reads per step);
4. devices idle while the host traces (the `ExecuteTime` samples against the time between the
   first and the last execution).

Thresholds are deliberately low: a finding is a hint with numbers, not a verdict.  The tables
are bounded (`_MAX_KEYS` entries each; the rest is counted under one "(other lines)" entry) and
cleared by `ltc.metrics.reset()`.  `_lock` guards them; it is a leaf lock.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from ..base import counters, events
from ..executor import arena
from . import location

__all__ = ["Finding", "findings", "render"]

_MAX_KEYS = 512
_OTHER = ("(other)", "(other lines)")
_lock = threading.Lock()
_fallbacks: dict[tuple[str, str], int] = {}   # (op, user line) -> count
_syncs: dict[tuple[str, str], int] = {}       # (what, user line) -> count
# (call site, device) -> [graph-cache misses, MarkStep count at the first, misses 2+ steps later]
_compiles: dict[tuple[str, str], list[int]] = {}
_WARMUP_STEPS = 2   # a training loop's first steps legitimately differ (optimizer state appears)


class Finding(NamedTuple):
    """One conclusion of `ltc.metrics.report()`: what was seen, where, and what to do."""

    kind: str            # "fallback", "recompile", "sync", "idle"
    title: str           # one line with the numbers
    details: list[str]   # where (op / call site / line), most frequent first
    fix: str             # what to change

    def __str__(self) -> str:
        lines = [self.title] + [f"    {d}" for d in self.details] + [f"  Fix: {self.fix}"]
        return "\n".join(lines)


def _bump(table: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
    with _lock:
        if key not in table and len(table) >= _MAX_KEYS:
            key = _OTHER
        table[key] = table.get(key, 0) + 1


def qualified(name: str) -> str:
    return name if "::" in name else f"aten::{name}"


@events.fallback.subscribe
def _fallback(name: str, _args: Any) -> None:
    fallback(qualified(name), location.describe(location.user_frame()))


def fallback(op: str, where: str) -> None:
    _bump(_fallbacks, (op, where))


def synced(what: str, where: str) -> None:
    _bump(_syncs, (what, where))


_scheduled_at = threading.local()   # compiler thread: the `mark_step` count of the job it runs


@events.prepare_job.subscribe
def _note_step(job: Callable[[], Any], _ctx: Any, _label: str, _fut: Any) -> Callable[[], Any]:
    """Remember the `mark_step` count when the graph was scheduled (user thread): the compiler
    thread looks the graph up later, often after the program's next `mark_step`s, and a miss
    counts against the step that scheduled it, not the step the compiler got to."""
    step = counters._counters.get("MarkStep", 0)

    def run() -> Any:
        _scheduled_at.step = step
        try:
            return job()
        finally:
            _scheduled_at.step = None
    return run


@events.looked_up.subscribe
def _looked_up(ctx: Any, plan: Any, label: str, hit: bool) -> None:
    if not hit:
        compiled(label, str(ctx.device), getattr(_scheduled_at, "step", None))


def compiled(label: str, device: str, step: int | None = None) -> None:
    if step is None:
        step = counters._counters.get("MarkStep", 0)
    key = (label, device)
    with _lock:
        entry = _compiles.get(key)
        if entry is None:
            if len(_compiles) >= _MAX_KEYS:
                return
            _compiles[key] = [1, step, 0]
        else:
            entry[0] += 1
            if step - entry[1] >= _WARMUP_STEPS:
                entry[2] += 1


@events.counters_reset.subscribe
def reset() -> None:
    with _lock:
        _fallbacks.clear()
        _syncs.clear()
        _compiles.clear()


def _top(table: dict[tuple[str, str], int], n: int = 5) -> list[tuple[tuple[str, str], int]]:
    with _lock:
        items = list(table.items())
    return sorted(items, key=lambda kv: -kv[1])[:n]


def _more(table: dict, shown: int) -> list[str]:
    rest = len(table) - shown
    return [f"... and {rest} more"] if rest > 0 else []


def findings() -> list[Finding]:
    """The findings for the activity since the last `ltc.metrics.reset()`."""
    out: list[Finding] = []
    steps = counters.counter_value("MarkStep") or 0

    n_fallback = sum(_fallbacks.values())
    if n_fallback:
        top = _top(_fallbacks)
        out.append(Finding(
            "fallback",
            f"Eager fallbacks: {n_fallback} op call(s) ran eagerly instead of in the graph "
            f"({_per_step(n_fallback, steps)}); each one that reads device data first waits "
            f"for the device and splits the step's graph.",
            [f"{op} x{c} at {where}" for (op, where), c in top] + _more(_fallbacks, len(top)),
            "replace the op with one that lowers (a mask or torch.where instead of nonzero / "
            "boolean indexing, fixed sizes instead of data-dependent ones; "
            "devices/torchscript/ops.yaml lists what compiles), or move it out of the step."))

    with _lock:
        recompiled = {k: list(v) for k, v in _compiles.items() if v[2] or v[0] > 3}
    if recompiled:
        top = sorted(recompiled.items(), key=lambda kv: (-kv[1][2], -kv[1][0]))[:5]
        details = [f"{label} on {dev}: {c} graphs, {late} of them after its first "
                   f"{_WARMUP_STEPS} steps" for (label, dev), (c, _, late) in top]
        details += _more(recompiled, len(top))
        shapes = counters.compiles_by_shape()
        if len(shapes) > 1:
            details.append("input shapes compiled: " + "; ".join(
                f"{s} x{c}" for s, c in sorted(shapes.items(), key=lambda kv: -kv[1])[:6]))
        compile_s = (counters.metric_data("CompileTime") or (0, 0.0, []))[1]
        out.append(Finding(
            "recompile",
            f"Recompiles: {sum(v[0] - 1 for v in recompiled.values())} new graph(s) at call "
            f"sites that had compiled before, {sum(v[2] for v in recompiled.values())} after "
            f"warm-up ({counters.fmt_time(compile_s)} compiling in all).",
            details,
            "run with ltc.debug.explain_recompiles(True) (or LTC_ASYNC_EXPLAIN_RECOMPILES=1): "
            "each recompile then names its first difference. Usual causes: a smaller last "
            "batch (drop_last=True, or pad it), a Python number baked in as a constant (keep "
            "it fixed or pass a tensor), a changing dtype, data-dependent branches."))

    n_sync = sum(_syncs.values())
    reads = counters.counter_value("TensorToHost") or 0
    if n_sync:
        top = _top(_syncs)
        out.append(Finding(
            "sync",
            f"Implicit syncs: {n_sync} device-to-host read(s) the program did not ask for "
            f"explicitly ({_per_step(n_sync, steps)}); each waits for the device, so tracing "
            f"and execution stop overlapping.",
            [f"{what} x{c} at {where}" for (what, where), c in top] + _more(_syncs, len(top)),
            "keep values on the device (torch.where instead of `if t:`), read them every N "
            "steps or in ltc.add_step_closure(fn, run_async=True); ltc.sync_guard('warn') or "
            "('raise') points at each one."))
    elif steps >= 3 and reads >= steps:
        out.append(Finding(
            "sync",
            f"Host reads: {reads} explicit read(s) (.cpu(), print, .tolist()) over {steps} "
            f"steps ({_per_step(reads, steps)}); each waits for its step to finish.",
            [],
            "read every N steps, or in ltc.add_step_closure(fn, run_async=True)."))

    idle = _idle_finding(steps)
    if idle is not None:
        out.append(idle)
    return out


def _per_step(n: int, steps: int) -> str:
    return f"{n / steps:.1f} per step over {steps} mark_step(s)" if steps else "no mark_step yet"


def _idle_finding(steps: int) -> Finding | None:
    span = counters.activity_window("ExecuteTime")
    data = counters.metric_data("ExecuteTime")
    if span is None or data is None or steps < 3:
        return None
    window = span[1] - span[0]
    if window < 0.02:
        return None
    used = sum(1 for c in arena.started() if c._seq) or 1
    busy = data[1] / (window * used)
    if busy >= 0.5:
        return None
    trace = counters.metric_data("SyncTensorsGraph")
    return Finding(
        "idle",
        f"Devices idle: busy {busy:.0%} of the {window:.2f}s between the first and the last "
        f"execution ({data[0]} executions on {used} device(s), {data[1] / data[0] * 1e3:.2f}ms "
        f"each): the device waits for the host.",
        [f"{steps} mark_step(s); cutting graphs took {trace[1] * 1e3:.1f}ms in all"] if trace else [],
        "find where the host's time goes with ltc.debug.timeline(); trace less Python per step "
        "(torch.compile(model, backend='ltc') captures once), remove syncs (see above), load "
        "inputs ahead with ltc_async.data.DeviceLoader, or give the device more work per step "
        "(a larger batch).")


def render() -> str:
    """The findings as text (the end of `ltc.metrics.report()`)."""
    found = findings()
    if not found:
        return "Findings: none (no eager fallbacks, recompiles, implicit syncs or idle devices seen)\n"
    lines = [f"Findings ({len(found)}):"]
    for i, f in enumerate(found, 1):
        lines.append(f"{i}. {f}")
    return "\n".join(lines) + "\n"
