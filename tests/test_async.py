"""Asynchronous execution: latency of mark_step, ordering, per-device waits, errors, closures,
thread safety, bounded memory, shutdown."""
from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import ltc_async as ltc
from conftest import assert_eager, backing_ref, busy_python_thread, heavy, heavy_steps, run_in_threads
from ltc_async.executor import arena


def _heavy_input(seed: int = 0, size: int = 768) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(size, size, generator=g) / size ** 0.5


def test_mark_step_returns_before_execution_finishes():
    x = _heavy_input().to("ltc:0")
    n = heavy_steps(x, 0.2)              # a graph that takes >= 0.2 s here, compiled and warm
    y = heavy(x, n)
    t0 = time.perf_counter()
    ltc.mark_step()
    t_mark = time.perf_counter() - t0
    ltc.wait_device_ops()
    t_total = time.perf_counter() - t0
    assert t_total > 0.05, "the graph should take a noticeable time to execute"
    assert t_mark < 0.2 * t_total, (t_mark, t_total)
    assert_eager(y, backing_ref(heavy, x.cpu(), n), rtol=1e-4, atol=1e-5)


def test_dependent_steps_are_ordered_without_host_wait():
    host = _heavy_input(1)
    x = host.to("ltc:0")
    ctx = arena.get("ltc:0")
    n = heavy_steps(x, 0.1)
    a = heavy(x, n)
    ltc.mark_step()
    first = ctx.last
    b = a * 2 + 1                        # consumes step 1's placeholder output
    ltc.mark_step()
    assert not first.done(), "tracing and scheduling step 2 must not have waited for step 1"
    c = b.sum(0)
    ref_a = backing_ref(heavy, host, n)
    assert_eager(c, (ref_a * 2 + 1).sum(0), rtol=1e-4, atol=1e-4)
    assert_eager(a, ref_a, rtol=1e-4, atol=1e-5)


@pytest.mark.kernel_assert
def test_wait_and_read_touch_only_the_devices_they_need():
    busy = _heavy_input(2).to("ltc:1")
    slow = heavy(busy, heavy_steps(busy, 0.1))
    ltc.mark_step("ltc:1")
    quick = torch.arange(4.0).to("ltc:0") * 3
    ltc.mark_step("ltc:0")
    t0 = time.perf_counter()
    ltc.wait_device_ops(["ltc:0"])
    assert quick.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]
    t_quick = time.perf_counter() - t0
    assert not arena.get("ltc:1").last.done(), "ltc:0's wait must not have waited for ltc:1"
    ltc.wait_device_ops(["ltc:1"])
    t_slow = time.perf_counter() - t0
    assert t_quick < 0.5 * t_slow, (t_quick, t_slow)
    assert slow.device == torch.device("ltc:1")


def _bad_gather():
    x = torch.arange(5.0).to("ltc:0")
    idx = torch.tensor([0, 7]).to("ltc:0")   # out of range: only the execution can tell
    return x, x.index_select(0, idx) * 2


@pytest.mark.kernel_assert
def test_execution_error_is_reraised_once_and_device_recovers():
    x, bad = _bad_gather()
    ltc.mark_step()                          # scheduling succeeds; the device fails later
    with pytest.raises(ltc.ExecutionError) as info:
        ltc.wait_device_ops()
    msg = str(info.value)
    assert "test_async.py" in msg and "ltc:0" in msg       # where the graph was scheduled
    assert info.value.__cause__ is not None and "index" in str(info.value.__cause__).lower()
    ltc.wait_device_ops()                    # exactly once: nothing pending any more
    with pytest.raises(ltc.ComputationError, match="failed") as info2:
        bad.cpu()                            # reading the failed tensor: a clear error, no hang
    assert info2.value.__cause__ is info.value.__cause__
    assert_eager(x * 3, torch.arange(5.0) * 3)   # the device is still usable
    y = x + 1
    ltc.mark_step()
    ltc.wait_device_ops()
    assert_eager(y, torch.arange(5.0) + 1)


@pytest.mark.kernel_assert
def test_reading_failed_tensor_consumes_the_device_error():
    _, bad = _bad_gather()
    with pytest.raises(ltc.ComputationError):
        bad.cpu()
    ltc.wait_device_ops()                    # already reported through the read


