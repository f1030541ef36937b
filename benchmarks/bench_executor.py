"""Executor behaviour: what the async engine promises beyond raw speed (issue 8).

Sections (select with --only, repeatable; default: all):

  miss       `mark_step` latency on a graph-cache miss, as a fraction of that graph's compile
             time, for fresh graphs of 500 / 1500 / 3000 ops; beside it torch._lazy's
             `mark_step` on the same fresh graphs (it compiles inside `mark_step`).
  heartbeat  a trio training loop (MLP, batch size changing every 4 steps, so it recompiles)
             with a 1 ms heartbeat task: the longest gap between ticks while the loop awaits
             ltc_async's twins, and overall (which includes the task's own tracing, user code).
  queue      the host far ahead of the device (a heavy step traced in a few ms): device busy
             fraction (sum of ExecuteTime / wall) with the bounded queue, and how long each
             `mark_step` waited once the queue was full (about one execution: the oldest).

Medians over rounds; everything in one process, one run.  Usage (from the repository root):
  python -m benchmarks.bench_executor [--only miss] [--rounds N]
"""
from __future__ import annotations

import argparse
import gc
import time

import torch
import trio

import ltc_async as ltc
from benchmarks import engines
from benchmarks.cases import mlp
from benchmarks.harness import md_header, md_row, median, trace_and_mark


def _fresh_chain(x: torch.Tensor, n: int, salt: int) -> torch.Tensor:
    """About 3n ops; `salt` changes the op pattern, so every call is a new graph."""
    for i in range(n):
        x = torch.sin(x) * 1.5 + x if (i + salt) % 3 else torch.cos(x) - x * 0.25
    return x


def bench_miss(rounds: int) -> list[str]:
    lazy = engines.torch_lazy()
    lines = [md_header(["graph (ops)", "ltc_async mark_step (ms)", "its compile (ms)", "ratio",
                        "torch._lazy mark_step (ms)"], "rrrrr")]
    x = torch.randn(32, 32).to("ltc:0")
    lx = torch.randn(32, 32).to("lazy")
    lazy.mark_step()
    salt = 0
    for n in (167, 500, 1000):
        marks, compiles, lazies = [], [], []
        for _ in range(rounds):
            salt += 1
            y = _fresh_chain(x, n + salt, salt)
            ltc.metrics.reset()
            t0 = time.perf_counter()
            ltc.mark_step()
            marks.append(time.perf_counter() - t0)
            ltc.wait_device_ops()
            compiles.append(ltc.metrics.metric_data("CompileTime")[1])
            del y
            ly = _fresh_chain(lx, n + salt, salt)
            t0 = time.perf_counter()
            lazy.mark_step()
            lazies.append(time.perf_counter() - t0)
            lazy.wait_device_ops()
            del ly
        m, c, lz = (median(v) * 1e3 for v in (marks, compiles, lazies))
        lines.append(md_row([3 * n, f"{m:.2f}", f"{c:.1f}", f"{m / c:.1%}", f"{lz:.1f}"]))
    return lines


