"""One rank of PyTorch's own DistributedDataParallel on an `ltc` model (run by test_ddp.py as
torchrun would: RANK, WORLD_SIZE, MASTER_ADDR/PORT), checked against a reference.

VARIANT (environment) picks the DDP configuration; the reference is single-process eager on the
full batches, or PyTorch's DDP on CPU tensors in the same processes where the variant changes
the math (BatchNorm's per-rank statistics, fp16-compressed gradients).  Prints
"rank R VARIANT ok {counters}" on success.
"""
import copy
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import ltc_async as ltc

V = os.environ.get("VARIANT", "default")
STEPS = 4


class Net(torch.nn.Module):
    def __init__(self, batchnorm: bool, unused: bool) -> None:
        super().__init__()
        self.a = torch.nn.Linear(20, 32)
        self.bn = torch.nn.BatchNorm1d(32) if batchnorm else torch.nn.Identity()
        self.b = torch.nn.Linear(32, 5)
        self.unused = torch.nn.Linear(3, 3) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.bn(self.a(x))))


def train(net: torch.nn.Module, rank: int, world: int, device: str | None, ddp: bool) -> None:
    if V == "zero" and ddp:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.1, **({} if V == "zero" else {"momentum": 0.9}))
    g = torch.Generator().manual_seed(1)
    micro = 3 if V == "no_sync" else 1
    for _ in range(STEPS):
        for k in range(micro):
            x = torch.randn(8 * world, 20, generator=g)
            y = torch.randint(0, 5, (8 * world,), generator=g)
            if ddp:                                   # this rank's shard
                x, y = x.chunk(world)[rank], y.chunk(world)[rank]
            if device:
                x, y = x.to(device), y.to(device)
            quiet = ddp and V == "no_sync" and k < micro - 1
            with (net.no_sync() if quiet else torch.enable_grad()):
                (torch.nn.functional.cross_entropy(net(x), y) / micro).backward()
        opt.step()
        opt.zero_grad()
        if device:
            ltc.mark_step()


def wrap(model: torch.nn.Module) -> torch.nn.Module:
    kw = {"bucket_view": {"gradient_as_bucket_view": True}, "static_graph": {"static_graph": True},
          "find_unused": {"find_unused_parameters": True}}.get(V, {})
    ddp = torch.nn.parallel.DistributedDataParallel(model, **kw)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    if V == "allreduce_hook":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif V == "fp16_hook":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif V == "bf16_hook":
        # PyTorch's own `bf16_compress_hook` refuses to register without NCCL (by its name);
        # the same math under another name runs over gloo
        def bf16_compress(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            return default_hooks._compress_hook(torch.bfloat16, state, bucket)
        ddp.register_comm_hook(None, bf16_compress)
    return ddp


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = Net(batchnorm=V == "batchnorm", unused=V in ("find_unused", "static_graph"))
    lazy = copy.deepcopy(model).to("ltc:0")
    ltc.metrics.reset()
    train(wrap(lazy), rank, world, "ltc:0", True)
    ltc.wait_device_ops()             # every queued collective issued before the reference's
    ref = copy.deepcopy(model)
    if V in ("batchnorm", "fp16_hook", "bf16_hook"):
        train(wrap(ref), rank, world, None, True)
    else:
        train(ref, rank, world, None, False)
    for (name, a), b in zip(lazy.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=name)
    m = ltc.metrics
    counts = {n: m.counter_value(n) for n in m.counter_names()
              if (n.startswith("EagerFallback") or n.startswith("Collective::")) and m.counter_value(n)}
    print(f"rank {rank} {V} ok {counts}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
