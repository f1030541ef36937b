"""Tiered compilation (issue 19): start like eager, run like Inductor.

    python -m benchmarks.bench_tiers [--only gpt2,bert,resnet,mobilenet_v2,mlp] [--engines eager,inductor,ltc,ltc-tiered,...]
                                     [--steps 30] [--rounds 3] [--batch 8] [--seq 64]

Every engine runs in a FRESH PROCESS per case (start-up is part of what is measured), twice:
with an empty Inductor cache directory (`cold`) and again with the cache the first run left
(`warm`).  A process trains a tiny GPT-2 / BERT (transformers, AdamW, batch x seq tokens) and
reports: the time to its first step (to the first loss on the host, from after building the
model -- the same for every engine, reported apart as `model_build_s` --: moving it to the
device, Dynamo, AOTAutograd, Inductor or ltc tracing and TorchScript, whatever the engine does),
for tiered engines the time until its hot graphs are on the top tier (`tier-up`, from process
start; `ltc.debug.wait_compiles`), then steady ms/step with the loss read every step and every
30 steps (median of `rounds` rounds of `steps` steps, after a warm-up).

Engines: `eager`; `inductor` (`torch.compile(model)`, optimizer uncompiled); `ltc` (lazy tracing,
TorchScript only: `LTC_ASYNC_TIERS=ts`); `ltc-tiered` (lazy tracing, TorchScript then Inductor
in the background); `ltc+compile` / `ltc+compile-tiered` (`torch.compile(model, backend="ltc")`
and the optimizer step compiled the same way, without / with tiers); `ltc-1graph` /
`ltc+compile-1graph` (`LTC_ASYNC_CUT_AT_BACKWARD=0`: one graph per step also when the loss is
read every step, as before the backward's own cut).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import log

T_START = time.perf_counter()

ENGINES = {   # name -> (bench_compile engine, LTC_ASYNC_TIERS[, other environment])
    "eager": ("eager", "ts"), "inductor": ("inductor", "ts"), "ltc": ("ltc", "ts"),
    "ltc-tiered": ("ltc", "ts,inductor"), "ltc+compile": ("ltc+compile", "ts"),
    "ltc+compile-tiered": ("ltc+compile", "ts,inductor"),
    # one graph per step even when the loss is read every step (no cut at the backward)
    "ltc-1graph": ("ltc", "ts", {"LTC_ASYNC_CUT_AT_BACKWARD": "0"}),
    "ltc+compile-1graph": ("ltc+compile", "ts", {"LTC_ASYNC_CUT_AT_BACKWARD": "0"}),
}


def child(args: argparse.Namespace) -> None:
    import warnings

    import torch

    from benchmarks import bench_compile as bc
    engine = ENGINES[args.engine][0]
    # eager and Inductor run without ltc_async: in a process that imports it, PyTorch cannot
    # run an eager CUDA backward (pytorch/pytorch#161129)
    ltc = __import__("ltc_async") if engine.startswith("ltc") else None
    warnings.simplefilter("always")
    caught = warnings.catch_warnings(record=True)
    seen = caught.__enter__()
    build, case_batch, loss_fn, make_opt = bc.CASES[args.case]()
    if args.case in ("gpt2", "bert"):   # batch x seq tokens
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 128, (args.batch, args.seq), generator=g)
        batch = {"input_ids": ids,
                 "labels": ids if args.case == "gpt2" else torch.randint(0, 3, (args.batch,), generator=g)}
    else:                               # the case's own batch (the suite's CNNs: 8 images)
        batch = case_batch()
    model_build_s = []

    def timed_build() -> torch.nn.Module:
        t = time.perf_counter()
        model = build()
        model_build_s.append(time.perf_counter() - t)
        return model
    t0 = time.perf_counter()
    step, wait = bc.make(engine, (timed_build, lambda: batch, loss_fn, make_opt))
    first = float(step().detach().cpu())
    first_s = time.perf_counter() - t0 - sum(model_build_s)
    log(f"{args.engine}: first step {first_s:.2f} s")

    def warm_up(steps: int) -> None:
        # both patterns measured below: a loop that reads the loss every step runs two graphs a
        # step (the backward's own cut), one that reads rarely one graph a step, so each gets
        # hot (and, tiered, built) before the timing, not during it
        for read_every in (1, 30):
            for k in range(steps):
                loss = step()
                if (k + 1) % read_every == 0:
                    float(loss.detach().cpu())
            wait()
    warm_up(args.warmup)
    log(f"{args.engine}: warmed up at {time.perf_counter() - T_START:.1f} s")
    tier_up_s = None
    if args.engine.endswith("tiered"):
        ltc.debug.wait_compiles()
        tier_up_s = time.perf_counter() - T_START
        log(f"{args.engine}: builds done at {tier_up_s:.1f} s: "
            f"{ {k: ltc.metrics.counter_value(k) for k in ('TierUpCompile', 'TierUpFailed', 'TierUpRun')} }")
        # past the trial of each graph's two tiers (`LTC_ASYNC_TIER_TRIAL`); graphs that got hot
        # only now (the other read pattern's) are built and tried too before the timing: a build
        # beside the timed steps takes the GIL from their tracing (on a GPU's slow Triton
        # builds, 127 vs 16 ms/step)
        for _ in range(5):
            warm_up(10)
            if ltc.debug.wait_compiles(timeout=0.1):
                break
            ltc.debug.wait_compiles()
        else:
            log("builds still running after the warm-up")

    def timed(read_every: int) -> float:
        samples = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            for k in range(args.steps):
                loss = step()
                if (k + 1) % read_every == 0:
                    float(loss.detach().cpu())
            wait()
            samples.append((time.perf_counter() - t) / args.steps * 1e3)
        return statistics.median(samples)
    every_step = timed(1)
    every_30 = timed(30)
    counters = ({k: ltc.metrics.counter_value(k) for k in ("TierUpCompile", "TierUpFailed", "TierUpRun", "TierUpSlower")}
                if ltc else {})
    failures = [str(w.message)[:2000] for w in seen if "tier" in str(w.message).lower()]
    # each decided trial: the top tier's shortest run and period over the quick tier's
    trials = [[round(r, 3), round(p, 3)] for r, p in zip(*[
        (ltc.metrics.metric_data(m) or (0, 0, []))[2] for m in ("TierTrialRun", "TierTrialPeriod")])] if ltc else []
    print(json.dumps({"first_step_s": first_s, "model_build_s": sum(model_build_s),
                      "first_loss": first, "tier_up_s": tier_up_s,
                      "ms_every_step": every_step, "ms_every_30": every_30, "counters": counters,
                      "trials": trials,
                      "tier_up_failures": failures}))


def run_child(engine: str, case: str, cache: str, args: argparse.Namespace) -> dict:
    _, tiers, *extra = ENGINES[engine]
    env = dict(os.environ, LTC_ASYNC_TIERS=tiers, TORCHINDUCTOR_CACHE_DIR=cache,
               LTC_ASYNC_CPU_THREADS=str(args.threads), **(extra[0] if extra else {}))
    cmd = [sys.executable, "-m", "benchmarks.bench_tiers", "--child", "--engine", engine, "--case", case,
           "--steps", str(args.steps), "--rounds", str(args.rounds), "--batch", str(args.batch),
           "--seq", str(args.seq), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        print(r.stderr[-3000:], file=sys.stderr)
        return {}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true")
    p.add_argument("--engine", default="eager")
    p.add_argument("--case", default="gpt2")
    p.add_argument("--only", default="gpt2,bert")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (eager and the ltc worker)")
    p.add_argument("--cold-only", action="store_true",
                   help="one process per engine, with empty caches (its figures fill both columns): "
                        "half the time, for a lent GPU's short loan")
    args = p.parse_args()
    if args.child:
        import torch
        torch.set_num_threads(args.threads)
        child(args)
        return 0
    rows = []
    for case in args.only.split(","):
        res = {}
        for engine in args.engines.split(","):
            with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
                cold = run_child(engine, case, cache, args)
                warm = cold if args.cold_only else run_child(engine, case, cache, args)
            res[engine] = (cold, warm)
            print(f"[{case}] {engine}: cold {cold} warm {warm}", file=sys.stderr, flush=True)
        ref_e = res.get("eager", ({}, {}))[1]
        ref_i = res.get("inductor", ({}, {}))[1]
        for engine, (cold, warm) in res.items():
            def ratio(key: str, ref: dict) -> str:
                return f"{warm[key] / ref[key]:.2f}x" if warm and ref and ref.get(key) else "-"
            rows.append("| " + " | ".join([
                case, engine,
                f"{cold.get('first_step_s', float('nan')):.1f}", f"{warm.get('first_step_s', float('nan')):.1f}",
                "-" if not cold.get("tier_up_s") else f"{cold['tier_up_s']:.0f} / {warm['tier_up_s']:.0f}",
                f"{warm.get('ms_every_step', float('nan')):.1f}", ratio("ms_every_step", ref_e),
                ratio("ms_every_step", ref_i),
                f"{warm.get('ms_every_30', float('nan')):.1f}", ratio("ms_every_30", ref_e),
                ratio("ms_every_30", ref_i)]) + " |")
    print("| case | engine | first step s (cold) | first step s (warm) | tier-up s (cold / warm) | "
          "ms/step, read every step | vs eager | vs inductor | ms/step, read every 30 | vs eager | vs inductor |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