def bench_heartbeat(rounds: int, freeze: bool) -> list[str]:
    steps = 40

    async def loop(width: int) -> tuple[float, float, float, int]:
        torch.manual_seed(0)
        model = mlp([64, width, 10]).to("ltc:0")   # a width no earlier round used: every graph compiles
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ticks: list[float] = []
        awaiting: list[tuple[float, float]] = []

        async def heartbeat() -> None:
            while True:
                await trio.sleep(0.001)
                ticks.append(time.perf_counter())

        async def timed(coro) -> None:
            t0 = time.perf_counter()
            await coro
            awaiting.append((t0, time.perf_counter()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat)
            await trio.sleep(0.01)
            t_start = time.perf_counter()
            for i in range(steps):
                batch = 16 + 8 * ((i // 4) % 5)          # a new shape every 4 steps
                x = torch.randn(batch, 64).to("ltc:0")
                y = torch.randint(0, 10, (batch,)).to("ltc:0")
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                await timed(ltc.mark_step_async())
                if i % 4 == 3:
                    await timed(ltc.to_cpu_async([loss]))
            await timed(ltc.wait_device_ops_async())
            t_end = time.perf_counter()
            nursery.cancel_scope.cancel()
        pts = [t_start] + [t for t in ticks if t_start <= t <= t_end] + [t_end]
        gaps = [(a, b) for a, b in zip(pts, pts[1:])]
        overall = max(b - a for a, b in gaps)
        # what counts against the twins is the part of a gap that falls inside their awaits
        # (the rest is the task's own synchronous tracing, user code on the loop thread)
        inside = [max(0.0, min(b, e) - max(a, s)) for a, b in gaps for s, e in awaiting]
        recompiles = sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))
        return overall, max(inside, default=0.0), t_end - t_start, recompiles

    results = []
    for r in range(rounds):
        ltc.metrics.reset()
        if freeze:
            gc.freeze()
        try:
            results.append(trio.run(loop, 256 + 8 * r + (4 if freeze else 0)))
        finally:
            gc.unfreeze()
    overall, inside, wall, recompiles = (median(r[i] for r in results) for i in range(4))
    tag = "gc.freeze() after setup" if freeze else "default gc"
    return [md_row([tag, f"{inside * 1e3:.1f}", f"{overall * 1e3:.1f}", f"{wall * 1e3 / steps:.1f}",
                    f"{recompiles:.0f}"])]


def bench_queue(rounds: int) -> list[str]:
    x = (torch.randn(384, 384) / 20).to("ltc:0")

    def heavy(t: torch.Tensor, n: int) -> torch.Tensor:
        for _ in range(n):
            t = torch.tanh(t @ t)
        return t
    n = 4
    while True:   # one step = at least 40 ms of device work here
        ltc.sync([heavy(x, n)])
        t0 = time.perf_counter()
        ltc.sync([heavy(x, n)])
        if time.perf_counter() - t0 > 0.04 or n > 400:
            break
        n *= 2
    steps = 20
    busy, waits, traces = [], [], []
    for _ in range(rounds):
        ltc.wait_device_ops()
        ltc.metrics.reset()
        t0 = time.perf_counter()
        for _ in range(steps):
            t, m = trace_and_mark(lambda: heavy(x, n), ltc.mark_step)
            traces.append(t)
            waits.append(m)
        ltc.wait_device_ops()
        wall = time.perf_counter() - t0
        busy.append(ltc.metrics.metric_data("ExecuteTime")[1] / wall)
    execute = median(ltc.metrics.metric_data("ExecuteTime")[2]) * 1e3
    full_waits = sorted(waits)[len(waits) // 2:]   # the steps that found the queue full
    return [md_row([f"{median(traces) * 1e3:.1f}", f"{execute:.1f}", f"{median(full_waits) * 1e3:.1f}",
                    f"{median(busy):.1%}"])]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=["miss", "heartbeat", "queue"])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    only = args.only or ["miss", "heartbeat", "queue"]
    print(f"# ltc_async executor benchmark; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, max in flight {ltc.executor.arena.get(0).max_inflight}")
    if "miss" in only:
        print("\n## mark_step on a cache miss (goal: <= 5% of the compile)\n")
        print("\n".join(bench_miss(args.rounds)))
    if "heartbeat" in only:
        print("\n## trio heartbeat (1 ms) during a training loop that recompiles\n")
        print(md_header(["process", "longest gap while awaiting twins (ms)", "longest gap overall (ms)",
                         "ms/step", "graph-cache misses"], "lrrrr"))
        for freeze in (False, True):
            print("\n".join(bench_heartbeat(args.rounds, freeze)))
    if "queue" in only:
        print("\n## host ahead of the device: full queue\n")
        print(md_header(["trace (ms/step)", "execute (ms/step)", "mark_step wait when full (ms)",
                         "device busy"], "rrrr"))
        print("\n".join(bench_queue(args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