@pytest.mark.kernel_assert
def test_next_sync_on_device_reraises_pending_error():
    _, bad = _bad_gather()
    ltc.mark_step()
    good = torch.ones(3).to("ltc:0") * 2
    with pytest.raises(ltc.ExecutionError):
        good.cpu()                           # the next sync touching ltc:0 reports it
    assert good.cpu().tolist() == [2.0, 2.0, 2.0]
    del bad


@pytest.mark.kernel_assert
def test_failed_input_propagates_to_consumers():
    _, bad = _bad_gather()
    ltc.mark_step()
    later = bad.sum() + 1                    # consumes a placeholder that will fail
    ltc.mark_step()
    with pytest.raises(ltc.ExecutionError):
        ltc.wait_device_ops()
    with pytest.raises(ltc.ComputationError):
        later.item()


def test_sync_only_materializes_given_tensors(metrics):
    a = torch.randn(3).to("ltc:0")
    b = a * 2
    c = a * 3
    ltc.sync([b])
    assert metrics.counter_value("SyncTensorsGraphCount") == 1
    assert_eager(b, a.cpu() * 2)
    assert_eager(c, a.cpu() * 3)
    outs = ltc.to_cpu([b, c])
    torch.testing.assert_close(outs[1], a.cpu() * 3)


def test_step_closures_see_step_values():
    torch.manual_seed(0)
    w = torch.randn(4).to("ltc:0")
    seen_sync, seen_async = [], []
    expected = []
    for step in range(5):
        w = w * 0.5 + 1
        expected.append(w.cpu().sum().item() if step == 0 else expected[-1] * 0.5 + 4)
        ltc.add_step_closure(lambda t: seen_sync.append(t.sum().item()), (w,))
        ltc.add_step_closure(lambda t, s=step: seen_async.append((s, t.sum().item())), (w,), run_async=True)
        ltc.mark_step()
        assert len(seen_sync) == step + 1     # synchronous closures ran before mark_step returned
    ltc.wait_device_ops()
    assert [s for s, _ in seen_async] == list(range(5))   # step order
    torch.testing.assert_close(torch.tensor(seen_sync), torch.tensor(expected))
    torch.testing.assert_close(torch.tensor([v for _, v in seen_async]), torch.tensor(expected))


def test_async_step_closure_error_reraised_at_next_barrier():
    def boom() -> None:
        raise KeyError("closure failed")
    ltc.add_step_closure(boom, run_async=True)
    ltc.mark_step()
    with pytest.raises(RuntimeError, match="closure failed") as info:
        ltc.wait_device_ops()
    assert isinstance(info.value.__cause__, KeyError)
    ltc.wait_device_ops()                    # once only
    ran = threading.Event()

    def boom_later() -> None:
        ran.set()
        raise KeyError("second failure")
    ltc.add_step_closure(boom_later, run_async=True)
    ltc.mark_step()
    assert ran.wait(30)
    from ltc_async.executor import futures, steps
    futures.run(steps.closures.drain())   # the closure finished, its error recorded (no barrier ran)
    with pytest.raises(RuntimeError, match="second failure"):
        ltc.mark_step()    # the next mark_step reports it
    ltc.wait_device_ops()


def test_threads_trace_and_sync_concurrently():
    results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def worker(k: int) -> None:
        g = torch.Generator().manual_seed(k)
        host = torch.randn(32, 32, generator=g)
        dev = f"ltc:{k % 2}"
        x = host.to(dev)
        ref = host
        for i in range(30):
            x = torch.relu(x @ x.t() / 32 + 0.1 * i)
            ref = torch.relu(ref @ ref.t() / 32 + 0.1 * i)
            if i % 7 == 0:
                ltc.mark_step(dev)
            if i % 11 == 0:
                x.sum().item()
        results[k] = (x.cpu(), ref)

    run_in_threads(worker, [(k,) for k in range(8)], timeout=120)
    assert len(results) == 8
    for lazy, ref in results.values():
        torch.testing.assert_close(lazy, ref, rtol=1e-4, atol=1e-4)


def _count(cls: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is cls)


