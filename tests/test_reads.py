"""Blocking reads that run their graph on the reading thread (`executor/read_here.py`).

Users' programs that read a value every step -- a greedy decoding loop, a training loop that
prints its loss, an evaluation under `torch.inference_mode()` in the middle of training, a
Ctrl-C at a read -- keep eager's values and behaviour, whichever thread ran the graph.
"""
from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import ON_CUDA, run_in_threads

import ltc_async as ltc
from ltc_async.base.config import config

DEV = "ltc:0"
on_cpu_backing = pytest.mark.skipif(ON_CUDA, reason="only CPU-backed devices run a read's graph on the reader")


def _decoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 50))


def _greedy(model: torch.nn.Module, prompt: torch.Tensor, steps: int, stop_token: int) -> list[int]:
    """A greedy decoding loop in the style of `generate()`: one token per step, the stopping
    check read on the host every step."""
    tokens = prompt
    finished = torch.zeros(1, dtype=torch.bool, device=prompt.device)
    for _ in range(steps):
        logits = model(tokens)[:, -1]
        nxt = logits.argmax(-1)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        finished = finished | (nxt == stop_token)
        if bool(finished.all()):
            break
    return tokens[0].tolist()


@pytest.mark.parametrize("read_here", [True, False], ids=["on_reader", "on_worker"])
def test_a_greedy_decoding_loop_matches_eager(monkeypatch, read_here):
    monkeypatch.setattr(config, "read_here", read_here)
    model = _decoder().eval()
    prompt = torch.tensor([[3, 14, 15, 9]])
    with torch.no_grad():
        want = _greedy(model, prompt, 12, stop_token=49)
        lazy = copy.deepcopy(model).to(DEV)
        ltc.metrics.reset()
        got = _greedy(lazy, prompt.to(DEV), 12, stop_token=49)
    assert got == want
    ran_here = ltc.metrics.counter_value("ExecutedOnReader") or 0
    if read_here and not ON_CUDA:
        assert ran_here >= 10, ran_here     # a read per token found the device idle
    else:
        assert ran_here == 0


def test_a_training_loop_that_prints_its_loss_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    x, y = torch.randn(64, 16), torch.randn(64, 1)

    def train(dev):
        m = copy.deepcopy(model).to(dev)
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        xs, ys = x.to(dev), y.to(dev)
        seen = []
        for _ in range(8):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(xs), ys)
            loss.backward()
            opt.step()
            seen.append(loss.item())
        return seen, [p.detach().cpu() for p in m.parameters()]
    want = train("cpu")
    got = train(DEV)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_evaluating_under_inference_mode_mid_training_matches_eager():
    """A read under `torch.inference_mode()` (an evaluation between training steps) runs a
    graph that also computes pending training state; that state must not come back as
    inference tensors, which the next steps could not update in place."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))

    def train(dev):
        m = copy.deepcopy(model).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        xs, ys = x.to(dev), y.to(dev)
        accuracies = []
        for _ in range(6):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(xs), ys).backward()
            opt.step()                       # pending: the read below computes it
            with torch.inference_mode():
                accuracies.append((m(xs).argmax(-1) == ys).float().mean().item())
        return accuracies, [p.detach().cpu() for p in m.parameters()]
    want = train("cpu")
    got = train(DEV)
    torch.testing.assert_close(got, want)


def test_reads_under_a_dispatch_mode_see_the_users_ops_only():
    """A user's dispatch mode on the reading thread sees its own program's ops, never the
    backend's kernels of the graph the read runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.devices = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.devices.add(t.device.type)
            return out
    w = torch.randn(16, 16)
    lazy = w.to(DEV)
    with Names() as mode:
        got = (lazy @ lazy).relu().sum().item()
    assert mode.devices <= {"ltc", "meta"}, mode.devices   # no backend (cpu) tensor was seen
    assert got == pytest.approx(float((w @ w).relu().sum()), rel=1e-5)


@on_cpu_backing
def test_a_read_from_another_thread_keeps_the_devices_order():
    """One thread reads every step while another queues steps on the same device: each value
    is the one its program order gives."""
    base = torch.arange(6, dtype=torch.float32)

    def reader(k):
        x = (base + k).to(DEV)
        for i in range(40):
            x = x * 1.0 + 1
            assert x.sum().item() == pytest.approx(float((base + k + i + 1).sum()))

    def stepper(k):
        y = (base * k).to(DEV)
        for _ in range(40):
            y = y + 2
            ltc.mark_step([DEV])
        torch.testing.assert_close(y.cpu(), base * k + 80)
    run_in_threads(lambda k: reader(k) if k % 2 else stepper(k), [(1,), (2,), (3,)], timeout=120,
                   switch_interval=1e-5)


