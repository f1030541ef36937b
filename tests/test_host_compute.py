"""Reads computed on the host (`tensor/host_compute.py`): a value read with `.item()` or
`bool(t)` that is an exact function of small constants the host has is computed there, with no
device round trip, and equals eager's every time -- an ODE solver stepping through its time
grid, a schedule tested against a step counter kept on the device."""
from __future__ import annotations

import warnings

import pytest
import torch
from conftest import ON_CUDA

import ltc_async as ltc

DEV = "ltc:0"
on_cpu_backing = pytest.mark.skipif(ON_CUDA, reason="constants of a CUDA-backed device are not on the host")


def _trips() -> int:
    return sum(ltc.metrics.host_round_trips().values())


def _grid_walk(dev: str, step_size: float) -> list:
    """torchdiffeq's fixed-grid loop, as written there: the grid is computed on the device from
    the user's `t`, and each of its points is compared with `t` on the host."""
    t = torch.linspace(0, 1, 7).to(dev)
    start, end = t[0], t[-1]
    niters = torch.ceil((end - start) / step_size + 1).item()
    grid = torch.arange(0, niters, dtype=t.dtype, device=dev) * step_size + start
    grid[-1] = t[-1]
    visits, j = [], 1
    for t0, t1 in zip(grid[:-1], grid[1:]):
        while j < len(t) and t1 >= t[j]:
            visits.append((int(niters), j, bool(t1 == t[j]), float(t1 - t0)))
            j += 1
    return visits


@on_cpu_backing
@pytest.mark.parametrize("step_size", [0.1, 1 / 6, 0.05, 0.3])
def test_an_ode_time_grid_is_walked_like_eager_without_round_trips(step_size):
    want = _grid_walk("cpu", step_size)
    ltc.metrics.reset()
    got = _grid_walk(DEV, step_size)
    assert got == want   # the same decisions at every float equality boundary, the same values
    assert _trips() == 0
    assert ltc.metrics.counter_value("ReadOnHost") >= len(want)


@on_cpu_backing
def test_float_boundaries_decide_like_eager():
    # sums that eager rounds to just above or below the other side: 0.1 + 0.2 != 0.3, ...
    def decisions(dev):
        a = torch.tensor([0.1, 0.7, 1e-8, 3.0, 16777216.0], dtype=torch.float32).to(dev)
        b = torch.tensor([0.2, 0.1, 1.0, 1 / 3, 1.0], dtype=torch.float32).to(dev)
        c = torch.tensor([0.3, 0.8, 1.0, 1.0, 16777217.0], dtype=torch.float32).to(dev)
        out = []
        for i in range(5):
            s = a[i] + b[i]
            out += [bool(s == c[i]), bool(s > c[i]), bool(a[i] * 3 / b[i] >= c[i]),
                    (s.double() - c[i].double()).item(), torch.round(a[i] / b[i]).item()]
        return out
    want = decisions("cpu")
    ltc.metrics.reset()
    assert decisions(DEV) == want
    assert _trips() == 0


def test_a_value_that_needs_the_device_is_still_read():
    # a float reduction (its order may differ on a device), a value computed by the model:
    # read as before, and right
    x = torch.linspace(0, 1, 100)
    w = torch.nn.Linear(100, 1)
    want = (x.sum().item(), w(x).item())
    lazy = w.to(DEV)
    ltc.metrics.reset()
    xl = x.to(DEV)
    got = (xl.sum().item(), lazy(xl).item())
    assert got == pytest.approx(want, rel=1e-6)
    assert _trips() == 2
    ltc.mark_step()


@on_cpu_backing
def test_a_read_computed_on_the_host_is_still_seen_by_the_sync_guard():
    t = torch.arange(5.0).to(DEV)
    with ltc.sync_guard("raise"):
        with pytest.raises(ltc.UnexpectedSyncError):
            bool(t[1] > t[0])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with ltc.sync_guard("warn"):
            assert (t[2] * 2).item() == 4.0
    assert any(issubclass(w.category, ltc.UnexpectedSyncWarning) for w in seen)
    assert ltc.metrics.counter_value("DataDependentSync") >= 2


@on_cpu_backing
def test_a_step_counter_on_the_device_keeps_the_training_step_one_pending_graph():
    # warm-up by a counter kept as a tensor: the test reads it every step; the step's graph
    # is cut once, at mark_step, and trains like eager
    def train(dev):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)).to(dev)
        warmup = torch.tensor(3).to(dev)
        for step in range(6):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            if bool(torch.tensor(step).to(dev) < warmup):   # lr ramps up during warm-up
                loss = loss * 0.5
            loss.backward()
            opt.step()
            if dev != "cpu":
                ltc.mark_step()
        return list(model.parameters())
    want = train("cpu")
    ltc.metrics.reset()
    got = train(DEV)
    assert _trips() == 0 and ltc.metrics.counter_value("ReadOnHost") == 6
    assert ltc.metrics.counter_value("SyncTensorsGraphCount") == 6
    for a, b in zip(got, want):
        torch.testing.assert_close(a.detach().cpu(), b.detach())


@on_cpu_backing
def test_a_value_read_once_is_known_to_later_reads():
    # a loss read to the host, then compared with thresholds: one read, the comparisons on the host
    w = torch.nn.Linear(3, 1).to(DEV)
    loss = w(torch.ones(1, 3).to(DEV)).pow(2).sum()
    ltc.metrics.reset()
    value = loss.item()
    assert [bool(loss > 0.5), bool(loss * 2 <= value * 2), (loss - value).item()] == \
        [value > 0.5, True, 0.0]
    assert _trips() == 1 and ltc.metrics.counter_value("ReadOnHost") == 3


@on_cpu_backing
def test_an_adaptive_loop_reads_once_then_decides_on_the_host():
    # an adaptive solver's pattern: an error estimate computed on the device and read, then
    # compared with several tolerances (the comparisons need no second read)
    def loop(dev):
        torch.manual_seed(0)
        f = torch.nn.Linear(3, 3).to(dev)
        y = torch.ones(2, 3).to(dev)
        h = torch.tensor(0.5).to(dev)
        decisions = []
        for _ in range(4):
            err = (f(y) - y).abs().max()
            err_value = err.item()                       # the one read of the step
            ok = bool(err * h < 0.7)
            decisions.append((err_value, ok, bool(err / h > 1.0), (h * 2).item()))
            h = torch.where(err * h < 0.7, h * 1.5, h * 0.5)
            y = y + h * f(y)
        return decisions
    want = loop("cpu")
    ltc.metrics.reset()
    got = loop(DEV)
    assert [d[1:] for d in got] == [d[1:] for d in want]
    assert [d[0] for d in got] == pytest.approx([d[0] for d in want], rel=1e-6)
    assert _trips() == 4   # the error estimate of each step; the rest on the host


@pytest.mark.kernel_assert
def test_a_failed_execution_is_still_raised_by_the_next_read():
    # values made by an execution no barrier has covered are read from the device: a failure
    # there is raised at this read, as before (never skipped by a host computation)
    x = torch.arange(3.0).to(DEV)
    bad = x.index_select(0, torch.tensor([7]).to(DEV))
    total = x.sum()
    ltc.mark_step()
    with pytest.raises(ltc.ExecutionError):
        bool(total > 0)
    assert bool(total > 0)        # reported once; the value was computed and is known now
    with pytest.raises(ltc.ComputationError):
        bad.cpu()
    assert (x * 2).sum().item() == 6.0
