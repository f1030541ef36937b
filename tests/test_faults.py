"""Fault injection through the backend seam, and bad input at execution time.

A training-like program runs on two devices (with cross-device transfers) while the backend of
ltc:1 fails executions at random.  With salvage off (LTC's semantics: the whole graph fails)
every injected failure must be reported exactly once (by `wait_device_ops` or by a read), its
tensors and everything computed from them raise `ComputationError`, every other tensor equals
eager, and nothing hangs.  With salvage on (the default) the failed graphs are recomputed on the
interpreter, so every value equals eager and no error is reported.  Both also under trio.

`LTC_FAULT_STEPS` sets the program length (CI: 40 steps; `make reliability`: more).
"""
from __future__ import annotations

import os
import random

import pytest
import torch
import trio

import ltc_async as ltc
from conftest import assert_eager, watchdog
from faults import FaultInjector, FaultyBackend, MarkerBackend, backend_wrapped
from ltc_async.base.config import config

STEPS = int(os.environ.get("LTC_FAULT_STEPS", "40"))


class Ledger:
    """Which failed executions were reported, and how (each must be reported once)."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, int, bool]] = []   # (device, seq, own failure?)
        self.reported: set[tuple[str, int]] = set()

    def add(self, device: torch.device, seq: int, own: bool) -> None:
        key = (str(device), seq)
        assert key not in self.reported, f"execution {key} reported twice"
        self.reported.add(key)
        self.reports.append((str(device), seq, own))

    def execution_error(self, e: ltc.ExecutionError) -> None:
        assert e.errors, "an ExecutionError lists the failures it reports"
        for x in e.errors:
            self.add(x.device, x.seq, x.upstream is None)

    def own(self) -> int:
        return sum(1 for _, _, own in self.reports if own)


def _program(seed: int):
    """Yields, per step, the (lazy, eager) pairs the step computed; the caller schedules."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    hw = [torch.randn(8, 8, generator=g) / 3 for _ in range(2)]
    lw = [w.to(f"ltc:{d}") for d, w in enumerate(hw)]
    for s in range(STEPS):
        pairs = []
        for d in range(2):
            x = torch.randn(4, 8, generator=g)
            pairs.append((torch.tanh(x.to(f"ltc:{d}") @ lw[d]) * (s + 1), torch.tanh(x @ hw[d]) * (s + 1)))
        if rng.random() < 0.4:   # ltc:0 consumes ltc:1's result of this step
            y1, r1 = pairs[1]
            pairs.append((y1.to("ltc:0").sum(0) + 1, r1.sum(0) + 1))
        yield pairs, rng.choice(["wait", "read", "later"])


def _check_read(ledger: Ledger, lazy: torch.Tensor, ref: torch.Tensor, counts_as_report: bool) -> bool:
    """Read `lazy`: equal to eager, or a ComputationError for a reported (or now reported)
    failure.  Returns True if it failed."""
    while True:
        try:
            host = lazy.cpu()
        except ltc.ComputationError as e:
            if counts_as_report:
                if (str(e.device), e.seq) not in ledger.reported:
                    ledger.add(e.device, e.seq, e.upstream is None)
            else:
                assert (str(e.device), e.seq) in ledger.reported, "a failed read of an unreported execution"
            return True
        except ltc.ExecutionError as e:   # another covered failure: reported here, read again
            ledger.execution_error(e)
            continue
        torch.testing.assert_close(host, ref, rtol=1e-4, atol=1e-5)
        return False


def _run_blocking(seed: int, ledger: Ledger) -> int:
    later: list = []
    failed = 0
    for pairs, mode in _program(seed):
        ltc.mark_step()
        if mode == "wait":
            try:
                ltc.wait_device_ops()
            except ltc.ExecutionError as e:
                ledger.execution_error(e)
            failed += sum(_check_read(ledger, a, b, counts_as_report=False) for a, b in pairs)
        elif mode == "read":
            failed += sum(_check_read(ledger, a, b, counts_as_report=True) for a, b in pairs)
        else:
            later.extend(pairs)
    failed += sum(_check_read(ledger, a, b, counts_as_report=True) for a, b in later)
    try:
        ltc.wait_device_ops()
    except ltc.ExecutionError as e:
        ledger.execution_error(e)
    ltc.wait_device_ops()   # nothing left: each failure was reported once
    return failed


@pytest.fixture
def salvage_off(monkeypatch):
    monkeypatch.setattr(config, "salvage", False)


def test_injected_failures_are_reported_exactly_once(salvage_off):
    injector = FaultInjector(rate=0.3, devices=[1], seed=1)
    ledger = Ledger()
    with watchdog(300), backend_wrapped(lambda b: FaultyBackend(b, injector)):
        failed_reads = _run_blocking(seed=1, ledger=ledger)
    assert injector.injected >= 3, "the program must actually hit faults"
    assert ledger.own() == injector.injected
    assert failed_reads >= injector.injected
    upstream = [r for r in ledger.reports if not r[2]]
    assert all(dev == "ltc:0" for dev, _, _ in upstream), "only consumers on ltc:0 fail upstream"
    # and the devices are fine afterwards
    assert_eager(torch.arange(6.0).to("ltc:1") * 2, torch.arange(6.0) * 2)


def test_injected_failures_heal_when_salvaged(metrics):
    injector = FaultInjector(rate=0.3, devices=[1], seed=2)
    ledger = Ledger()
    with watchdog(300), backend_wrapped(lambda b: FaultyBackend(b, injector)):
        failed_reads = _run_blocking(seed=2, ledger=ledger)
    assert injector.injected >= 3
    assert failed_reads == 0 and ledger.reports == []
    assert metrics.counter_value("ExecutionSalvaged") == injector.injected


