"""Data-parallel training across processes: torchrun + torch.distributed (gloo) + ltc devices.

    torchrun --nproc-per-node=2 examples/ddp_train.py
    LTC_ASYNC_DEVICES=cpu,cpu torchrun --nproc-per-node=2 examples/ddp_train.py   # 2 lazy devices per process

Each rank trains a replica on its shard of every batch with `ltc_async.parallel.
DistributedDataParallel` (the drop-in for `torch.nn.parallel.DistributedDataParallel`, faster
on lazy devices: one collective per step; `DDP_IMPL=torch` runs PyTorch's own), prints its
progress, and rank 0 checks the final model against single-process eager training on the full
batches.

Options (environment): `DDP_IMPL=torch` (PyTorch's own DistributedDataParallel on the `ltc`
model instead of ltc_async's drop-in), `DDP_STEPS` (default 30), `DDP_ACCUMULATE` (micro-batches per step with
`no_sync()`, default 1), `DDP_BATCHNORM=1` (a BatchNorm layer: buffers broadcast from rank 0,
checked against PyTorch's DDP on CPU tensors instead of single-process training).
"""
from __future__ import annotations

import copy
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ltc_async as ltc
from ltc_async.parallel import DistributedDataParallel


def make_model(batchnorm: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(20, 64), torch.nn.Tanh()]
    if batchnorm:
        layers.append(torch.nn.BatchNorm1d(64))
    layers += [torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5)]
    return torch.nn.Sequential(*layers)


def batches(steps: int, micro: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(42)
    return [(torch.randn(batch, 20, generator=g), torch.randint(0, 5, (batch,), generator=g))
            for _ in range(steps * micro)]


def train(model: torch.nn.Module, data: list, micro: int, rank: int, world: int,
          device: str | None, wrapper=None, report=None) -> torch.nn.Module:
    """One loop for every variant: `wrapper` (a DDP class) or None (single process, full batch)."""
    net = wrapper(model) if wrapper is not None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(len(data) // micro):
        opt.zero_grad()
        for k in range(micro):
            x, y = data[step * micro + k]
            if wrapper is not None:           # this rank's shard of the batch
                x, y = x.chunk(world)[rank], y.chunk(world)[rank]
            if device is not None:
                x, y = x.to(device), y.to(device)
            sync = wrapper is None or k == micro - 1
            ctx = net.no_sync() if not sync else _nothing()
            with ctx:
                loss = torch.nn.functional.cross_entropy(net(x), y) / micro
                loss.backward()
        opt.step()
        if device is not None:
            ltc.mark_step()
        if report is not None:
            report(step, loss)
    return model


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    steps = int(os.environ.get("DDP_STEPS", "30"))
    micro = int(os.environ.get("DDP_ACCUMULATE", "1"))
    batchnorm = os.environ.get("DDP_BATCHNORM") == "1"
    device = f"ltc:{len(ltc.devices()) - 1}"          # the last lazy device of this process
    data = batches(steps, micro, 8 * world)
    t0 = time.perf_counter()

    def report(step: int, loss: torch.Tensor) -> None:
        if step % 10 == 0 or step == steps - 1:
            print(f"rank {rank}/{world} step {step:3d} loss {loss.item() * micro:.4f} "
                  f"({time.perf_counter() - t0:.1f}s)", flush=True)

    model = make_model(batchnorm)
    impl = torch.nn.parallel.DistributedDataParallel if os.environ.get("DDP_IMPL") == "torch" \
        else DistributedDataParallel
    lazy = train(copy.deepcopy(model).to(device), data, micro, rank, world, device, impl, report)
    ltc.wait_device_ops()   # queued collectives issued before the reference's host ones
    got = [t.detach().cpu() for t in list(lazy.parameters()) + list(lazy.buffers())]
    if batchnorm:   # the reference: PyTorch's own DDP on CPU tensors, same processes
        ref = train(copy.deepcopy(model), data, micro, rank, world, None,
                    torch.nn.parallel.DistributedDataParallel)
    else:           # the reference: one process, eager, the full batches
        ref = train(copy.deepcopy(model), data, micro, 0, 1, None)
    want = [t.detach() for t in list(ref.parameters()) + list(ref.buffers())]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    reference = "torch DDP on CPU" if batchnorm else "single-process eager on the full batch"
    print(f"rank {rank}: final model matches {reference} ({time.perf_counter() - t0:.1f}s)",
          flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
