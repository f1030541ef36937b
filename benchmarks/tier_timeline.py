"""The tracing thread's step times while a graph tiers up in the background (issue 19).

    OMP_NUM_THREADS=1 python -m benchmarks.tier_timeline [--seconds 60] [--every 4]

(from the repository root).  Trains the suite's tiny GPT-2 (AdamW) on ltc:0 with the default
tiers, one step at a time (`mark_step`, then `wait_device_ops`), and prints every few seconds
the median and the worst step, split into tracing (until `mark_step` returns) and waiting,
with the tier counters: what a program feels while the Inductor build of its step runs on the
tier-up thread.  Run it twice to see empty and warm Inductor caches.
"""
from __future__ import annotations

import argparse
import time

import torch

import ltc_async as ltc
from benchmarks.cases import suite_cases, to_device


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--every", type=float, default=4.0)
    args = p.parse_args()
    case = suite_cases(["gpt2"])[0]
    torch.manual_seed(0)
    model = case.build().to("ltc:0")
    opt = case.optimizer(model.parameters())
    batches = [to_device(case.batch(), "ltc:0") for _ in range(4)]
    start, last, steps, window = time.perf_counter(), float("-inf"), 0, []
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        opt.zero_grad()
        case.loss(model, batches[steps % 4]).backward()
        opt.step()
        ltc.mark_step()
        t1 = time.perf_counter()
        ltc.wait_device_ops()
        window.append((t1 - t0, time.perf_counter() - t1))
        steps += 1
        now = time.perf_counter() - start
        if now - last >= args.every:
            trace, wait = (sorted(w[k] for w in window) for k in (0, 1))
            tiers = {k: ltc.metrics.counter_value(k) or 0 for k in ("TierUpCompile", "TierUpRun", "TierUpFailed")}
            print(f"t={now:5.1f} s  steps {steps:5d}  trace {trace[len(trace) // 2] * 1e3:5.1f} ms "
                  f"(worst {trace[-1] * 1e3:4.0f})  wait {wait[len(wait) // 2] * 1e3:4.1f} ms "
                  f"(worst {wait[-1] * 1e3:4.0f})  {tiers}", flush=True)
            window, last = [], now


if __name__ == "__main__":
    main()
