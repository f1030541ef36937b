"""What the diagnostics cost: nothing measurable when off, and how much each costs when on.

    python -m benchmarks.bench_diagnostics [--steps 50] [--rounds 7]   # from the repository root

Three measurements (see benchmarks/README.md, "Diagnostics overhead"):

1. **the events when off**: the core publishes events (`ltc_async/base/events.py`); one nobody
   subscribed to costs one attribute read (`event.on`), 3 per `mark_step` of one graph (step
   begins / done, scheduled; a host read adds 2); the 3 per-graph events the diagnostics
   always listen to (the prepare and execution wrappers, for the timeline and the profiler;
   the cache lookup, for the findings) cost one handler call each.  Tracing publishes none.
   Timed with `timeit` and multiplied out, against the step time of (2);
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
import sys
import time
import timeit

import torch

import ltc_async as ltc
from benchmarks import engines
from benchmarks.cases import MLPStep
from benchmarks.engines import LTC
from benchmarks.harness import Runner, md_header, md_row, median, time_steps
from ltc_async.base import events
from ltc_async.diagnostics import location, recompiles, sync_guard, timeline

CHECKS_PER_STEP = 3      # step_begins, step_done, scheduled: unsubscribed when diagnostics are off


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args(argv)

    # 1. the events when off: an unsubscribed one, and the three always subscribed per graph
    assert not (events.step_begins.on or events.step_done.on or events.scheduled.on)
    assert not recompiles.enabled and not sync_guard.armed and not timeline.any_open()
    ns = min(timeit.repeat("ev.on", globals={"ev": events.step_begins},
                           number=1_000_000, repeat=5)) * 1e3   # ns per evaluation
    job = lambda: None  # noqa: E731
    per_graph = ("ev.prepare_job.wrap(job, None, '', None); ev.execution_job.wrap(job, None); "
                 "ev.looked_up(None, None, '', True)")
    ns_graph = min(timeit.repeat(per_graph, globals={"ev": events, "job": job},
                                 number=100_000, repeat=5)) * 1e4   # ns per graph

    # 2. step time per configuration
    mlp_step = MLPStep([64, 256, 256, 10], 64, engines.get(LTC))

    def step() -> None:   # the loss is dropped before mark_step: no output of the graph
        mlp_step.trace()
        ltc.mark_step()
    for _ in range(args.warmup):
        step()

    def one_round(c: str) -> float:
        with configured(c):
            return time_steps(step, args.steps, ltc.wait_device_ops) * 1e3

    results = Runner("diagnostics", "ms/step", False, collect=False, counter=lambda c: None).run(
        CONFIGS, lambda c: (None, lambda: one_round(c)), args.rounds)
    samples = {c: r.samples for c, r in results.items()}
    off = median(samples["off"])

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
    item_us = median(items)

    print(f"# bench_diagnostics: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds x {args.steps} steps")
    print()
    cost_ns = ns * CHECKS_PER_STEP + ns_graph
    print(f"events when off: an unsubscribed one {ns:.1f} ns (one attribute read), "
          f"{CHECKS_PER_STEP} per step; the always-subscribed per-graph handlers {ns_graph:.0f} ns; "
          f"in all {cost_ns / 1e3:.2f} us/step = {cost_ns / 1e6 / off:.5%} of a {off:.3f} ms step")
    print()
    print(md_header(["configuration", "ms/step (median)", "min..max", "vs off"], "lrlr"))
    for c in CONFIGS:
        med = median(samples[c])
        print(md_row([c, f"{med:.3f}", f"{min(samples[c]):.3f}..{max(samples[c]):.3f}", f"{med / off:.3f}x"]))
    print()
    print(f"slow-path record (user-line frame walk): {walk_us:.1f} us, against {item_us:.0f} us "
          f"for the .item() it belongs to ({walk_us / item_us:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