def test_long_loop_has_bounded_memory():
    from ltc_async.executor import graph_executor as gx
    from ltc_async.executor.futures import BackendData, Execution
    from ltc_async.ir.node import Node
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to("ltc:0")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, 16).to("ltc:0")
    ctx = arena.get("ltc:0")

    def run(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            ltc.mark_step()
        ltc.wait_device_ops()
    run(50)
    base = (_count(Node), _count(BackendData), _count(Execution), len(gx.cache), ctx.live_count())
    run(2000)
    after = (_count(Node), _count(BackendData), _count(Execution), len(gx.cache), ctx.live_count())
    # bounded: nothing grows with the number of steps (a few objects an earlier test left may
    # be collected meanwhile)
    assert all(a <= b for a, b in zip(after, base)), \
        f"(nodes, data, futures, cache, live) grew from {base} to {after}"
    assert all(torch.isfinite(p.cpu()).all() for p in model.parameters())


def test_exit_with_queued_work_does_not_hang():
    code = ("import torch, ltc_async as ltc\n"
            "x = torch.randn(512, 512).to('ltc:0') / 23\n"
            "for _ in range(3):\n"
            "    for _ in range(6): x = torch.tanh(x @ x)\n"
            "    ltc.mark_step()\n"
            "print('scheduled', flush=True)\n")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "scheduled" in r.stdout
    assert time.perf_counter() - t0 < 60


def test_to_cpu_cuts_pending_tensors_as_one_graph(metrics):
    x = torch.randn(3).to("ltc:0")
    p, q = x * 2, x + 1
    hp, hq = ltc.to_cpu([p, q])
    assert metrics.counter_value("SyncTensorsGraphCount") == 1
    torch.testing.assert_close(hp, x.cpu() * 2)
    torch.testing.assert_close(hq, x.cpu() + 1)


@pytest.mark.skipif(os.environ.get("LTC_ASYNC_BACKEND", "torchscript") != "torchscript",
                    reason="the reference backend runs each op in Python: it needs the GIL throughout")
def test_a_busy_python_thread_does_not_stall_the_device_mid_graph():
    """While another Python thread keeps the GIL (a training loop tracing the next step), a
    queued graph runs at its own speed: the device worker needs the GIL only around the call,
    not once per host-owned input the program is done with (PyTorch takes the GIL to drop the
    last C++ reference to a tensor that Python owns; before the fix every input did that inside
    the call and waited up to `sys.getswitchinterval()` for the busy thread, 5 ms each)."""
    xs = [torch.randn(128, 128).to("ltc:0") for _ in range(24)]
    ltc.mark_step()
    ltc.wait_device_ops()

    def graph() -> torch.Tensor:
        y = xs[0]
        for x in xs[1:]:          # each input's last use: it is done with mid-graph
            y = torch.tanh(y * x)
        return y
    graph()
    ltc.mark_step()
    ltc.wait_device_ops()         # compiled and warm
    with busy_python_thread():
        y = graph()
        ltc.mark_step()
        ltc.wait_device_ops()
    execute = ltc.metrics.metric_data("ExecuteTime")[2][-1]
    # Stalled: >= 23 waits of the switch interval (~115 ms); fixed: 3-4 (the return, and the
    # worker's own Python code handing the GIL to the spinner each interval)
    assert execute < 10 * sys.getswitchinterval(), f"execution took {execute * 1e3:.1f} ms"
    ref = xs[0].cpu()
    for x in xs[1:]:
        ref = torch.tanh(ref * x.cpu())
    assert_eager(y, ref, rtol=1e-5, atol=1e-6)


def test_traced_training_steps_trigger_no_garbage_collection():
    """A traced step keeps thousands of objects alive until `mark_step` (its IR, the lazy
    tensors): with Python's default collector threshold each step triggered collections that
    walked them, and their promotion triggered full collections of the whole heap (27% of a
    BERT step's host time).  Steady steps now trigger none (`LTC_ASYNC_GC_THRESHOLD`)."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)]
    model = torch.nn.Sequential(*layers).to("ltc:0")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32).to("ltc:0")

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        ltc.mark_step()
    for _ in range(3):
        step()
    ltc.wait_device_ops()
    collections = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])
    gc.collect()
    gc.callbacks.append(seen)
    try:
        for _ in range(10):
            step()
    finally:
        gc.callbacks.remove(seen)
    ltc.wait_device_ops()
    assert collections == [], f"collections of generations {collections} during 10 steps"


def test_gc_threshold_is_only_ever_raised():
    from ltc_async.executor.arena import tune_gc
    saved = gc.get_threshold()
    try:
        gc.set_threshold(50000, saved[1], saved[2])
        tune_gc(20000)                       # a user's larger threshold is kept
        assert gc.get_threshold()[0] == 50000
        gc.set_threshold(700, saved[1], saved[2])
        tune_gc(0)                           # LTC_ASYNC_GC_THRESHOLD=0: Python's setting
        assert gc.get_threshold()[0] == 700
        tune_gc(20000)
        assert gc.get_threshold() == (20000, saved[1], saved[2])
    finally:
        gc.set_threshold(*saved)


def _mlp_pair(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    return ref, copy.deepcopy(ref).to("ltc:0")


def test_a_loop_reading_the_loss_every_step_runs_the_forward_while_the_backward_is_traced(metrics):
    """The everyday loop `loss.backward(); opt.step(); print(loss.item())`: the host waits for
    every step, so the forward is queued when the backward begins (it runs while the backward
    and the optimizer step are traced); the losses and weights are eager's."""
    ref, model = _mlp_pair()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g)) for _ in range(5)]
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cut_at_backward = []
    for step, (x, y) in enumerate(batches):
        loss_ref = torch.nn.functional.mse_loss(ref(x), y)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        out = model(x.to("ltc:0"))
        loss = torch.nn.functional.mse_loss(out, y.to("ltc:0"))
        graphs = metrics.counter_value("SyncTensorsGraphCount") or 0
        seen = []    # graphs cut by the time the backward reaches the output's gradient
        out.register_hook(lambda grad: seen.append(metrics.counter_value("SyncTensorsGraphCount") or 0))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ltc.mark_step()
        cut_at_backward.append(seen[0] - graphs)
        assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-5, abs=1e-6)
    # no read before the first backward: that step is one graph; from then on the program
    # reads every step, and each backward starts by queuing its forward
    assert cut_at_backward == [0, 1, 1, 1, 1]
    for p_ref, p in zip(ref.parameters(), model.parameters()):
        assert_eager(p, p_ref, rtol=1e-4, atol=1e-5)


