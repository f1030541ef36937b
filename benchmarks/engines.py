"""The engines the benchmarks compare, and how each one ends a step and waits for its device.

Both lazy engines live side by side in one process: torch._lazy (C++ LTC, TorchScript backend)
owns device `lazy`, ltc_async owns device `ltc`.  torch._lazy's backend is initialized on first
use (`torch_lazy()`), so a benchmark that does not run it does not load it; likewise ltc_async is
imported only by its engines: in a process that imports it, PyTorch's autograd cannot run an
eager CUDA backward (pytorch/pytorch#161129), so the eager anchors on a GPU
(`BENCH_EAGER_DEVICE=cuda`) need processes of their own (`bench_tiers` runs one per engine).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.harness import noop

EAGER, LAZY, LTC, COMPILE = "eager", "torch._lazy", "ltc_async", "torch.compile"
LTC_COMPILE = "ltc_async+compile"


@dataclass(frozen=True)
class Engine:
    name: str
    device: str
    mark_step: Callable[[], None]
    wait: Callable[[], None]
    recompiles: Callable[[], int | None]  # cumulative count of uncached compiles, if known
    backend: str | None = None            # torch.compile's backend for the model, if compiled

    def sync(self) -> None:
        """Cut and run the pending graph, wait for it (no-ops for eager tensors)."""
        self.mark_step()
        self.wait()

    def compile(self, fn: Any) -> Any:
        """`fn` (a module, `opt.step`) as this engine runs it."""
        if self.backend is None:
            return fn
        return torch.compile(fn) if self.backend == "inductor" else torch.compile(fn, backend=self.backend)


def torch_lazy() -> Any:
    """`torch._lazy` with its TorchScript backend initialized (once)."""
    import torch._lazy
    import torch._lazy.metrics
    import torch._lazy.ts_backend
    if not _lazy_ready:
        torch._lazy.ts_backend.init()
        _lazy_ready.append(True)
    return torch._lazy


_lazy_ready: list[bool] = []


def _ltc() -> Any:
    import ltc_async  # lazy: see the module's docstring
    return ltc_async


def ltc_compiles() -> int:
    return _ltc().metrics.counter_value("UncachedCompile") or 0


def settle_tiers(step: Callable[[], Any], steps_done: int) -> None:
    """With tiering on (the default), bring an ltc_async loop to its steady state before timing:
    run `step` (a step on ltc:0, `steps_done` of which ran already) past the tier-up threshold
    and wait for the background builds, until a round of steps queues none; then run past each
    built graph's trial of the two tiers."""
    ltc = _ltc()
    from ltc_async.base.config import config
    from ltc_async.executor import arena, tiers
    if tiers.top_tier(arena.get("ltc:0")) is None:
        return
    # Rounds of steps until one queues no build: a graph can turn hot only after another's
    # build (a skeleton's shape-generic program, `executor/generic.py`, exists from its second
    # shape on), and a build left running would slow the timed rounds of every engine.
    built = -1
    for k in range(6):
        done = (ltc.metrics.counter_value("TierUpCompile") or 0) + (ltc.metrics.counter_value("TierUpFailed") or 0)
        if done == built:
            break
        built = done
        for _ in range(max(0, config.tier_up_after + 1 - (steps_done if k == 0 else 0))):
            step()
        ltc.wait_device_ops()
        ltc.debug.wait_compiles()
    for _ in range(2 * config.tier_trial + 3):   # the trial's runs, and the one ending its last period
        step()
    ltc.wait_device_ops()


def _ltc_engine(name: str, backend: str | None = None) -> Engine:
    ltc = _ltc()
    return Engine(name, "ltc:0", ltc.mark_step, ltc.wait_device_ops, ltc_compiles, backend=backend)


def _none() -> None:
    return None


#: The eager anchors' device (`eager`, `torch.compile`): "cpu", or "cuda" to compare against ltc
#: devices backed by a GPU (`BENCH_EAGER_DEVICE=cuda`; ltc:0 is cuda:0 where a GPU is present).
EAGER_DEVICE = os.environ.get("BENCH_EAGER_DEVICE", "cpu")


def _eager_wait() -> None:
    if EAGER_DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _lazy_engine() -> Engine:
    lazy = torch_lazy()
    return Engine(LAZY, "lazy", lazy.mark_step, lazy.wait_device_ops,
                  lambda: lazy.metrics.counter_value("UncachedCompile") or 0)


_FACTORIES: dict[str, Callable[[], Engine]] = {
    EAGER: lambda: Engine(EAGER, EAGER_DEVICE, noop, _eager_wait, _none),
    LAZY: _lazy_engine,
    LTC: lambda: _ltc_engine(LTC),
    # torch.compile (default backend, Inductor) runs on the eager device; only the model
    # is compiled.
    COMPILE: lambda: Engine(COMPILE, EAGER_DEVICE, noop, _eager_wait, _none, backend="inductor"),
    LTC_COMPILE: lambda: _ltc_engine(LTC_COMPILE, backend="ltc"),
}


@functools.cache
def get(name: str) -> Engine:
    return _FACTORIES[name]()


def recompiles(name: str) -> int | None:
    """The engine's cumulative compile count; None for an engine that counts none, or a name
    that is no engine."""
    return get(name).recompiles() if name in _FACTORIES else None
