"""In-process data parallelism over lazy devices.

Design note.  `DataParallel` keeps one replica of a module (and one optimizer) per lazy device.
A step splits the batch into one shard per device, traces forward/backward on every replica,
then averages the gradients with `all_reduce_`, which stays lazy:

1. each device flattens its gradients into one bucket (lazy `cat`), and the buckets of all
   devices are scheduled under one barrier across their lockers;
2. every bucket is transferred to every other device (a closure on the target device's worker
   that waits for the source execution: no host wait, no global lock);
3. each device sums the N buckets *in device order* and unflattens the result into its grads.
   Every device adds the same values in the same order, so replicas stay bit-identical.

The optimizer step is then traced on every replica and `mark_step` schedules all devices.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch

from . import api
from .executor import arena
from .executor import graph_executor as gx
from .tensor.lazy_tensor import unwrap

__all__ = ["DataParallel", "DistributedDataParallel", "all_reduce_", "broadcast_",
           "all_reduce_across_processes_"]


def all_reduce_(per_device: Sequence[Sequence[torch.Tensor]], op: str = "mean") -> None:
    """In place, lazily: make tensor i of every device the sum (or mean) over devices.

    `per_device[d]` lists the tensors held on device d; all lists match in length and shapes.
    """
    if op not in ("sum", "mean"):
        raise ValueError(f"all_reduce_: op must be 'sum' or 'mean', got {op!r}")
    n = len(per_device)
    if n == 0:
        return
    sizes = [len(ts) for ts in per_device]
    if len(set(sizes)) != 1:
        raise ValueError(f"all_reduce_: every device needs the same tensors, got counts {sizes}")
    if n == 1 and op == "sum":
        return
    with torch.no_grad():
        buckets = [torch.cat([t.reshape(-1) for t in ts]) for ts in per_device]
        devices = [b.device for b in buckets]
        gx.sync_multi([unwrap(b) for b in buckets])          # one barrier over all devices
        for d, ts in enumerate(per_device):
            total = None
            for src in range(n):                            # same order on every device
                part = buckets[src] if src == d else buckets[src].to(devices[d])
                total = part if total is None else total + part
            if op == "mean":
                total = total / n
            offset = 0
            for t in ts:
                k = t.numel()
                t.copy_(total[offset:offset + k].view_as(t))
                offset += k


def broadcast_(per_device: Sequence[Sequence[torch.Tensor]], src: int = 0) -> None:
    """In place, lazily: copy device `src`'s tensors to the same tensors on every device."""
    with torch.no_grad():
        for d, ts in enumerate(per_device):
            if d != src:
                for t, s in zip(ts, per_device[src]):
                    t.copy_(s.to(t.device))


def all_reduce_across_processes_(tensors: Sequence[torch.Tensor], op: str = "mean", group: Any = None) -> None:
    """In place: sum (or average) `tensors` over the processes of a `torch.distributed` group.

    The tensors (typically a replica's gradients, all on one lazy device) are bucketed into
    one flat lazy tensor, so the step boundary costs one collective, not one per gradient.
    """
    import torch.distributed as dist
    if op not in ("sum", "mean"):
        raise ValueError(f"all_reduce_across_processes_: op must be 'sum' or 'mean', got {op!r}")
    tensors = list(tensors)
    if not tensors:
        return
    with torch.no_grad():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=group)
        if op == "mean":
            flat = flat / dist.get_world_size(group)
        offset = 0
        for t in tensors:
            k = t.numel()
            t.copy_(flat[offset:offset + k].view_as(t))
            offset += k


