"""`ltc.metrics`: counters and timed metrics, mirroring `torch._lazy.metrics`, and the report.

The core records into `base/counters.py` (plain integers and samples, cheap on the hot path);
this user-facing module reads them and ends `report()` with findings, each with its fix
(`diagnostics/findings.py`).
"""
from __future__ import annotations

from .base.counters import (
    ALWAYS_PRESENT,
    COMPILE_SHAPES_PREFIX,
    activity_window,
    compiles_by_shape,
    counter_names,
    counter_value,
    fmt_time,
    metric_data,
    metric_names,
    round_trips,
    snapshot,
)
from .base.counters import reset as _reset_counters
from .diagnostics import findings as _findings

__all__ = ["counter_names", "counter_value", "metric_names", "metric_data", "reset", "report",
           "compiles_by_shape", "findings", "activity_window", "host_round_trips", "ALWAYS_PRESENT",
           "COMPILE_SHAPES_PREFIX"]


def reset() -> None:
    """Forget all counters, metrics and the findings' records."""
    _reset_counters()


def host_round_trips(per_step: bool = True) -> dict[str, float]:
    """Why the host waited for device data since the last `reset()`: `{"<kind>::<what>": n}`,
    kind `fallback` (an op ran eagerly on device data: `fallback::index_put`), `size` (an
    output size was read: `size::nonzero`) or `read` (the program read a value:
    `read::_local_scalar_dense` for `.item()` / `bool(t)`, `read::_to_copy` for `.cpu()`).
    Per `mark_step` when `per_step` and a step ran, else counts."""
    trips = round_trips()
    steps = counter_value("MarkStep") or 0
    if per_step and steps:
        return {k: v / steps for k, v in trips.items()}
    return {k: float(v) for k, v in trips.items()}


def findings() -> list:
    """What the metrics suggest changing: a list of `Finding`s (`kind`, `title`, `details`,
    `fix`), the same as the end of `report()`."""
    return _findings.findings()


def report() -> str:
    """A human-readable summary of every metric and counter, ending with findings: eager
    fallbacks by op and user line, recompiles by call site, syncs per step, devices idle while
    the host traces, each with what to change."""
    lines = []
    metrics, values = snapshot()   # settled once (the compile queue, DestroyLtcTensor's scan)
    for name, count, total, samples in metrics:
        med = samples[len(samples) // 2] if samples else 0.0
        lines.append(f"Metric: {name}\n  TotalSamples: {count}\n  Accumulator: {fmt_time(total)}\n"
                     f"  Median (recent): {fmt_time(med)}")
    for name, value in values.items():
        lines.append(f"Counter: {name}\n  Value: {value}")
    trips = host_round_trips()
    if trips:
        unit = "per step" if counter_value("MarkStep") else "in all"
        lines.append(f"Host round trips ({unit}, by why):\n" + "\n".join(
            f"  {k}: {v:g}" for k, v in sorted(trips.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines) + ("\n" if lines else "") + _findings.render()
