"""The real-workload suite's models (tests/models/test_models.py), steady-state training step:
eager vs ltc_async vs torch._lazy (TorchScript backend) vs torch.compile (Inductor), side by
side in one run.

    python benchmarks/bench_models.py [--steps 12] [--warmup 4] [--only gpt2,bert] [--no-inductor]

Each engine trains its own copy of the same model on the same batches.  A round is `steps`
training steps (ltc_async and torch._lazy: `mark_step()` after each, one wait at the end, so
the figure is pipelined throughput); the figure is the median over 3 rounds of seconds per
step, after `warmup` steps (compiles).  Also printed for ltc_async: eager fallbacks and compiles
per steady step.  Cases a runtime cannot run say why instead of a time.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import os
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "models"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import ltc_async as ltc  # noqa: E402

ROUNDS = 3


def _steps(case: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[dict],
           step_end: Any, n: int) -> None:
    for i in range(n):
        b = batches[i % len(batches)]
        if i % case.accumulate == 0:
            opt.zero_grad()
        loss = case.loss(model, b) / case.accumulate
        loss.backward()
        if (i + 1) % case.accumulate == 0:
            opt.step()
        step_end()


def _time(case: Any, model: torch.nn.Module, batches: list[dict], step_end: Any, wait: Any,
          steps: int, warmup: int) -> float:
    opt = case.optimizer(model.parameters())
    _steps(case, model, opt, batches, step_end, warmup)
    wait()
    rounds = []
    for _ in range(ROUNDS):
        ltc.metrics.reset()        # what ltc_async counts is then the last round's
        t0 = time.perf_counter()
        _steps(case, model, opt, batches, step_end, steps)
        wait()
        rounds.append((time.perf_counter() - t0) / steps)
    return statistics.median(rounds)


def _on(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def run_case(case: Any, steps: int, warmup: int, inductor: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    base = case.build()
    host_batches = [case.batch() for _ in range(4)]
    row: dict[str, Any] = {}
    eager = copy.deepcopy(base)
    row["eager"] = _time(case, eager, host_batches, lambda: None, lambda: None, steps, warmup)

    lazy = copy.deepcopy(base).to("ltc:0")
    batches = [_on(b, "ltc:0") for b in host_batches]
    row["ltc"] = _time(case, lazy, batches, ltc.mark_step, ltc.wait_device_ops, steps, warmup)
    row["fallbacks"] = (ltc.metrics.counter_value("EagerFallback") or 0) / steps
    row["compiles"] = sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))

    try:
        lazy_mod = importlib.import_module("torch._lazy")
        importlib.import_module("torch._lazy.ts_backend").init()
        tl = copy.deepcopy(base).to("lazy")
        tb = [_on(b, "lazy") for b in host_batches]
        row["torch_lazy"] = _time(case, tl, tb, lazy_mod.mark_step, lazy_mod.wait_device_ops,
                                  steps, warmup)
    except Exception as e:  # noqa: BLE001 - reported in the table
        row["torch_lazy"] = f"fails: {type(e).__name__}"
    if inductor:
        try:
            torch._dynamo.reset()
            comp = copy.deepcopy(base)
            compiled = torch.compile(comp)
            row["inductor"] = _time(case, compiled, host_batches, lambda: None, lambda: None, steps, warmup)
        except Exception as e:  # noqa: BLE001 - reported in the table
            row["inductor"] = f"fails: {type(e).__name__}"
    return row


def _fmt(v: Any, eager: float) -> str:
    if isinstance(v, str):
        return v
    return f"{v * 1e3:.1f} ms ({v / eager:.1f}x)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--only", default="")
    p.add_argument("--no-inductor", action="store_true")
    args = p.parse_args()
    import test_models
    cases = [c for c in test_models.CASES if not args.only or c.name in args.only.split(",")]
    cols = ["eager", "ltc", "torch_lazy"] + ([] if args.no_inductor else ["inductor"])
    print("| model | " + " | ".join(cols) + " | ltc fallbacks / step | ltc compiles (steady) |")
    print("|---|" + "---:|" * (len(cols) + 2))
    for case in cases:
        row = run_case(case, args.steps, args.warmup, not args.no_inductor)
        cells = [_fmt(row[c], row["eager"]) if c != "eager" else f"{row['eager'] * 1e3:.1f} ms" for c in cols]
        print(f"| {case.name} | " + " | ".join(cells) + f" | {row['fallbacks']:.0f} | {row['compiles']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
