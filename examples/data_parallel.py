"""Data-parallel training over several lazy devices in one process.

    python examples/data_parallel.py [--devices 2] [--steps 30]

Default: two virtual CPU devices here (each with its own worker and share of the cores); with
GPUs present, one device per GPU.  Trains the same model on one device and on N devices
(`ltc_async.parallel.DataParallel`: sharded batch, lazy all-reduce of the gradients, replicas
kept bit-identical), checks they agree, and prints per-device throughput and the speed-up.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

if "LTC_ASYNC_DEVICES" not in os.environ and not torch.cuda.is_available():
    os.environ["LTC_ASYNC_DEVICES"] = "cpu,cpu"

import ltc_async as ltc  # noqa: E402
from ltc_async.parallel import DataParallel  # noqa: E402


def make_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def batches(steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 256, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


def run(devices: list, data: list, hidden: int) -> tuple[float, DataParallel, list[float]]:
    dp = DataParallel(make_model(hidden), devices,
                      make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    loss_fn = torch.nn.functional.cross_entropy
    for x, y in data[:3]:                      # warm-up: compile every graph once
        dp.step(x, y, loss_fn)
    ltc.wait_device_ops(devices)
    losses = []
    t0 = time.perf_counter()
    for x, y in data[3:]:
        losses.append(dp.step(x, y, loss_fn))
    ltc.wait_device_ops(devices)
    elapsed = time.perf_counter() - t0
    return elapsed, dp, [sum(v.item() for v in ls) / len(ls) for ls in losses]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=len(ltc.devices()))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    all_devices = ltc.devices()[: args.devices]
    data = batches(args.steps + 3, args.batch)
    n = len(all_devices)
    print(f"devices: {', '.join(f'{d} -> {ltc.backend_device(d)}' for d in all_devices)}")

    t1, single, losses1 = run(all_devices[:1], data, args.hidden)
    tn, multi, lossesn = run(all_devices, data, args.hidden)
    steps = args.steps
    for r in multi.replicas[1:]:
        for p, q in zip(multi.replicas[0].parameters(), r.parameters()):
            assert torch.equal(p.cpu(), q.cpu()), "replicas diverged"
    for p, q in zip(single.replicas[0].parameters(), multi.replicas[0].parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu(), rtol=1e-3, atol=1e-4)
    print(f"1 device : {steps / t1:6.2f} steps/s, {steps * args.batch / t1:8.0f} samples/s")
    print(f"{n} devices: {steps / tn:6.2f} steps/s, {steps * args.batch / tn:8.0f} samples/s "
          f"({steps * args.batch / tn / n:.0f} samples/s per device)")
    print(f"speed-up over one device: {t1 / tn:.2f}x   (replicas bit-identical, "
          f"loss {lossesn[0]:.4f} -> {lossesn[-1]:.4f}, matches single-device training)")


if __name__ == "__main__":
    main()
