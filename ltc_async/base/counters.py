"""Counters and timed metrics, recorded by the core (LTC's `metrics.cpp`); read through the
public `ltc.metrics` (`ltc_async/metrics.py`, which adds the report and its findings).

Counters are plain integers bumped on the hot path (one dict operation, no lock: CPython's GIL
makes `d[k] = d.get(k, 0) + n` lose at most a count under contention, which is acceptable for
observability and far cheaper than a lock per traced op).  Metrics keep a count, a sum, the
most recent samples and when the first one started and the last one ended (`activity_window`).
Before a read, `events.counters_read(name)` lets the core settle (the executor waits for its
queued compile jobs, so compile counters are exact right after `mark_step`) and fill counters
computed only when read (`DestroyLtcTensor`, `tensor/lazy_tensor.py`); `reset()` publishes
`events.counters_reset`.
"""
from __future__ import annotations

import collections
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from . import events

__all__ = ["counter_names", "counter_value", "metric_names", "metric_data", "reset", "counter",
           "add_sample", "timed", "compiles_by_shape", "activity_window"]

#: counters `CompileShapes::<input shapes>` count compiles per set of graph-input shapes
COMPILE_SHAPES_PREFIX = "CompileShapes::"

#: counters that always exist (value 0 until counted, also after `reset()`), as in torch._lazy
ALWAYS_PRESENT = ("MarkStep", "CachedCompile", "UncachedCompile", "DeviceDataCacheMiss",
                  "CreateLtcTensor", "DestroyLtcTensor", "EagerFallback", "TierUpCompile", "TierUpFailed",
                  "TierUpSlower")

_MAX_SAMPLES = 1024
_counters: dict[str, int] = {}
_metrics: dict[str, list] = {}  # name -> [count, sum, deque(samples), first start, last end]
_metrics_lock = threading.Lock()


def counter(name: str, n: int = 1) -> None:
    """Add `n` to the counter `name`."""
    _counters[name] = _counters.get(name, 0) + n


#: counters `HostRoundTrip::<kind>::<what>` count waits for device data on the host, by why:
#: kind "fallback" (an op ran eagerly on device data), "size" (an output size read:
#: `nonzero`, `unique`, ...) or "read" (the program read a value: `.item()`, `.cpu()`, ...)
ROUND_TRIP_PREFIX = "HostRoundTrip::"


def round_trip(kind: str, what: str) -> None:
    """Count one host round trip (see `ROUND_TRIP_PREFIX`)."""
    _counters["HostRoundTrip"] = _counters.get("HostRoundTrip", 0) + 1
    name = f"{ROUND_TRIP_PREFIX}{kind}::{what}"
    _counters[name] = _counters.get(name, 0) + 1


def round_trips() -> dict[str, int]:
    """`{"<kind>::<what>": count}` since the last `reset()`."""
    _settle()
    n = len(ROUND_TRIP_PREFIX)
    return {k[n:]: v for k, v in list(_counters.items()) if k.startswith(ROUND_TRIP_PREFIX) and v}


def _settle(name: str | None = None) -> None:
    """Before a read: `name` is the counter about to be read, "*" for all values, None for
    names and metrics only (see `events.counters_read`)."""
    if events.counters_read.on:
        events.counters_read(name)


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
    _settle(name)
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
    """Forget all counters and metrics (subscribers of `events.counters_reset` forget theirs)."""
    _settle()
    _counters.clear()
    with _metrics_lock:
        _metrics.clear()
    if events.counters_reset.on:
        events.counters_reset()


def snapshot() -> tuple[list[tuple[str, int, float, list[float]]], dict[str, int]]:
    """For the report, settled once: (name, count, sum, sorted recent samples) of every metric,
    and every counter's value (the `ALWAYS_PRESENT` ones included)."""
    _settle("*")
    with _metrics_lock:
        metrics = [(k, v[0], v[1], sorted(v[2])) for k, v in sorted(_metrics.items())]
    names = sorted({k for k, v in list(_counters.items()) if v} | set(ALWAYS_PRESENT))
    return metrics, {k: _counters.get(k, 0) for k in names}


def fmt_time(s: float) -> str:
    """Seconds as text with a fitting unit ("1.234s", "5.000ms", "12.3us")."""
    if s >= 1:
        return f"{s:.3f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f}ms"
    return f"{s * 1e6:.1f}us"
