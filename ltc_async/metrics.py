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
    metrics_snapshot,
)
from .base.counters import reset as _reset_counters
from .diagnostics import findings as _findings

__all__ = ["counter_names", "counter_value", "metric_names", "metric_data", "reset", "report",
           "compiles_by_shape", "findings", "activity_window", "ALWAYS_PRESENT",
           "COMPILE_SHAPES_PREFIX"]


def reset() -> None:
    """Forget all counters, metrics and the findings' records."""
    _reset_counters()


def findings() -> list:
    """What the metrics suggest changing: a list of `Finding`s (`kind`, `title`, `details`,
    `fix`), the same as the end of `report()`."""
    return _findings.findings()


def report() -> str:
    """A human-readable summary of every metric and counter, ending with findings: eager
    fallbacks by op and user line, recompiles by call site, syncs per step, devices idle while
    the host traces, each with what to change."""
    lines = []
    for name, count, total, samples in metrics_snapshot():
        med = samples[len(samples) // 2] if samples else 0.0
        lines.append(f"Metric: {name}\n  TotalSamples: {count}\n  Accumulator: {fmt_time(total)}\n"
                     f"  Median (recent): {fmt_time(med)}")
    for name in counter_names():
        lines.append(f"Counter: {name}\n  Value: {counter_value(name) or 0}")
    return "\n".join(lines) + ("\n" if lines else "") + _findings.render()
