"""The real-workload suite's models (tests/models/test_models.py), steady-state training step:
eager vs ltc_async vs torch._lazy (TorchScript backend) vs torch.compile (Inductor), side by
side in one run.

    python -m benchmarks.bench_models [--steps 12] [--warmup 4] [--only gpt2,bert] [--no-inductor]

(from the repository root).  Each engine trains its own copy of the same model on the same
batches.  A round is `steps` training steps (ltc_async and torch._lazy: `mark_step()` after
each, one wait at the end, so the figure is pipelined throughput); the figure is the median
over 3 rounds of seconds per step, after `warmup` steps (compiles).  Also printed for
ltc_async: eager fallbacks and compiles per steady step.  Cases a runtime cannot run say why
instead of a time.
"""
from __future__ import annotations

import argparse
import copy
from typing import Any

import torch

import ltc_async as ltc
from benchmarks import engines
from benchmarks.cases import suite_cases, to_device
from benchmarks.engines import COMPILE, EAGER, LAZY, LTC
from benchmarks.harness import md_header, md_row, median, timed

ROUNDS = 3


def _steps(case: Any, model: Any, opt: torch.optim.Optimizer, batches: list[dict],
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


def _time(case: Any, base: torch.nn.Module, host_batches: list[dict], eng: engines.Engine,
          steps: int, warmup: int) -> float:
    """Seconds per step of a copy of `base` on `eng` (the model as the engine runs it)."""
    model = copy.deepcopy(base).to(eng.device)
    fwd = eng.compile(model)
    batches = [to_device(b, eng.device) for b in host_batches]
    opt = case.optimizer(model.parameters())
    _steps(case, fwd, opt, batches, eng.mark_step, warmup)
    eng.wait()
    rounds = []
    for _ in range(ROUNDS):
        ltc.metrics.reset()        # what ltc_async counts is then the last round's
        rounds.append(timed(lambda: _steps(case, fwd, opt, batches, eng.mark_step, steps),
                            eng.wait) / steps)
    return median(rounds)


def run_case(case: Any, steps: int, warmup: int, inductor: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    base = case.build()
    host_batches = [case.batch() for _ in range(4)]
    row: dict[str, Any] = {}
    row["eager"] = _time(case, base, host_batches, engines.get(EAGER), steps, warmup)
    row["ltc"] = _time(case, base, host_batches, engines.get(LTC), steps, warmup)
    row["fallbacks"] = (ltc.metrics.counter_value("EagerFallback") or 0) / steps
    row["compiles"] = sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))
    try:
        row["torch_lazy"] = _time(case, base, host_batches, engines.get(LAZY), steps, warmup)
    except Exception as e:  # noqa: BLE001 - reported in the table
        row["torch_lazy"] = f"fails: {type(e).__name__}"
    if inductor:
        try:
            torch._dynamo.reset()
            row["inductor"] = _time(case, base, host_batches, engines.get(COMPILE), steps, warmup)
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
    cases = suite_cases(args.only.split(",") if args.only else None)
    cols = ["eager", "ltc", "torch_lazy"] + ([] if args.no_inductor else ["inductor"])
    print(md_header(["model", *cols, "ltc fallbacks / step", "ltc compiles (steady)"],
                    "l" + "r" * (len(cols) + 2)))
    for case in cases:
        row = run_case(case, args.steps, args.warmup, not args.no_inductor)
        cells = [_fmt(row[c], row["eager"]) if c != "eager" else f"{row['eager'] * 1e3:.1f} ms" for c in cols]
        print(md_row([case.name, *cells, f"{row['fallbacks']:.0f}", row["compiles"]]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
