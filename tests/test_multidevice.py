"""Several lazy devices: concurrency, transfers, barriers, data parallel, torch.distributed."""
from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

import ltc_async as ltc
from conftest import assert_eager, heavy, run_in_threads, run_python
from ltc_async.executor import arena
from ltc_async.executor.device import lock_devices
from ltc_async.parallel import DataParallel, all_reduce_

HERE = os.path.dirname(os.path.abspath(__file__))


def _input(seed: int, size: int = 512) -> torch.Tensor:
    return torch.randn(size, size, generator=torch.Generator().manual_seed(seed)) / size ** 0.5


def test_two_devices_run_concurrently():
    xs = [_input(k, 768).to(f"ltc:{k}") for k in range(2)]
    for k in range(2):                       # warm up both devices (compile, profiling runs)
        heavy(xs[k], 10)
        ltc.mark_step(f"ltc:{k}", wait=True)

    def timed(devs: list[int]) -> float:
        ys = [heavy(xs[k], 10) for k in devs]
        t0 = time.perf_counter()
        ltc.mark_step([f"ltc:{k}" for k in devs])
        ltc.wait_device_ops([f"ltc:{k}" for k in devs])
        del ys
        return time.perf_counter() - t0
    one = min(timed([0]) for _ in range(3))    # the best of 3: one slow round is the machine's
    both = min(timed([0, 1]) for _ in range(3))
    # The machine's own capacity for two such computations at once, measured here: two host
    # threads with one intra-op thread each (what each CPU device worker gets).
    hosts = [x.cpu() for x in xs]

    def eager(k: int) -> None:
        torch.set_num_threads(1)
        heavy(hosts[k], 10)

    def timed_eager(n: int) -> float:
        threads = [threading.Thread(target=eager, args=(k,)) for k in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0
    saved = torch.get_num_threads()
    try:
        machine = min(timed_eager(2) for _ in range(2)) / min(timed_eager(1) for _ in range(2))
    finally:
        torch.set_num_threads(saved)
    # each CPU device owns its share of the cores: two graphs at once take about as long as one
    # (ratio ~1 on an idle 2-core machine, 2 if the devices were serialised); the bound follows
    # what the machine itself manages right now, so an external load cannot fail the test
    assert both / one < max(1.6, 1.3 * machine), (one, both, machine)


def test_cross_device_transfer_is_ordered_and_correct():
    host = _input(3, 256)
    a = heavy(host.to("ltc:0"), 4)
    ltc.mark_step("ltc:0")                   # still running on ltc:0 ...
    b = a.to("ltc:1")                        # ... the copy waits for it on ltc:1's queue
    assert b.device == torch.device("ltc:1")
    c = (b * 2).sum(0)
    ref = heavy(host, 4)
    assert_eager(c, (ref * 2).sum(0), rtol=1e-4, atol=1e-4)
    # pending IR on the source is scheduled by the transfer itself
    d = (a + 1).to("ltc:1") - 1
    assert_eager(d, ref, rtol=1e-4, atol=1e-5)
    back = d.to("ltc:0")
    assert back.device == torch.device("ltc:0")
    assert_eager(back, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="same device"):
        a + b


def test_barrier_lock_order_does_not_deadlock():
    ctxs = arena.contexts()
    stop = time.monotonic() + 2.0

    def hammer(order: list[int]) -> None:
        k = 0
        while time.monotonic() < stop:
            with lock_devices([ctxs[i] for i in order]):
                k += 1
            x = torch.ones(4, device=f"ltc:{order[0]}") * k
            y = torch.ones(4, device=f"ltc:{order[-1]}") * k
            ltc.sync([x, y])                 # a barrier over both devices, named in this order
            ltc.mark_step([f"ltc:{i}" for i in order])
            assert x.cpu().tolist() == [float(k)] * 4
    run_in_threads(hammer, [([0, 1],), ([1, 0],), ([1, 0],), ([0, 1],)], timeout=60)


def test_all_reduce_across_devices():
    a = [torch.full((3,), 1.0).to("ltc:0"), torch.arange(4.0).to("ltc:0")]
    b = [torch.full((3,), 3.0).to("ltc:1"), torch.arange(4.0).to("ltc:1") * 3]
    all_reduce_([a, b], "mean")
    for ts in (a, b):
        torch.testing.assert_close(ts[0].cpu(), torch.full((3,), 2.0))
        torch.testing.assert_close(ts[1].cpu(), torch.arange(4.0) * 2)
    assert a[1].device == torch.device("ltc:0") and b[1].device == torch.device("ltc:1")


def test_data_parallel_matches_single_device_and_replicas_are_identical():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    dp = DataParallel(model, make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    assert len(dp) == 2
    loss_fn = torch.nn.functional.cross_entropy
    for step in range(8):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        losses = dp.step(x, y, loss_fn)
        ref_opt.zero_grad()
        ref_loss = loss_fn(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        torch.testing.assert_close((losses[0].cpu() + losses[1].cpu()) / 2, ref_loss.detach(),
                                   rtol=1e-5, atol=1e-6)
    for p0, p1, pr in zip(dp.replicas[0].parameters(), dp.replicas[1].parameters(), reference.parameters()):
        assert p0.device == torch.device("ltc:0") and p1.device == torch.device("ltc:1")
        assert torch.equal(p0.cpu(), p1.cpu()), "replicas must stay bit-identical"
        torch.testing.assert_close(p0.cpu(), pr.detach(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="split evenly"):
        dp.step(torch.randn(3, 32), torch.zeros(3, dtype=torch.long), loss_fn)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo_training_and_collectives():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               LTC_ASYNC_DEVICES="cpu")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py")],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, f"rank {r} failed:\n{err[-3000:]}"
        assert f"rank {r} ok" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_matches_eager():
    code = ("import torch, ltc_async as ltc\n"
            "ltc.init(devices=['cuda:0'])\n"
            "x = torch.randn(64, 64)\n"
            "y = (x.to('ltc:0') @ x.to('ltc:0')).relu().sum(0)\n"
            "ltc.mark_step()\n"
            "torch.testing.assert_close(y.cpu(), (x.cuda() @ x.cuda()).relu().sum(0).cpu(), rtol=1e-4, atol=1e-4)\n"
            "assert ltc.backend_device('ltc:0') == torch.device('cuda', 0)\n"
            "print('ok')\n")
    assert run_python(code, timeout=300).strip() == "ok"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_on_a_cuda_backed_device_matches_eager():
    """The user's promise on a GPU: the same training loop, device string `ltc:0` (cuda:0
    underneath), the same parameters as eager after a few SGD steps (eager on the CPU: an eager
    CUDA backward cannot run in a process that imported ltc_async, see the next test)."""
    code = ("import copy, torch, ltc_async as ltc\n"
            "ltc.init(devices=['cuda:0'])\n"
            "torch.manual_seed(0)\n"
            "ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))\n"
            "model = copy.deepcopy(ref).to('ltc:0')\n"
            "x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))\n"
            "for m, dev in ((ref, 'cpu'), (model, 'ltc:0')):\n"
            "    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)\n"
            "    for _ in range(4):\n"
            "        opt.zero_grad()\n"
            "        torch.nn.functional.cross_entropy(m(x.to(dev)), y.to(dev)).backward()\n"
            "        opt.step()\n"
            "        ltc.mark_step()\n"
            "for a, b in zip(ref.parameters(), model.parameters()):\n"
            "    torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-5)\n"
            "assert ltc.metrics.counter_value('EagerFallback') in (None, 0)\n"
            "print('ok')\n")
    assert run_python(code, timeout=300).strip().splitlines()[-1] == "ok"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_eager_cuda_backward_beside_ltc_async_works_or_says_why():
    """PyTorch's autograd fails an internal assert for an eager CUDA backward once a PrivateUse1
    backend is registered (pytorch/pytorch#161129): the user gets an error that names the cause
    and the way out instead, and the ltc device stays usable.  Should PyTorch fix it, the
    backward must simply be right."""
    code = ("import torch, ltc_async as ltc\n"
            "w = torch.randn(4, 4, device='cuda', requires_grad=True)\n"
            "try:\n"
            "    (w * 2).sum().backward()\n"
            "    torch.testing.assert_close(w.grad, torch.full_like(w, 2.0))\n"
            "    print('backward ran')\n"
            "except RuntimeError as e:\n"
            "    assert '161129' in str(e) and 'INTERNAL ASSERT' not in str(e), str(e)\n"
            "    print('refused clearly')\n"
            "x = torch.ones(3, device='ltc:0', requires_grad=True)\n"
            "(x * 3).sum().backward()\n"
            "torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 3.0))\n"
            "print('ok')\n")
    out = run_python(code, timeout=300).strip().splitlines()
    assert out[-1] == "ok" and out[0] in ("backward ran", "refused clearly"), out


def test_stress_example_runs_clean_in_bounded_time():
    """examples/stress.py: threads and trio tasks on three devices, every result checked."""
    env = dict(os.environ, LTC_ASYNC_DEVICES="cpu,cpu,cpu")
    script = os.path.join(os.path.dirname(HERE), "examples", "stress.py")
    r = subprocess.run([sys.executable, script, "--seconds", "4", "--threads", "4", "--tasks", "4"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all results match eager" in r.stdout


def test_torch_data_parallel_over_ltc_devices_trains_like_eager_and_leaves_cpu_modules_alone():
    # the old-script pattern: `model = nn.DataParallel(model)`, CPU batches in, loss on the
    # output's device; over both lazy devices it trains like one eager model; a CPU model
    # wrapped the same way (a no-op without GPUs) keeps running on the CPU
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)) for _ in range(3)]

    def train(device: str, wrap: bool) -> tuple:
        model = copy.deepcopy(base).to(device)
        run = torch.nn.DataParallel(model) if wrap else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches:
            opt.zero_grad()
            out = run(x if wrap else x.to(device))
            torch.nn.functional.mse_loss(out, y.to(out.device)).backward()
            opt.step()
            if device != "cpu":
                ltc.mark_step()
        return model[0].weight.detach().cpu(), out.detach().cpu(), out.device, run

    want = train("cpu", False)
    for device in ("cpu", "ltc:0"):
        weight, out, where, run = train(device, True)
        torch.testing.assert_close(weight, want[0])
        torch.testing.assert_close(out, want[1])
        assert where == torch.device(device)
    assert train("cpu", True)[3].device_ids == []
    assert train("ltc:0", True)[3].device_ids == list(range(len(ltc.devices())))
    # dict outputs (transformers' ModelOutput is one) gather per key
    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = copy.deepcopy(base)

        def forward(self, x: torch.Tensor) -> dict:
            return {"logits": self.body(x), "loss": self.body(x).square().mean()}
    out = torch.nn.DataParallel(Head().to("ltc:0"))(batches[0][0])
    torch.testing.assert_close(out["logits"].cpu(), base(batches[0][0]))
    halves = batches[0][0].chunk(2)
    torch.testing.assert_close(out["loss"].cpu(), torch.stack([base(h).square().mean() for h in halves]))
