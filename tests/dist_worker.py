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

    # every collective, sync and async_op=True, on inputs in each state: pending IR, device
    # data, the placeholder result of an earlier collective; compared with eager's values
    def state_of(host: torch.Tensor, state: str) -> torch.Tensor:
        if state == "pending":
            return host.to(dev) * 1
        if state == "data":
            d = host.to(dev)
            ltc.mark_step()
            return d
        d = (host / world).to(dev)        # "previous": all-reduced just before (still queued)
        dist.all_reduce(d)
        return d
    mine = torch.arange(4.0) * (rank + 1)

    def host_of(r: int, state: str) -> torch.Tensor:   # what rank r's input holds, on the host
        return sum(torch.arange(4.0) * (q + 1) / world for q in range(world)) if state == "previous" \
            else torch.arange(4.0) * (r + 1)
    for async_op in (False, True):
        for state in ("pending", "data", "previous"):
            works = []
            x = state_of(mine, state)
            works.append(dist.all_reduce(x, async_op=async_op))
            y = state_of(mine, state)
            works.append(dist.broadcast(y, src=world - 1, async_op=async_op))
            parts = [torch.zeros(4, device=dev) for _ in range(world)]
            works.append(dist.all_gather(parts, state_of(mine, state), async_op=async_op))
            flat = torch.zeros(4 * world, device=dev)
            works.append(dist.all_gather_into_tensor(flat, state_of(mine, state), async_op=async_op))
            rs = torch.zeros(4, device=dev)
            works.append(dist.reduce_scatter_tensor(rs, state_of(torch.cat([mine] * world), state),
                                                    async_op=async_op))
            for w in works:
                if async_op:
                    w.wait()
            want = sum(host_of(r, state) for r in range(world))
            torch.testing.assert_close((x + 0).cpu(), want, msg=f"all_reduce {state} async={async_op}")
            torch.testing.assert_close(y.cpu(), host_of(world - 1, state))
            for r, part in enumerate(parts):
                torch.testing.assert_close(part.cpu(), host_of(r, state))
            torch.testing.assert_close(flat.cpu(), torch.cat([host_of(r, state) for r in range(world)]))
            torch.testing.assert_close(rs.cpu(), want, msg=f"reduce_scatter {state} async={async_op}")

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
