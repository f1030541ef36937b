"""Concurrency stress: threads and trio tasks hammering several lazy devices with random graphs.

    python examples/stress.py [--seconds 10] [--threads 6] [--tasks 6]

Every result is verified against eager PyTorch; reports throughput and the slowest sync.
"""
from __future__ import annotations

import argparse
import os
import random
import threading
import time

import torch
import trio

if "LTC_ASYNC_DEVICES" not in os.environ and not torch.cuda.is_available():
    os.environ["LTC_ASYNC_DEVICES"] = "cpu,cpu,cpu"

import ltc_async as ltc  # noqa: E402

UNARY = [torch.tanh, torch.sigmoid, torch.relu, torch.exp, lambda t: t * 0.5, lambda t: t.t(), torch.neg,
         lambda t: torch.softmax(t, dim=-1), lambda t: t.clamp(-1, 1), lambda t: t.cumsum(0) / 8]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum, lambda a, b: a @ b / 16, torch.atan2]


def random_program(rng: random.Random) -> list:
    prog = []
    for _ in range(rng.randint(3, 25)):
        if rng.random() < 0.6:
            prog.append(("u", rng.randrange(len(UNARY))))
        else:
            prog.append(("b", rng.randrange(len(BINARY))))
    return prog


def run_program(prog: list, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x = a
    for kind, k in prog:
        x = UNARY[k](x) if kind == "u" else BINARY[k](x, b)
    return x


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.graphs = 0
        self.slowest = 0.0
        self.failures: list[str] = []

    def record(self, seconds: float, ok: bool, what: str) -> None:
        with self.lock:
            self.graphs += 1
            self.slowest = max(self.slowest, seconds)
            if not ok:
                self.failures.append(what)


def one(rng: random.Random, stats: Stats, devices: list) -> tuple:
    dev = rng.choice(devices)
    n = 16
    a, b = torch.randn(n, n) / 4, torch.randn(n, n) / 4
    prog = random_program(rng)
    lazy = run_program(prog, a.to(dev), b.to(dev))
    if rng.random() < 0.5:
        ltc.mark_step(dev)
    return dev, prog, a, b, lazy


def check(stats: Stats, item: tuple, host: torch.Tensor, t0: float) -> None:
    dev, prog, a, b, _ = item
    ref = run_program(prog, a, b)
    ok = torch.allclose(host, ref, rtol=1e-4, atol=1e-5, equal_nan=True)
    stats.record(time.perf_counter() - t0, ok, f"{dev} {prog}")


def thread_worker(seed: int, stop: float, stats: Stats, devices: list) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < stop:
        item = one(rng, stats, devices)
        t0 = time.perf_counter()
        check(stats, item, item[4].cpu(), t0)


async def trio_worker(seed: int, stop: float, stats: Stats, devices: list) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < stop:
        item = one(rng, stats, devices)
        t0 = time.perf_counter()
        (host,) = await ltc.to_cpu_async([item[4]])
        check(stats, item, host, t0)


async def trio_main(args: argparse.Namespace, stop: float, stats: Stats, devices: list) -> None:
    async with trio.open_nursery() as nursery:
        for k in range(args.tasks):
            nursery.start_soon(trio_worker, 1000 + k, stop, stats, devices)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=6)
    args = ap.parse_args()
    devices = ltc.devices()
    stats = Stats()
    stop = time.perf_counter() + args.seconds
    threads = [threading.Thread(target=thread_worker, args=(k, stop, stats, devices), daemon=True)
               for k in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    trio.run(trio_main, args, stop, stats, devices)
    for t in threads:
        t.join(timeout=args.seconds + 60)
    hung = [t for t in threads if t.is_alive()]
    ltc.wait_device_ops()
    elapsed = time.perf_counter() - t0
    print(f"{len(devices)} devices, {args.threads} threads + {args.tasks} trio tasks, {elapsed:.1f}s")
    print(f"{stats.graphs} random graphs verified against eager ({stats.graphs / elapsed:.0f}/s), "
          f"slowest sync {stats.slowest * 1e3:.1f} ms, compiles {ltc.metrics.counter_value('UncachedCompile')}")
    if hung or stats.failures:
        for f in stats.failures[:5]:
            print("MISMATCH", f)
        raise SystemExit(f"FAILED: {len(stats.failures)} mismatches, {len(hung)} threads hung")
    print("all results match eager")


if __name__ == "__main__":
    main()
