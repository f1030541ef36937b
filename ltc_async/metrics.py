"""Counters and timed metrics, mirroring `torch._lazy.metrics` (LTC's `metrics.cpp`).

Counters are plain integers bumped on the hot path (one dict operation, no lock: CPython's GIL
makes `d[k] = d.get(k, 0) + n` lose at most a count under contention, which is acceptable for
observability and far cheaper than a lock per traced op).  Metrics keep a count, a sum, the
most recent samples and when the first one started and the last one ended (`activity_window`).
`report()` ends with findings, each with its fix (`diagnostics/findings.py`).
"""
from __future__ import annotations

import collections
import threading
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["counter_names", "counter_value", "metric_names", "metric_data", "reset", "report",
           "counter", "timed", "compiles_by_shape", "findings", "activity_window"]

#: counters `CompileShapes::<input shapes>` count compiles per set of graph-input shapes
COMPILE_SHAPES_PREFIX = "CompileShapes::"

#: counters that always exist (value 0 until counted, also after `reset()`), as in torch._lazy
ALWAYS_PRESENT = ("MarkStep", "CachedCompile", "UncachedCompile", "DeviceDataCacheMiss",
                  "CreateLtcTensor", "DestroyLtcTensor", "EagerFallback")

_MAX_SAMPLES = 1024
_counters: dict[str, int] = {}
_metrics: dict[str, list] = {}  # name -> [count, sum, deque(samples), first start, last end]
_metrics_lock = threading.Lock()


def counter(name: str, n: int = 1) -> None:
    """Add `n` to the counter `name`."""
    _counters[name] = _counters.get(name, 0) + n


_read_hooks: list = []


def before_read(hook) -> None:
    """Run `hook()` before metrics are read (the executor waits for queued compile jobs, so
    compile counters are exact right after `mark_step`)."""
    _read_hooks.append(hook)


def _settle() -> None:
    for hook in _read_hooks:
        hook()


# Counters computed when read, not bumped on the hot path: name -> (value(), on_reset()).
# `DestroyLtcTensor` is one (tensor/lazy_tensor.py): counting each destruction would need a
# Python `__del__` on every lazy tensor, which costs more than the rest of its deallocation.
_computed: dict[str, tuple] = {}


def computed_counter(name: str, value, on_reset) -> None:
    """Register counter `name` whose value is `value()` (since the last `reset()`, which calls
    `on_reset()`), computed only when this counter is read."""
    _computed[name] = (value, on_reset)


def add_sample(name: str, value: float) -> None:
    now = time.perf_counter()
    with _metrics_lock:
        m = _metrics.get(name)
        if m is None:
            m = _metrics[name] = [0, 0.0, collections.deque(maxlen=_MAX_SAMPLES), now - value, now]
        m[0] += 1
        m[1] += value
        m[2].append(value)
        m[4] = now


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Record the wall time of the block, in seconds, as a sample of metric `name`."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        add_sample(name, time.perf_counter() - t0)


def counter_names() -> list[str]:
    _settle()
    return sorted({k for k, v in list(_counters.items()) if v} | set(ALWAYS_PRESENT))


def counter_value(name: str) -> int | None:
    """The counter's value; 0 for the `ALWAYS_PRESENT` ones, else None if it never counted."""
    _settle()
    if name in _computed:
        return _computed[name][0]()
    v = _counters.get(name)
    if v:
        return v
    return 0 if name in ALWAYS_PRESENT else None


def metric_names() -> list[str]:
    _settle()
    with _metrics_lock:
        return sorted(_metrics)


def metric_data(name: str) -> tuple[int, float, list[float]] | None:
    """(count, sum, recent samples) of a metric, in seconds for timings; None if never recorded."""
    _settle()
    with _metrics_lock:
        m = _metrics.get(name)
        return None if m is None else (m[0], m[1], list(m[2]))


def activity_window(name: str) -> tuple[float, float] | None:
    """(`time.perf_counter()` when the first sample of a timing metric started, when the last
    one ended), since the last `reset()`; None if never recorded."""
    _settle()
    with _metrics_lock:
        m = _metrics.get(name)
        return None if m is None else (m[3], m[4])


def compiles_by_shape() -> dict[str, int]:
    """Compiles per distinct set of graph-input shapes ("64x64,64" -> 1)."""
    _settle()
    n = len(COMPILE_SHAPES_PREFIX)
    return {k[n:]: v for k, v in list(_counters.items()) if k.startswith(COMPILE_SHAPES_PREFIX) and v}


def reset() -> None:
    """Forget all counters, metrics and the findings' records."""
    from .diagnostics import findings as _findings
    _settle()
    _counters.clear()
    for _value, on_reset in _computed.values():
        on_reset()
    with _metrics_lock:
        _metrics.clear()
    _findings.reset()


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f}ms"
    return f"{s * 1e6:.1f}us"


def findings() -> list:
    """What the metrics suggest changing: a list of `Finding`s (`kind`, `title`, `details`,
    `fix`), the same as the end of `report()`."""
    from .diagnostics import findings as _findings
    _settle()
    return _findings.findings()


def report() -> str:
    """A human-readable summary of every metric and counter, ending with findings: eager
    fallbacks by op and user line, recompiles by call site, syncs per step, devices idle while
    the host traces, each with what to change."""
    from .diagnostics import findings as _findings
    _settle()
    lines = []
    with _metrics_lock:
        items = [(k, v[0], v[1], sorted(v[2])) for k, v in sorted(_metrics.items())]
    for name, count, total, samples in items:
        med = samples[len(samples) // 2] if samples else 0.0
        lines.append(f"Metric: {name}\n  TotalSamples: {count}\n  Accumulator: {_fmt_time(total)}\n"
                     f"  Median (recent): {_fmt_time(med)}")
    for name in counter_names():
        value = _computed[name][0]() if name in _computed else _counters.get(name, 0)
        lines.append(f"Counter: {name}\n  Value: {value}")
    return "\n".join(lines) + ("\n" if lines else "") + _findings.render()
