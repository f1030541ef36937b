"""Across processes: DistributedDataParallel on ltc devices over gloo (2 and 4 processes), the
torchrun example, unused parameters, a rank that dies.  Every run is bounded in time."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "ddp_train.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str], world: int, env: dict | None = None, timeout: float = 240) -> list[tuple[int, str, str]]:
    """Start `world` ranks of `python args...` (what torchrun does) and collect their output."""
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(world), "LTC_ASYNC_DEVICES": "cpu", "OMP_NUM_THREADS": "1", **(env or {})}
    procs = [subprocess.Popen([sys.executable, *args], env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


@pytest.mark.parametrize("world,env,reference", [
    (2, {}, "single-process eager"),
    (4, {}, "single-process eager"),
    (2, {"DDP_ACCUMULATE": "3"}, "single-process eager"),          # no_sync() accumulation
    (2, {"DDP_BATCHNORM": "1"}, "torch DDP on CPU"),               # buffers broadcast
    (2, {"LTC_ASYNC_DEVICES": "cpu,cpu"}, "single-process eager"),  # 2 lazy devices per process
    (2, {"DDP_IMPL": "torch", "DDP_ACCUMULATE": "2"}, "single-process eager"),  # PyTorch's own DDP
], ids=["2proc", "4proc", "no_sync", "batchnorm", "2devices_per_proc", "torch_ddp"])
def test_ddp_example_trains_like_the_reference(world, env, reference):
    outs = _launch([EXAMPLE], world, {"DDP_STEPS": "12", **env})
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, f"rank {r} failed:\n{err[-3000:]}"
        assert f"rank {r}: final model matches {reference}" in out, out
        assert f"rank {r}/{world} step" in out   # per-rank progress


_UNUSED = textwrap.dedent("""
    import os, copy, torch, torch.distributed as dist
    import ltc_async as ltc
    from ltc_async.parallel import DistributedDataParallel
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)

    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.never = (torch.nn.Linear(4, 2) for _ in range(3))
        def forward(self, x):             # rank 1 never uses `b`; nobody uses `never`
            return self.a(x) + (self.b(x) if rank == 0 else 0)

    torch.manual_seed(0)
    model = Branchy()
    x = torch.randn(3, 4) + rank
    lazy = DistributedDataParallel(copy.deepcopy(model).to("ltc:0"), find_unused_parameters=True)
    lazy(x.to("ltc:0")).pow(2).sum().backward()
    ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model), find_unused_parameters=True)
    ref(x).pow(2).sum().backward()
    for (name, p), q in zip(ref.module.named_parameters(), lazy.module.parameters()):
        assert (p.grad is None) == (q.grad is None), (name, p.grad, q.grad)
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)
    strict = DistributedDataParallel(copy.deepcopy(model).to("ltc:0"))
    try:
        strict(x.to("ltc:0")).sum().backward()
    except RuntimeError as e:
        assert "find_unused_parameters" in str(e)
    else:
        raise AssertionError("unused parameters must raise without find_unused_parameters")
    print(f"rank {rank} ok", flush=True)
    dist.destroy_process_group()
""")


def test_unused_parameters_like_torch_ddp():
    outs = _launch(["-c", _UNUSED], 2)
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, f"rank {r} failed:\n{err[-3000:]}"
        assert f"rank {r} ok" in out


_DYING = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from datetime import timedelta
    import ltc_async as ltc
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=5))
    t = torch.ones(3).to("ltc:0") * 2
    if rank == 1:
        os._exit(3)                      # dies before the collective
    try:
        dist.all_reduce(t)               # queued on the device: returns at once, as on NCCL
        t.cpu()                          # the read raises the collective's error
    except RuntimeError as e:
        print("rank 0 got:", type(e).__name__, str(e)[:200], flush=True)
        assert (torch.ones(2).to("ltc:0") + 1).cpu().tolist() == [2.0, 2.0]   # device still fine
        os._exit(0)
    os._exit(1)
""")


