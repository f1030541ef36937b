"""One rank of the 2-process torch.distributed test (started by test_multidevice.py)."""
from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist

import ltc_async as ltc
from ltc_async.parallel import all_reduce_across_processes_


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = "ltc:0"

    # collectives on lazy tensors, in order with the lazy work around them
    t = (torch.arange(4.0) + rank).to(dev) * 2          # pending lazy work before the collective
    dist.all_reduce(t)
    after = t + 1                                       # lazy work after it
    expect = sum((torch.arange(4.0) + r) * 2 for r in range(world))
    torch.testing.assert_close(after.cpu(), expect + 1)

    b = torch.full((3,), float(rank), device=dev)
    dist.broadcast(b, src=1)
    torch.testing.assert_close(b.cpu(), torch.full((3,), 1.0))

    parts = [torch.zeros(2, device=dev) for _ in range(world)]
    dist.all_gather(parts, torch.full((2,), float(rank + 5), device=dev))
    for r, p in enumerate(parts):
        torch.testing.assert_close(p.cpu(), torch.full((2,), float(r + 5)))

    out = torch.zeros(2 * world, device=dev)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank), device=dev))
    torch.testing.assert_close(out.cpu(), torch.arange(world).repeat_interleave(2).float())

    rs = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * world).to(dev) * (rank + 1))
    full = sum(torch.arange(2.0 * world) * (r + 1) for r in range(world))
    torch.testing.assert_close(rs.cpu(), full[2 * rank:2 * rank + 2])

    # data-parallel training: each rank trains on its shard, gradients averaged across ranks;
    # compared with single-process eager training on the whole batch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    reference = copy.deepcopy(model)
    lazy = copy.deepcopy(model).to(dev)
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.functional.cross_entropy
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
        shard = slice(rank * 4, rank * 4 + 4)
        opt.zero_grad()
        loss_fn(lazy(x[shard].to(dev)), y[shard].to(dev)).backward()
        all_reduce_across_processes_([p.grad for p in lazy.parameters()])
        opt.step()
        ltc.mark_step()
        ref_opt.zero_grad()
        loss_fn(reference(x), y).backward()
        ref_opt.step()
    for p, q in zip(lazy.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    dist.destroy_process_group()
    print(f"rank {rank} ok", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.exit(1)
