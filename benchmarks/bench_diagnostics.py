"""What the diagnostics cost: nothing measurable when off, and how much each costs when on.

    python benchmarks/bench_diagnostics.py [--steps 50] [--rounds 7]

Three measurements (see benchmarks/README.md, "Diagnostics overhead"):

1. **the hooks when off**: the executor tests `hooks.on` (and, where a closure is handed to
   another thread, PyTorch's profiler flag) at 6 places per `mark_step` of one graph; tracing
   has no hook.  Timed with `timeit` and multiplied out, against the step time of (2);
2. **step time**, the `bench_lazy` MLP training step (Linear 64-256-256-10, batch 64, SGD with
   momentum), `steps` back to back then `wait_device_ops`, in ms/step, with every diagnostic
   off, then each one on: `explain_recompiles(True)`, `sync_guard("warn")` (armed; the loop
   makes no implicit sync), an open `timeline()`.  Configurations are interleaved round by
   round; medians over rounds;
3. **the slow paths' record** (always on): the frame walk that finds the user's line of an
   eager fallback or implicit sync, against the `.item()` it is part of.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import timeit

import torch

import ltc_async as ltc
from ltc_async.diagnostics import hooks, location, recompiles, sync_guard

HOOK_CHECKS_PER_STEP = 6   # prepare, _prepare, submit, schedule, api.mark_step; + read (none here)


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).to("ltc:0")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 64).to("ltc:0")
    y = torch.randint(0, 10, (64,)).to("ltc:0")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        ltc.mark_step()
    return step


@contextlib.contextmanager
def configured(name: str):
    if name == "explain_recompiles":
        ltc.debug.explain_recompiles(True)
        try:
            yield
        finally:
            ltc.debug.explain_recompiles(False)
    elif name == "sync_guard warn":
        with ltc.sync_guard("warn"):
            yield
    elif name == "timeline":
        with ltc.debug.timeline():
            yield
    else:
        yield


CONFIGS = ["off", "explain_recompiles", "sync_guard warn", "timeline"]


def time_steps(step, n: int) -> float:
    ltc.wait_device_ops()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    ltc.wait_device_ops()
    return (time.perf_counter() - t0) / n * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args(argv)

    # 1. the hook test itself
    check = "on or prof._is_profiler_enabled"
    ns = min(timeit.repeat(check, globals={"on": hooks.on, "prof": hooks.profiler},
                           number=1_000_000, repeat=5)) * 1e3   # ns per evaluation
    assert not hooks.on and not recompiles.enabled and not sync_guard.armed

    # 2. step time per configuration
    step = make_step()
    for _ in range(args.warmup):
        step()
    samples: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for c in CONFIGS:
            with configured(c):
                samples[c].append(time_steps(step, args.steps))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{c} {samples[c][-1]:.3f}" for c in CONFIGS), file=sys.stderr, flush=True)
    off = statistics.median(samples["off"])

    # 3. the slow paths' frame walk, against an .item() (a sync) of the same program
    x = torch.randn(64, 64).to("ltc:0")
    walk_us = min(timeit.repeat(lambda: location.describe(location.user_frame()),
                                number=2000, repeat=5)) / 2000 * 1e6
    items = []
    for _ in range(20):
        y = (x @ x).sum()
        t0 = time.perf_counter()
        y.item()
        items.append((time.perf_counter() - t0) * 1e6)
    item_us = statistics.median(items)

    print(f"# bench_diagnostics: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds x {args.steps} steps")
    print()
    print(f"hook test when off: {ns:.1f} ns each, {HOOK_CHECKS_PER_STEP} per step = "
          f"{ns * HOOK_CHECKS_PER_STEP / 1e3:.2f} us/step = "
          f"{ns * HOOK_CHECKS_PER_STEP / 1e6 / off:.5%} of a {off:.3f} ms step")
    print()
    print("| configuration | ms/step (median) | min..max | vs off |")
    print("|---|---:|---|---:|")
    for c in CONFIGS:
        med = statistics.median(samples[c])
        print(f"| {c} | {med:.3f} | {min(samples[c]):.3f}..{max(samples[c]):.3f} | {med / off:.3f}x |")
    print()
    print(f"slow-path record (user-line frame walk): {walk_us:.1f} us, against {item_us:.0f} us "
          f"for the .item() it belongs to ({walk_us / item_us:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