_CTRL_C = r"""
import time, torch, ltc_async as ltc
torch.manual_seed(0)
x = torch.randn(1536, 1536) / 40
t = time.perf_counter()
torch.tanh(x @ x)
n = max(10, min(400, int(3.0 / max(time.perf_counter() - t, 1e-4))))   # a graph of ~3 s
ref = x
for _ in range(n):                       # the eager reference first: nothing runs after the read
    ref = torch.tanh(ref @ ref)
y = x.to("ltc:0")
ltc.wait_device_ops()
for _ in range(n):                       # seconds of work in a graph of few nodes
    y = torch.tanh(y @ y)
print("reading", flush=True)
try:
    y.sum().item()
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
print("values", torch.allclose(y.cpu(), ref, rtol=1e-4, atol=1e-5), flush=True)
print("on reader", ltc.metrics.counter_value("ExecutedOnReader") or 0, flush=True)
"""


@on_cpu_backing
def test_ctrl_c_at_a_read_interrupts_the_read_and_keeps_the_work():
    """Ctrl-C while a read waits for a long graph raises `KeyboardInterrupt` at the read, as it
    does in eager; the graph's results stay usable (none of its work is lost)."""
    p = subprocess.Popen([sys.executable, "-c", _CTRL_C], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "LTC_ASYNC_DEVICES": "cpu"})
    try:
        assert p.stdout.readline().strip() == "reading", p.stderr.read()
        time.sleep(0.5)                          # inside the read, the graph running
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    lines = out.split()
    assert "values True" in out, (out, err[-3000:])
    # the graph takes seconds: the signal came during it; where the read ran the graph itself,
    # the interrupt is raised once the graph has run
    assert "interrupted" in lines, (out, err[-2000:])
    assert ("on reader 1" in out) == config.read_here, out     # the read's graph ran on the reader


def test_a_slow_graph_read_from_a_worker_thread_with_the_main_thread_busy():
    """A read on a non-main thread (a data-loader or serving thread) while the main thread keeps
    tracing: both finish with their values."""
    results = {}

    def serve():
        x = torch.ones(64, 64, device=DEV)
        for _ in range(20):
            x = torch.tanh(x @ x / 64)
        results["served"] = x.sum().item()
    t = threading.Thread(target=serve)
    t.start()
    y = torch.zeros(8, device=DEV)
    for _ in range(50):
        y = y + 1
    t.join(60)
    assert not t.is_alive()
    assert y.sum().item() == 400
    ref = torch.ones(64, 64)
    for _ in range(20):
        ref = torch.tanh(ref @ ref / 64)
    assert results["served"] == pytest.approx(float(ref.sum()), rel=1e-5)


@on_cpu_backing
def test_a_read_of_two_devices_lets_their_workers_run_while_another_thread_queues():
    """A read that needs graphs of two devices at once (an eager fallback over tensors of both)
    hands them to their workers, which run side by side; work another thread queues on the
    same devices meanwhile runs after them, each value the one program order gives."""
    from ltc_async.executor import graph_executor as gx
    from ltc_async.tensor.lazy_tensor import unwrap
    if len(ltc.devices()) < 2:
        pytest.skip("needs two devices")
    base = torch.arange(8, dtype=torch.float32)
    stop = threading.Event()
    queued = {"n": 0}

    def stepper():
        y = base.to("ltc:0")
        while not stop.is_set():
            y = y + 1
            ltc.mark_step(["ltc:0"])
            queued["n"] += 1
        queued["y"] = y.cpu()

    t = threading.Thread(target=stepper)
    t.start()
    try:
        a, b = base.to("ltc:0"), base.to("ltc:1")
        for i in range(60):
            a, b = a * 2 - base.to("ltc:0"), b + i
            got_a, got_b = gx.read([unwrap(a), unwrap(b)])
            torch.testing.assert_close(got_a, base)                      # a stays `base`
            torch.testing.assert_close(got_b, base + i * (i + 1) / 2)
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()
    torch.testing.assert_close(queued["y"], base + queued["n"])


def test_a_read_inside_a_read_neither_hangs_nor_mixes_values():
    """Code run while a read is under way reads another tensor (a diagnostics hook, a
    finalizer): both reads return their values; nothing waits for itself."""
    from ltc_async.base import events
    side = torch.arange(4, dtype=torch.float32).to("ltc:0")
    seen = []

    def hook():
        if not seen:
            seen.append(None)
            seen.append((side * 3).sum().item())     # a nested read on the same device
    got = {}

    def read():
        x = torch.ones(16, 16, device="ltc:0")
        got["value"] = (x @ x).sum().item()
    events.read_begins.subscribe(hook)
    try:
        run_in_threads(lambda: read(), [()], timeout=60)   # a hang fails the test, not the suite
    finally:
        events.read_begins.unsubscribe(hook)
    assert got["value"] == 16 * 16 * 16
    assert seen[1] == 18.0