_ASYNC = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    import ltc_async as ltc
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for late in (0.0, 3.0):              # a warm-up round (first traces), then the timed one
        dist.barrier()
        if rank == 1:
            time.sleep(late)             # the peer is late: rank 0's host must not wait for it
        w = torch.full((4, 4), 1.0 + rank).to("ltc:0")
        g = (w @ w).sum(0)               # pending IR: the collective waits for it on the device
        t0 = time.perf_counter()
        work = dist.all_reduce(g, async_op=True)
        work.wait()                      # complete for the host; later uses order after it
        h = g * 0.5 + 1                  # traced on the placeholder while the peer sleeps
        queued = time.perf_counter() - t0
        got = h.cpu()
        total = time.perf_counter() - t0
    want = ((torch.full((4, 4), 1.0) @ torch.full((4, 4), 1.0)).sum(0)
            + (torch.full((4, 4), 2.0) @ torch.full((4, 4), 2.0)).sum(0)) * 0.5 + 1
    assert torch.equal(got, want), (got, want)
    dist.all_reduce(g)                   # the sync form is queued too
    assert torch.equal(g.cpu(), (want - 1) * 4), g.cpu()
    print(f"rank {rank} ok queued={queued:.3f} total={total:.3f}", flush=True)
""")


def test_a_collective_is_queued_not_waited_for():
    """The host goes on tracing while a collective waits for its inputs and its peers."""
    outs = _launch(["-c", _ASYNC], 2, timeout=120)
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, f"rank {r} failed:\n{err[-3000:]}"
    stats = dict(kv.split("=") for kv in outs[0][1].split("ok ")[1].split())
    # rank 0 queued the collective and traced on in well under the peer's 3 s delay ...
    assert float(stats["queued"]) < 1.0, stats
    # ... and its read waited for the peer
    assert float(stats["total"]) > 1.5, stats


def test_a_dead_rank_makes_the_others_raise_not_hang():
    t0 = time.monotonic()
    outs = _launch(["-c", _DYING], 2, timeout=120)
    assert outs[1][0] == 3
    code, out, err = outs[0]
    assert code == 0 and "rank 0 got: " in out, (code, out, err[-2000:])
    assert time.monotonic() - t0 < 100


_VIEW = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    import ltc_async as ltc
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.arange(6.0).to("ltc:0") * (rank + 1)
    dist.all_reduce(t[2:4])              # a view: the write must reach the base, as in eager
    assert t.cpu().tolist() == [0.0, rank + 1.0, 6.0, 9.0, 4.0 * (rank + 1), 5.0 * (rank + 1)], t.cpu()
    # a view of a parameter, asynchronously; another view of the same base sees the write
    w = torch.nn.Parameter(torch.full((2, 3), float(rank)).to("ltc:0"))
    row, col = w.data[1], w.data[:, 0]
    dist.broadcast(row, src=1, async_op=True).wait()
    assert w.cpu().tolist() == [[rank] * 3, [1.0] * 3], w.cpu()
    assert col.cpu().tolist() == [float(rank), 1.0], col.cpu()
    # gathering into views of one buffer (pending IR before, lazy work after)
    buf = torch.zeros(2, 2).to("ltc:0") + 0
    dist.all_gather([buf[0], buf[1]], torch.tensor([rank, rank + 10.0]).to("ltc:0") * 1)
    assert (buf * 2).cpu().tolist() == [[0.0, 20.0], [2.0, 22.0]], buf.cpu()
    print(f"rank {rank} ok", flush=True)
""")


def test_collective_on_a_view_writes_through_to_the_base():
    outs = _launch(["-c", _VIEW], 2, timeout=120)
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, f"rank {r} failed:\n{err[-3000:]}"


# -- PyTorch's own DistributedDataParallel --------------------------------------------------------

TORCH_DDP = os.path.join(HERE, "torch_ddp_worker.py")


@pytest.mark.parametrize("variant,world", [
    ("default", 2), ("default", 4), ("bucket_view", 2), ("no_sync", 2), ("allreduce_hook", 2),
    ("fp16_hook", 2), ("bf16_hook", 2), ("batchnorm", 2), ("zero", 2),
    # the reducer stages its used-parameter map through pinned host memory: the native hooks
    # (`ltc_async/native`, built by `make setup`) provide it
    ("static_graph", 2), ("find_unused", 2),
])
def test_torch_ddp_wraps_an_ltc_model_and_trains_like_the_reference(variant, world):
    outs = _launch([TORCH_DDP], world, {"VARIANT": variant}, timeout=180)
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, f"rank {r} failed:\n{err[-3000:]}"
        assert f"rank {r} {variant} ok" in out, out
        counts = eval(out.split(" ok ")[1])          # noqa: S307 - our own worker's dict
        assert not any(k.startswith("EagerFallback") for k in counts), counts
        assert counts.get("Collective::allreduce_", 0) >= 4, counts   # queued on the device


