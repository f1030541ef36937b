#!/usr/bin/env python
"""Side-by-side benchmark: eager PyTorch vs torch._lazy (C++ LTC, TorchScript backend) vs
ltc_async (this project) [vs torch.compile for the MLP step].

Everything runs in ONE process so that all engines see the same machine state; rounds of the
different engines are interleaved (round-robin) so slow drifts of a noisy machine hit every
engine alike. Reported figures are medians over rounds.

Sections (select with --only, repeatable; default: all):
  trace  trace cost in microseconds per op of a 2000-op elementwise chain on a 16x16 tensor
         (only the Python tracing loop is timed; mark_step + wait run outside the timed region
         and their result is discarded). For eager this is the plain per-op execution time.
  mlp    throughput of a small MLP training step (64->256->256->10, batch 64, CrossEntropyLoss,
         SGD(lr=0.01, momentum=0.9)): N steps back to back with mark_step after each, one
         wait_device_ops at the end, wall time / N.  Also torch.compile (default backend).
  big    compute-bound case: 4 Linear layers of width 2048, batch 512, same step; steps/s.
  overlap  the same compute-bound step on ltc_async, decomposed: host trace time per step
         (zero_grad..mark_step on the Python thread, device idle), device execute time per step
         (ExecuteTime metric), steady-state step time (N steps + wait_device_ops, / N); reports
         step / max(trace, execute) and the fraction of the shorter one that is hidden.
         eager and torch._lazy steps/s of the same model beside it, rounds interleaved.
  devices  in a subprocess with LTC_ASYNC_DEVICES=cpu,cpu: (a) a heavy graph (10x
         tanh(x @ x), 768x768) on ltc:0 alone vs on ltc:0 and ltc:1 at once; (b) DataParallel
         training (MLP 256-1024-1024-10, batch 512) on [ltc:0] vs [ltc:0, ltc:1].

Usage:
  python benchmarks/bench_lazy.py            # full run
  python benchmarks/bench_lazy.py --quick    # CI smoke run (few repetitions)
  python benchmarks/bench_lazy.py --only trace --only mlp
  python benchmarks/bench_lazy.py --only overlap --only devices
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

# Both lazy engines live side by side in this process: torch._lazy owns device "lazy",
# ltc_async owns device "ltc".
import torch._lazy
import torch._lazy.metrics
import torch._lazy.ts_backend

torch._lazy.ts_backend.init()

import ltc_async as ltc  # noqa: E402

EAGER, LAZY, LTC, COMPILE = "eager", "torch._lazy", "ltc_async", "torch.compile"


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------
@dataclass
class Engine:
    name: str
    device: str
    mark_step: Callable[[], None]
    wait: Callable[[], None]
    recompiles: Callable[[], int | None]  # cumulative count of uncached compiles, if known


def _noop() -> None:
    pass


def _lazy_recompiles() -> int | None:
    return torch._lazy.metrics.counter_value("UncachedCompile") or 0


def _ltc_recompiles() -> int | None:
    return ltc.metrics.counter_value("UncachedCompile") or 0


ENGINES = {
    EAGER: Engine(EAGER, "cpu", _noop, _noop, lambda: None),
    LAZY: Engine(LAZY, "lazy", torch._lazy.mark_step, torch._lazy.wait_device_ops,
                 _lazy_recompiles),
    LTC: Engine(LTC, "ltc:0", ltc.mark_step, ltc.wait_device_ops, _ltc_recompiles),
    # torch.compile runs on the eager CPU device; only the model is compiled.
    COMPILE: Engine(COMPILE, "cpu", _noop, _noop, lambda: None),
}


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------
@dataclass
class Result:
    section: str
    engine: str
    unit: str                    # "us/op", "ms/step", "steps/s"
    higher_is_better: bool
    samples: list[float] = field(default_factory=list)
    error: str | None = None
    recompiles_in_timing: int | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples and not self.error else None


def _short_error(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ").replace("|", "\\|")
    return msg if len(msg) <= 160 else msg[:157] + "..."


class Runner:
    """Runs interleaved rounds of several engine cases and collects per-round samples.

    A case is a factory `make(engine) -> (warmup_fn, round_fn)`; `round_fn()` returns one sample
    in the section's unit. An exception disables that engine for the rest of the section and is
    reported (with traceback on stderr); the other engines continue.
    """

    def __init__(self, section: str, unit: str, higher_is_better: bool):
        self.section, self.unit, self.hib = section, unit, higher_is_better

    def run(self, engines: list[str], make, rounds: int) -> dict[str, Result]:
        results = {e: Result(self.section, e, self.unit, self.hib) for e in engines}
        cases = {}
        for name in engines:
            try:
                warmup, one_round = make(ENGINES[name])
                _log(f"[{self.section}] warming up {name} ...")
                t0 = time.perf_counter()
                warmup()
                _log(f"[{self.section}]   {name} warm-up took {time.perf_counter() - t0:.1f}s")
                cases[name] = one_round
            except Exception as exc:  # report, keep going with the other engines
                self._fail(results[name], exc)
        for r in range(rounds):
            for name in list(cases):
                before = ENGINES[name].recompiles()
                try:
                    gc.collect()
                    sample = cases[name]()
                except Exception as exc:
                    self._fail(results[name], exc)
                    del cases[name]
                    continue
                after = ENGINES[name].recompiles()
                res = results[name]
                res.samples.append(sample)
                if before is not None and after is not None:
                    res.recompiles_in_timing = (res.recompiles_in_timing or 0) + after - before
            _log(f"[{self.section}] round {r + 1}/{rounds}: " + ", ".join(
                f"{n}={results[n].samples[-1]:.4g}" for n in cases if results[n].samples))
        return results

    def _fail(self, res: Result, exc: BaseException) -> None:
        res.error = _short_error(exc)
        _log(f"[{self.section}] {res.engine} FAILED: {res.error}")
        traceback.print_exc(file=sys.stderr)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# (a) trace cost per op
# --------------------------------------------------------------------------------------------
def bench_trace(args) -> dict[str, Result]:
    n_ops = args.trace_ops
    base_x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))

    def make(eng: Engine):
        def one_round() -> float:
            x = base_x.to(eng.device)
            y = x.clone()
            eng.mark_step()          # materialize the inputs: the chain starts from device data
            eng.wait()
            t0 = time.perf_counter()
            for i in range(n_ops // 2):
                y = y * 1.0001
                y = y + x
            t1 = time.perf_counter()
            eng.mark_step()          # outside the timed region; result discarded
            eng.wait()
            del x, y
            return (t1 - t0) / n_ops * 1e6

        def warmup() -> None:
            for _ in range(2):       # first round compiles the 2000-op graph, second hits cache
                one_round()

        return warmup, one_round

    return Runner("trace", "us/op", False).run([EAGER, LAZY, LTC], make, args.trace_rounds)


# --------------------------------------------------------------------------------------------
# (b)/(c) MLP training step
# --------------------------------------------------------------------------------------------
def _mlp(widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _train_case(widths: list[int], batch: int, steps: int, warmup_steps: int):
    """Returns make(engine) -> (warmup, round) with round() = wall seconds per step."""

    def make(eng: Engine):
        torch.manual_seed(0)
        model = _mlp(widths)
        x_cpu = torch.randn(batch, widths[0])
        t_cpu = torch.randint(0, widths[-1], (batch,))
        model = model.to(eng.device)
        fwd = torch.compile(model) if eng.name == COMPILE else model
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        x, t = x_cpu.to(eng.device), t_cpu.to(eng.device)
        eng.mark_step()
        eng.wait()

        def step():
            opt.zero_grad()
            loss = loss_fn(fwd(x), t)
            loss.backward()
            opt.step()
            eng.mark_step()
            return loss

        def warmup() -> None:
            for _ in range(warmup_steps):
                loss = step()
            eng.wait()
            v = float(loss.detach().cpu())  # sanity check (a sync), outside any timed region
            if not math.isfinite(v):
                raise RuntimeError(f"non-finite loss after warm-up: {v}")

        def one_round() -> float:
            eng.wait()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            eng.wait()
            return (time.perf_counter() - t0) / steps

        return warmup, one_round

    return make


def bench_mlp(args) -> dict[str, Result]:
    make_s = _train_case([64, 256, 256, 10], 64, args.mlp_steps, args.mlp_warmup)

    def make(eng):  # ms/step
        warmup, one_round = make_s(eng)
        return warmup, lambda: one_round() * 1e3

    engines = [EAGER, LAZY, LTC] + ([] if args.no_compile else [COMPILE])
    return Runner("mlp", "ms/step", False).run(engines, make, args.mlp_rounds)


def bench_big(args) -> dict[str, Result]:
    h = 2048
    make_s = _train_case([h, h, h, h, 10], 512, args.big_steps, args.big_warmup)

    def make(eng):  # steps/s
        warmup, one_round = make_s(eng)
        return warmup, lambda: 1.0 / one_round()

    return Runner("big", "steps/s", True).run([EAGER, LAZY, LTC], make, args.big_rounds)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
SECTION_TITLES = {
    "trace": "trace cost, 2000-op elementwise chain on 16x16",
    "mlp": "MLP 64-256-256-10 train step, batch 64 (throughput)",
    "big": "MLP 4x Linear width 2048 train step, batch 512",
}


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if v >= 1 else f"{v:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def render(all_results: dict[str, dict[str, Result]]) -> str:
    lines = [
        "| case | engine | median | unit | min..max | rounds | vs torch._lazy | vs eager "
        "| recompiles while timed |",
        "|---|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for section, results in all_results.items():
        lazy_med = results[LAZY].median if LAZY in results else None
        eager_med = results[EAGER].median if EAGER in results else None
        for name, res in results.items():
            better = "higher" if res.higher_is_better else "lower"
            if res.error:
                med, spread = f"n/a ({res.error})", "-"
            else:
                med = _fmt(res.median)
                spread = f"{_fmt(min(res.samples))}..{_fmt(max(res.samples))}"
            rc = "-" if res.recompiles_in_timing is None else str(res.recompiles_in_timing)
            lines.append(
                f"| {section} | {name} | {med} | {res.unit} ({better} is better) | {spread} "
                f"| {len(res.samples)} | {_ratio(res.median, lazy_med)} "
                f"| {_ratio(res.median, eager_med)} | {rc} |")
    out = ["", "Ratios are value / reference value of the same unit "
           "(for us/op and ms/step < 1 means faster; for steps/s > 1 means faster).", ""]
    out += [f"- **{s}**: {SECTION_TITLES[s]}" for s in all_results]
    out += [""] + lines
    if "big" in all_results:
        r = all_results["big"]
        out += ["", f"big case, ltc_async / torch._lazy steps/s: "
                    f"{_ratio(r[LTC].median if LTC in r else None, r[LAZY].median if LAZY in r else None)}"]
    return "\n".join(out)


def machine_info() -> str:
    return (f"python {platform.python_version()}, torch {torch.__version__}, "
            f"ltc_async {getattr(ltc, '__version__', '?')}, {platform.machine()}, "
            f"{os.cpu_count()} cpus, torch threads {torch.get_num_threads()}, "
            f"cuda available: {torch.cuda.is_available()}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=["trace", "mlp", "big"],
                   help="run only this section (repeatable); default: all")
    p.add_argument("--quick", action="store_true", help="few repetitions (CI smoke run)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile in mlp")
    p.add_argument("--trace-ops", type=int, default=2000)
    p.add_argument("--trace-rounds", type=int)
    p.add_argument("--mlp-steps", type=int, help="timed steps per round")
    p.add_argument("--mlp-rounds", type=int)
    p.add_argument("--mlp-warmup", type=int)
    p.add_argument("--big-steps", type=int, help="timed steps per round")
    p.add_argument("--big-rounds", type=int)
    p.add_argument("--big-warmup", type=int)
    args = p.parse_args(argv)

    defaults = dict(trace_rounds=15, mlp_steps=50, mlp_rounds=15, mlp_warmup=30,
                    big_steps=5, big_rounds=4, big_warmup=10)
    if args.quick:
        defaults = dict(trace_rounds=3, mlp_steps=10, mlp_rounds=2, mlp_warmup=10,
                        big_steps=2, big_rounds=1, big_warmup=2)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    sections = args.only or ["trace", "mlp", "big"]
    print(f"# bench_lazy ({'quick' if args.quick else 'full'}): {machine_info()}")
    print(f"# sections: {', '.join(sections)}; settings: " + ", ".join(
        f"{k}={getattr(args, k)}" for k in ["trace_ops", *defaults]))
    sys.stdout.flush()

    all_results: dict[str, dict[str, Result]] = {}
    bench = {"trace": bench_trace, "mlp": bench_mlp, "big": bench_big}
    for s in ["trace", "mlp", "big"]:
        if s in sections:
            t0 = time.perf_counter()
            all_results[s] = bench[s](args)
            _log(f"[{s}] section took {time.perf_counter() - t0:.0f}s")
    print(render(all_results))
    failed = [f"{s}/{e}" for s, rs in all_results.items() for e, r in rs.items()
              if r.error and e != COMPILE]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