async def _run_trio(seed: int, ledger: Ledger) -> int:
    failed = 0
    for pairs, mode in _program(seed):
        await ltc.mark_step_async()
        if mode == "wait":
            try:
                await ltc.wait_device_ops_async()
            except ltc.ExecutionError as e:
                ledger.execution_error(e)
        for lazy, ref in pairs:
            while True:
                try:
                    (host,) = await ltc.to_cpu_async([lazy])
                except ltc.ComputationError as e:
                    key = (str(e.device), e.seq)
                    if mode == "wait":
                        assert key in ledger.reported
                    elif key not in ledger.reported:
                        ledger.add(e.device, e.seq, e.upstream is None)
                    failed += 1
                except ltc.ExecutionError as e:
                    ledger.execution_error(e)
                    continue
                else:
                    torch.testing.assert_close(host, ref, rtol=1e-4, atol=1e-5)
                break
    try:
        await ltc.wait_device_ops_async()
    except ltc.ExecutionError as e:
        ledger.execution_error(e)
    return failed


def test_injected_failures_under_trio(salvage_off):
    injector = FaultInjector(rate=0.3, devices=[1], seed=3)
    ledger = Ledger()
    with watchdog(300), backend_wrapped(lambda b: FaultyBackend(b, injector)):
        trio.run(_run_trio, 3, ledger)
    assert injector.injected >= 3
    assert ledger.own() == injector.injected


@pytest.mark.kernel_assert
def test_bad_index_fails_only_what_depends_on_it():
    """Salvage: a gather out of range beside an optimizer update fails the gather's result
    only; the model keeps training and matches eager (which raises at the gather)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    ref = torch.nn.Linear(6, 3)
    ref.load_state_dict(model.state_dict())
    model.to("ltc:0")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(5, 6)
    lx = x.to("ltc:0")
    for step in range(3):
        opt.zero_grad()
        model(lx).pow(2).mean().backward()
        opt.step()
        bad = lx.index_select(1, torch.tensor([0, 9]).to("ltc:0")).sum() if step == 1 else None
        ltc.mark_step()
        ref_opt.zero_grad()
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        if bad is not None:
            with pytest.raises(ltc.ComputationError, match="index_select") as info:
                bad.item()
            assert info.value.upstream is None and "bounds" in str(info.value.__cause__)
    ltc.wait_device_ops()   # the read above reported the failure: nothing pending
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_eager(p.detach(), q.detach())


@pytest.mark.kernel_assert
def test_two_failures_before_one_barrier_are_both_reported():
    a = torch.arange(5.0).to("ltc:0")
    b = torch.arange(5.0).to("ltc:1")
    bad_a = a.index_select(0, torch.tensor([7]).to("ltc:0"))
    bad_b = b.index_select(0, torch.tensor([8]).to("ltc:1"))
    ltc.mark_step()
    with pytest.raises(ltc.ExecutionError) as info:
        ltc.wait_device_ops()
    assert sorted(str(e.device) for e in info.value.errors) == ["ltc:0", "ltc:1"]
    assert all(e.upstream is None for e in info.value.errors)
    ltc.wait_device_ops()
    for t in (bad_a, bad_b):
        with pytest.raises(ltc.ComputationError):
            t.cpu()


@pytest.mark.kernel_assert
def test_dependent_failure_says_so_and_is_reported_once():
    x = torch.arange(5.0).to("ltc:1")
    bad = x.index_select(0, torch.tensor([9]).to("ltc:1")) * 2
    ltc.mark_step()
    moved = bad.to("ltc:0") + 1          # a transfer and a graph on ltc:0 consume the failure
    ltc.mark_step()
    with pytest.raises(ltc.ExecutionError) as info:
        ltc.wait_device_ops()
    kinds = sorted((str(e.device), e.upstream is not None) for e in info.value.errors)
    assert kinds == [("ltc:0", True), ("ltc:0", True), ("ltc:1", False)], kinds
    assert all("had failed" in str(e) for e in info.value.errors if e.upstream)
    with pytest.raises(ltc.ComputationError, match="an input had failed") as read:
        moved.cpu()
    assert read.value.__cause__ is info.value.errors[-1].__cause__ or read.value.__cause__ is not None


@pytest.mark.kernel_assert
def test_out_of_range_at_execution_keeps_device_usable():
    x = torch.randn(4, 3)
    lx = x.to("ltc:0")
    emb = torch.nn.functional.embedding(torch.tensor([1, 12]).to("ltc:0"), lx)
    with pytest.raises(ltc.ComputationError):
        emb.cpu()
    ltc.wait_device_ops()
    assert_eager(lx.t() @ lx, x.t() @ x)


def test_wait_device_ops_waits_for_completion_markers_on_every_device():
    """Backends with asynchronous kernels (CUDA) complete through markers; the multi-device
    wait, a read and the trio wait must all wait for them."""
    with watchdog(120), backend_wrapped(lambda b: MarkerBackend(b, delay=0.3)) as backends:
        xs = [torch.ones(3).to(f"ltc:{d}") * (d + 2) for d in range(2)]
        ltc.mark_step()
        ltc.wait_device_ops()
        assert all(e.is_set() for b in backends for e in b.fired)
        ys = [x + 1 for x in xs]
        ltc.mark_step()
        assert ys[1].cpu().tolist() == [4.0, 4.0, 4.0]
        assert all(e.is_set() for e in backends[1].fired)
        zs = [y * 2 for y in ys]
        ltc.mark_step()
        trio.run(ltc.wait_device_ops_async)
        assert all(e.is_set() for b in backends for e in b.fired)
        assert [z.cpu()[0].item() for z in zs] == [6.0, 8.0]
