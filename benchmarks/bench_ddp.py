"""DistributedDataParallel over gloo: 1 vs 2 processes, PyTorch's own DDP on `ltc:0` and
ltc_async's DDP drop-in on `ltc:0` beside PyTorch's DDP on eager CPU tensors, in the same
processes and the same run.

    python -m benchmarks.bench_ddp [--steps 30] [--rounds 3]   # from the repository root

Each rank trains an MLP (256-1024-1024-10) on its shard of a global batch of 512 (so more
processes = less work each, the same global step).  Figures: steps/s (median over rounds,
each round `steps` steps ending with a wait), and for ltc_async the fraction of the step's wall
time the device was busy (sum of ExecuteTime / wall), the gradient all-reduce's time per step
on the device queue (`CollectiveTime`), what the host paid per step to queue it
(`CollectiveHostTime`) and so the share of the communication hidden from the host: the host
traces the optimizer step and the next step while the all-reduce runs.  (On one device per
process the all-reduce runs on that device's FIFO queue, between the backward graph that
produces the gradients and the optimizer graph that consumes them: in DDP's step nothing else
could run beside it.)"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

from benchmarks.harness import md_header, md_row, median, noop, rerun, time_steps


def _rank_main(steps: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    import ltc_async as ltc
    from benchmarks.cases import mlp, sgd
    from ltc_async.parallel import DistributedDataParallel
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return mlp([256, 1024, 1024, 10])
    x = torch.randn(512 // world, 256)
    y = torch.randint(0, 10, (512 // world,))

    def run(device: str | None, own: bool = False) -> tuple[float, float]:
        m = model()
        if device:
            m = m.to(device)
            net = DistributedDataParallel(m) if own else torch.nn.parallel.DistributedDataParallel(m)
            xb, yb = x.to(device), y.to(device)
        else:
            net = torch.nn.parallel.DistributedDataParallel(m)
            xb, yb = x, y
        opt = sgd(m.parameters())
        wait = ltc.wait_device_ops if device else noop

        def step() -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xb), yb).backward()
            opt.step()
            if device:
                ltc.mark_step()
        for _ in range(3):
            step()
        wait()
        rates, busy, comm, host = [], [], [], []
        for _ in range(rounds):
            dist.barrier()
            ltc.metrics.reset()
            wall = time_steps(step, steps, wait) * steps
            rates.append(steps / wall)
            if device:
                busy.append(ltc.metrics.metric_data("ExecuteTime")[1] / wall)
                c = ltc.metrics.metric_data("CollectiveTime")
                h = ltc.metrics.metric_data("CollectiveHostTime")
                comm.append(c[1] / steps if c else 0.0)     # communication per step (device queue)
                host.append(h[1] / steps if h else 0.0)     # what the host paid per step for it
        return (median(rates), median(busy) if busy else 0.0, median(comm) if comm else 0.0,
                median(host) if host else 0.0)

    eager_rate = run(None)[0]
    own_rate = run("ltc:0", own=True)[0]
    lazy_rate, lazy_busy, comm_s, host_s = run("ltc:0")
    if rank == 0:
        print(f"RESULT {world} {eager_rate:.2f} {lazy_rate:.2f} {lazy_busy:.3f} {comm_s:.6f} {host_s:.6f} "
              f"{own_rate:.2f}", flush=True)
    dist.destroy_process_group()


def _launch(world: int, steps: int, rounds: int) -> list[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(world), "LTC_ASYNC_DEVICES": "cpu", "LTC_ASYNC_CPU_THREADS": "1"}
    procs = [subprocess.Popen(rerun(__spec__, "--rank-main", str(steps), str(rounds)),
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True)
             for r in range(world)]
    out = [p.communicate(timeout=900)[0] for p in procs]
    line = next(l for l in out[0].splitlines() if l.startswith("RESULT"))
    return [float(v) for v in line.split()[2:]]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        _rank_main(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    res = {w: _launch(w, args.steps, args.rounds) for w in (1, 2)}
    print(md_header(["processes", "torch DDP, eager CPU (steps/s)", "torch DDP on ltc (steps/s)",
                     "ltc / eager", "ltc_async's own DDP on ltc (steps/s)", "own / torch DDP on ltc",
                     "ltc device busy", "all-reduce per step (device queue)", "host time in it per step",
                     "hidden from the host"], "r" * 10))
    for w, (e, l, b, c, h, o) in res.items():
        hidden = f"{1 - h / c:.0%}" if c > 0 else "n/a"
        print(md_row([w, f"{e:.2f}", f"{l:.2f}", f"{l / e:.2f}x", f"{o:.2f}", f"{o / l:.2f}x", f"{b:.0%}",
                      f"{c * 1e3:.2f} ms", f"{h * 1e3:.3f} ms", hidden]))
    print(f"\nscaling 1 -> 2 processes: eager {res[2][0] / res[1][0]:.2f}x, "
          f"torch DDP on ltc {res[2][1] / res[1][1]:.2f}x, own DDP {res[2][5] / res[1][5]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