def test_a_loop_that_does_not_read_keeps_one_graph_per_step(metrics):
    """Steps that never wait for the host already overlap each other: a second graph per step
    would only add overhead.  After one read, only the next backward cuts early."""
    _, model = _mlp_pair(2)
    x, y = torch.randn(8, 16).to("ltc:0"), torch.randn(8, 4).to("ltc:0")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ltc.mark_step()
        return loss
    step()
    float(step())                 # a read: the next backward cuts first
    per_step = []
    for _ in range(4):
        before = metrics.counter_value("SyncTensorsGraphCount")
        step()
        per_step.append(metrics.counter_value("SyncTensorsGraphCount") - before)
    assert per_step == [2, 1, 1, 1]
    compiles = metrics.counter_value("UncachedCompile")
    for _ in range(3):            # steady state, with a read every other step: graphs cached
        step()
        float(step())
    step()
    assert metrics.counter_value("UncachedCompile") == compiles


def test_the_backward_cut_never_waits_for_a_busy_device():
    """When the device's in-flight queue is full the backward does not cut (the device has work
    anyway) and never waits for it: a backward in a trio task must not block the loop."""
    x = _heavy_input(4).to("ltc:0")
    n = heavy_steps(x, 0.1)
    w = torch.randn(64, requires_grad=True)
    lw = w.detach().to("ltc:0").requires_grad_()
    float((lw * 2).sum())         # a read: the next backward would cut
    ctx = arena.get("ltc:0")
    busy = []
    for _ in range(ctx.max_inflight):
        busy.append(heavy(x, n))
        ltc.mark_step()           # fills the queue (each execution takes >= 0.1 s)
    t0 = time.perf_counter()
    loss = (lw * 3).sum()
    loss.backward()
    t_backward = time.perf_counter() - t0
    ltc.wait_device_ops()
    t_total = time.perf_counter() - t0
    assert t_backward < 0.25 * t_total, (t_backward, t_total)
    assert_eager(lw.grad, torch.full((64,), 3.0))
