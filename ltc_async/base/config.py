"""Tunables, read from `LTC_ASYNC_*` environment variables (LTC's `torch_lazy_*` flags)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def _env_number(name: str, default: Any, kind: type) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None


def _env_int(name: str, default: int) -> int:
    return _env_number(name, default, int)


def _env_float(name: str, default: float) -> float:
    return _env_number(name, default, float)


@dataclass
class Config:
    #: backend package under `ltc_async_devices` (the repository's `devices/` folder)
    backend: str = field(default_factory=lambda: os.environ.get("LTC_ASYNC_BACKEND", "torchscript"))
    #: backend device entries ("cpu", "cuda:0", ...); None means the backend's default
    devices: list[str] | None = field(default_factory=lambda: (
        [d.strip() for d in os.environ["LTC_ASYNC_DEVICES"].split(",")]
        if os.environ.get("LTC_ASYNC_DEVICES") else None))
    #: compiled graphs kept in the LRU computation cache
    compile_cache_size: int = field(default_factory=lambda: _env_int("LTC_ASYNC_COMPILE_CACHE_SIZE", 1024))
    #: executions a device may have queued before `mark_step` waits (bounds memory when the
    #: host traces faster than the device runs)
    max_inflight: int = field(default_factory=lambda: _env_int("LTC_ASYNC_MAX_INFLIGHT", 4))
    #: record the user source line of every IR node (costs a few microseconds per op)
    ir_debug: bool = field(default_factory=lambda: _env_int("LTC_ASYNC_IR_DEBUG", 0) != 0)
    #: when a graph fails, re-run it on the IR interpreter so that only the outputs depending
    #: on the failing op (or a failed input) fail; 0 fails the whole graph, as LTC does
    salvage: bool = field(default_factory=lambda: _env_int("LTC_ASYNC_SALVAGE", 1) != 0)
    #: intra-op threads for each CPU device worker (0: torch's default split, see README)
    cpu_threads: int = field(default_factory=lambda: _env_int("LTC_ASYNC_CPU_THREADS", 0))
    #: a blocking read runs the graph it waits for on its own thread when the CPU device is idle
    #: (two thread hand-offs fewer; 0: always on the device worker; see `executor/read_here.py`)
    read_here: bool = field(default_factory=lambda: _env_int("LTC_ASYNC_READ_HERE", 1) != 0)
    #: seconds a worker thread (device, compiler, tier-up) stays idle before it frees its OpenMP
    #: helper threads (0: never; see `base/openmp.py`)
    omp_idle_s: float = field(default_factory=lambda: _env_float("LTC_ASYNC_OMP_IDLE", 0.02))
    #: the garbage collector's young-generation threshold while ltc devices are in use
    #: (raised to this when lower; 0 leaves Python's setting alone; see `arena.tune_gc`)
    gc_threshold: int = field(default_factory=lambda: _env_int("LTC_ASYNC_GC_THRESHOLD", 20000))
    #: warn (`ltc.RecompileWarning`) on every graph-cache miss at a call site after its first,
    #: naming the first difference from the closest cached graph (`ltc.debug.explain_recompiles`)
    explain_recompiles: bool = field(
        default_factory=lambda: _env_int("LTC_ASYNC_EXPLAIN_RECOMPILES", 0) != 0)
    #: what an implicit device-to-host sync (`.item()`, `bool(t)`, ...) does: "allow", "warn" or
    #: "raise" (`ltc.sync_guard`)
    sync_guard: str = field(default_factory=lambda: os.environ.get("LTC_ASYNC_SYNC_GUARD") or "allow")
    #: append every cut graph's IR, with the user line that cut it, to this file ("": off;
    #: `ltc.debug.save_graphs`, torch._lazy's LTC_SAVE_TENSORS_FILE)
    save_graphs: str = field(default_factory=lambda: os.environ.get("LTC_ASYNC_SAVE_GRAPHS", ""))
    #: compilers a graph moves through, quick first (`LTC_ASYNC_TIERS`: "ts,inductor", the
    #: default, where the backend can build Inductor kernels here; "ts": no tiering); names a
    #: backend does not have are ignored (see `executor/tiers.py`)
    tiers: tuple = field(default_factory=lambda: tuple(
        t.strip() for t in (os.environ.get("LTC_ASYNC_TIERS") or "ts,inductor").split(",") if t.strip()))
    #: executions in a row with the same runtime scalars after which a graph's top tier is
    #: built in the background (`LTC_ASYNC_TIER_UP_AFTER`)
    tier_up_after: int = field(default_factory=lambda: max(1, _env_int("LTC_ASYNC_TIER_UP_AFTER", 10)))
    #: timed executions per tier once a top-tier program is ready; the graph keeps the faster
    #: tier (`LTC_ASYNC_TIER_TRIAL`; 0: keep the top tier untimed)
    tier_trial: int = field(default_factory=lambda: max(0, _env_int("LTC_ASYNC_TIER_TRIAL", 3)))
    #: a backward pass starts by cutting its device's pending forward when the program reads
    #: a result on the host every step (`graph_executor.before_backward`); 0: one graph per
    #: step, as LTC cuts (`LTC_ASYNC_CUT_AT_BACKWARD`)
    cut_at_backward: bool = field(default_factory=lambda: _env_int("LTC_ASYNC_CUT_AT_BACKWARD", 1) != 0)
    #: schema names ("aten::sub.Tensor") of ops forced onto the eager fallback
    #: (`ltc.debug.force_fallback`; no environment variable)
    force_fallback: frozenset = field(default_factory=frozenset)


config = Config()