_MIXED = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    import ltc_async as ltc
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # an ltc collective queued behind pending work on one rank, then a CPU tensor's collective
    # (a metric) that the other rank reaches first: each must meet its own counterpart
    for round in range(3):
        a = torch.full((4,), 1.0 + rank).to("ltc:0")
        if rank == 0:
            m = torch.randn(300, 300).to("ltc:0")
            for _ in range(30):
                m = torch.tanh(m @ m * 0.01)
            a = a + 0 * m.sum()
        dist.all_reduce(a)
        if rank == 1:
            time.sleep(0.2)
        b = torch.full((4,), 100.0 * (1 + rank))
        dist.all_reduce(b)
        assert a.cpu().tolist() == [3.0] * 4 and b.tolist() == [300.0] * 4, (a.cpu(), b)
        names = [None] * world
        dist.all_gather_object(names, f"rank{rank}")
        assert names == ["rank0", "rank1"], names
    # PyTorch's DDP with uneven work, a CPU sample count all-reduced every step, and the
    # "wait for rank 0 to save" barrier at each epoch's end
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to("ltc:0"))
    opt = torch.optim.SGD(model.parameters(), 0.01)
    for epoch in range(2):
        for step in range(4):
            x = torch.randn(512 if rank == 0 else 4, 64).to("ltc:0")
            loss = model(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            seen = torch.tensor([float(x.shape[0])])
            dist.all_reduce(seen)
            assert seen.item() == 516.0, seen
            ltc.mark_step()
        dist.barrier()
    print(f"rank {rank} ok", flush=True)
    dist.destroy_process_group()
""")


def _every_rank_ok(script: str, world: int = 2) -> None:
    """Run `script` on `world` ranks: each must exit cleanly and print `rank <r> ok`."""
    for r, (code, out, err) in enumerate(_launch(["-c", script], world, timeout=180)):
        assert code == 0, f"rank {r} failed:\n{err[-3000:]}"
        assert f"rank {r} ok" in out, out


def test_host_and_ltc_collectives_mixed_meet_in_program_order():
    _every_rank_ok(_MIXED)


_SYNC_BN = """
import os, copy, torch, torch.distributed as dist
import ltc_async as ltc
from torch.nn.parallel import DistributedDataParallel as DDP
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                           torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 3, 8, 8, generator=g) * 2 + 1, torch.randn(8, 2, generator=g)) for _ in range(3)]
# the reference: one process, plain BatchNorm over the whole batch
ref = copy.deepcopy(base)
opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for x, y in batches:
    opt.zero_grad(); torch.nn.functional.mse_loss(ref(x), y).backward(); opt.step()
model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(base)).to("ltc:0"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in batches:
    xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
    opt.zero_grad()
    # DDP averages gradients over ranks; the loss of a half batch is half the full batch's mean
    torch.nn.functional.mse_loss(model(xs.to("ltc:0")), ys.to("ltc:0")).backward(); opt.step()
    ltc.mark_step()
got = model.module
for a, b in [(got[0].weight, ref[0].weight), (got[1].running_mean, ref[1].running_mean), (got[1].running_var, ref[1].running_var), (got[1].weight, ref[1].weight), (got[4].weight, ref[4].weight)]:
    torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5)
assert not ltc.metrics.counter_value("EagerFallback"), ltc.metrics.report()
print(f"rank {rank} ok", flush=True)
dist.destroy_process_group()
"""


def test_sync_batch_norm_under_ddp_trains_like_batch_norm_on_the_whole_batch():
    # nn.SyncBatchNorm (CUDA-only kernels in PyTorch): each rank holds half of every batch, the
    # statistics are the whole batch's; parameters and running stats equal one process's
    # BatchNorm over the whole batches, with no eager fallback
    _every_rank_ok(_SYNC_BN)
