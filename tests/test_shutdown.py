"""Exit with queued work, Ctrl-C at exit, and memory that stays flat over thousands of steps,
failing steps included."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import ltc_async as ltc
from conftest import heavy_prelude
from ltc_async.executor import arena
from ltc_async.executor import graph_executor as gx
from ltc_async.executor.futures import BackendData, Execution
from ltc_async.ir.node import Node

_QUEUED = heavy_prelude(0.25) + r"""
import sys
steps = int(sys.argv[1])
for _ in range(steps):
    x = heavy(x, n) * 0.999 + 0.001
    ltc.mark_step()
ltc.add_step_closure(lambda: print("final", round(float(x.sum().item()), 3), flush=True), run_async=True)
(x * 0).sum()                                # a tensor so the closure has a step to follow
ltc.mark_step()
print("scheduled", n, flush=True)
"""


def _expected(n: int, steps: int) -> float:
    torch.manual_seed(0)
    x = torch.randn(384, 384) / 20
    for _ in range(steps):
        for _ in range(n):
            x = torch.tanh(x @ x)
        x = x * 0.999 + 0.001
    return round(float(x.sum().item()), 3)


def test_exit_completes_queued_work_and_closures():
    """Exiting with seconds of work queued: the process waits for it (and the closures queued
    after it), never aborts."""
    steps = 12
    r = subprocess.run([sys.executable, "-c", _QUEUED, str(steps)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "LTC_ASYNC_DEVICES": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "terminate called" not in r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    n = int(lines["scheduled"])
    got = float(lines["final"])
    assert abs(got - _expected(n, steps)) <= 1e-3 * max(1.0, abs(got)), (got, _expected(n, steps))


def test_ctrl_c_at_exit_cancels_queued_work_cleanly():
    p = subprocess.Popen([sys.executable, "-c", _QUEUED, "40"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "LTC_ASYNC_DEVICES": "cpu"})
    try:
        line = p.stdout.readline()
        assert line.startswith("scheduled"), (line, p.stderr.read())
        time.sleep(0.5)                      # now in the exit hook, draining ~10 s of work
        t0 = time.perf_counter()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        took = time.perf_counter() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != -signal.SIGABRT and "terminate called" not in err, err[-3000:]
    assert "cancelling queued work" in err, err[-3000:]
    assert took < 5.0, took                 # the running execution finishes, the rest is dropped
    assert "final" not in out               # cancelled: the closure never ran


def _count(cls: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is cls)


@pytest.mark.kernel_assert
def test_memory_is_flat_over_thousands_of_steps_with_failures():
    """Training steps with a failing gather beside them, errors caught by reads and barriers:
    IR nodes, device data, executions, pending errors and the graph cache stay constant."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to("ltc:0")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16).to("ltc:0")
    bad_idx = torch.tensor([0, 40]).to("ltc:0")
    ctx = arena.get("ltc:0")

    def run(n: int) -> None:
        for i in range(n):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            bad = x.index_select(1, bad_idx).sum()
            ltc.mark_step()
            if i % 2:
                try:
                    bad.item()
                except ltc.ComputationError:
                    pass
            elif i % 10 == 0:
                try:
                    ltc.wait_device_ops()
                except ltc.ExecutionError:
                    pass
        try:
            ltc.wait_device_ops()
        except ltc.ExecutionError:
            pass

    run(50)
    gc.collect()          # what an earlier test left in reference cycles is not this loop's
    base = (_count(Node), _count(BackendData), _count(Execution), len(gx.cache), ctx.live_count(),
            len(ctx._errors))
    run(1500)
    gc.collect()
    after = (_count(Node), _count(BackendData), _count(Execution), len(gx.cache), ctx.live_count(),
             len(ctx._errors))
    assert after == base, f"(nodes, data, executions, cache, live, errors) grew from {base} to {after}"
    assert all(torch.isfinite(p.cpu()).all() for p in model.parameters()), "training went on"


@pytest.mark.kernel_assert
def test_unread_failures_do_not_pile_up():
    """A loop that never reaches a barrier keeps a bounded number of pending errors; the next
    barrier reports them all (those not kept are counted)."""
    x = torch.arange(4.0).to("ltc:1")
    idx = torch.tensor([9]).to("ltc:1")
    outs = []
    for _ in range(100):
        outs.append(x.index_select(0, idx) + 1)
        ltc.mark_step()
    try:
        ltc.wait_device_ops()
    except ltc.ExecutionError as e:
        assert str(e).startswith("100 executions failed"), str(e)[:200]
        assert len(e.errors) <= 64
    else:
        raise AssertionError("the failures must be reported")
    ltc.wait_device_ops()