class DataParallel:
    """Replicate `module` over lazy devices and train the replicas in lock-step.

    >>> dp = DataParallel(model, make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    >>> losses = dp.step(x, y, torch.nn.functional.cross_entropy)   # one training step

    Replicas start identical (copies of `module`), receive equal shards of each batch, and
    apply the same averaged gradients, so they stay bit-identical to one another.
    """

    def __init__(self, module: torch.nn.Module, devices: Sequence[Any] | None = None,
                 make_optimizer: Callable[[Any], torch.optim.Optimizer] | None = None) -> None:
        ctxs = arena.resolve(devices)
        self.devices = [c.device for c in ctxs]
        self.replicas = [copy.deepcopy(module).to(d) for d in self.devices]
        self.optimizers = ([make_optimizer(r.parameters()) for r in self.replicas]
                           if make_optimizer is not None else [])

    def __len__(self) -> int:
        return len(self.devices)

    def parameters_per_device(self) -> list[list[torch.Tensor]]:
        return [list(r.parameters()) for r in self.replicas]

    def scatter(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """Split a host (or lazy) batch along dim 0 into one shard per device."""
        n = len(self.devices)
        if batch.shape[0] % n:
            raise ValueError(f"batch of {batch.shape[0]} does not split evenly over {n} devices; "
                             "use a batch size divisible by the device count")
        return [s.to(d) for s, d in zip(batch.chunk(n), self.devices)]

    def all_reduce_gradients(self) -> None:
        grads = [[p.grad for p in r.parameters() if p.grad is not None] for r in self.replicas]
        all_reduce_(grads, "mean")

    def step(self, inputs: torch.Tensor, targets: torch.Tensor,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """Forward/backward on every shard, average gradients, optimizer step, `mark_step`.

        Returns each device's shard loss (lazy tensors, read them when convenient).
        """
        if not self.optimizers:
            raise RuntimeError("DataParallel.step needs make_optimizer=... at construction")
        losses = []
        for replica, opt, x, y in zip(self.replicas, self.optimizers, self.scatter(inputs), self.scatter(targets)):
            opt.zero_grad()
            loss = loss_fn(replica(x), y)
            loss.backward()
            losses.append(loss)
        self.all_reduce_gradients()
        for opt in self.optimizers:
            opt.step()
        api.mark_step(self.devices)
        return losses


class DistributedDataParallel(torch.nn.Module):
    """`torch.nn.parallel.DistributedDataParallel` for modules on `ltc` devices: swap the class,
    keep the program (`ddp = DistributedDataParallel(model)`, `ddp(x)`, `loss.backward()`,
    `opt.step()`, `with ddp.no_sync():`, `ddp.module`).

    PyTorch's own DDP cannot run on `ltc`: its C++ reducer allocates gradient buckets and copies
    gradients into them below PyTorch's functionalization layer, which lazy tensors need to stay
    functional (it fails with "mutating a non-functional tensor with a functional tensor"); its
    communication hooks and `gradient_as_bucket_view` run inside that same reducer.  This class
    keeps DDP's semantics with the collectives ltc_async supports:

    * construction broadcasts parameters and buffers from rank 0 (`init_sync`);
    * before each forward, buffers (BatchNorm statistics) are broadcast from rank 0
      (`broadcast_buffers=True`, as DDP);
    * at the end of every backward that syncs, all gradients are averaged across processes as
      one lazy bucket (`all_reduce_across_processes_`: one collective per step, in order with
      the lazy work around it);
    * `no_sync()` accumulates gradients locally; the next syncing backward averages the sum;
    * with `find_unused_parameters=True` a parameter that got no gradient on this rank counts as
      zero; it gets a gradient if any rank used it (DDP's behaviour), else stays `None`.
      Without it, an unused parameter raises, as DDP does.
    """

    def __init__(self, module: torch.nn.Module, device_ids: Any = None, output_device: Any = None,
                 dim: int = 0, broadcast_buffers: bool | None = True, init_sync: bool = True,
                 process_group: Any = None, find_unused_parameters: bool = False,
                 **unused: Any) -> None:
        import torch.distributed as dist
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers is not False
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._queued = False
        if init_sync:
            with torch.no_grad():
                for t in list(module.parameters()) + list(module.buffers()):
                    dist.broadcast(t.data, 0, group=process_group)
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and torch.is_grad_enabled():
            import torch.distributed as dist
            with torch.no_grad():
                for b in self.module.buffers():
                    dist.broadcast(b.data, 0, group=self.process_group)
        return self.module(*args, **kwargs)

    def no_sync(self) -> Any:
        """Accumulate gradients without communication inside this block (as DDP)."""
        import contextlib

        @contextlib.contextmanager
        def ctx():
            old, self.require_backward_grad_sync = self.require_backward_grad_sync, False
            try:
                yield
            finally:
                self.require_backward_grad_sync = old
        return ctx()

    def _on_grad(self, _param: torch.Tensor) -> None:
        """First gradient of a syncing backward: average everything when the backward ends."""
        if self.require_backward_grad_sync and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._sync_gradients)

    def _sync_gradients(self) -> None:
        import torch.distributed as dist
        self._queued = False
        missing = [p for p in self._params if p.grad is None]
        if missing and not self.find_unused_parameters:
            raise RuntimeError(
                f"DistributedDataParallel: {len(missing)} parameter(s) received no gradient in this "
                "backward; pass find_unused_parameters=True (as with torch's DDP)")
        world = dist.get_world_size(self.process_group)
        with torch.no_grad():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
            if missing:   # which parameters any rank used: they all get the averaged gradient
                used = torch.stack([torch.ones((), device=p.device) if p.grad is not None
                                    else torch.zeros((), device=p.device) for p in self._params])
                all_reduce_across_processes_(grads + [used], op="sum", group=self.process_group)
                for g in grads:
                    g.div_(world)
                used_anywhere = used.cpu().tolist()
            else:
                all_reduce_across_processes_(grads, op="mean", group=self.process_group)
            for i, (p, g) in enumerate(zip(self._params, grads)):
                if p.grad is None and used_anywhere[i] > 0:
                    p.grad = g
