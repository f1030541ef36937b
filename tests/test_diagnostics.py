"""Diagnostics (issue 12): recompile explanations, the sync guard, step timelines, findings.

Each diagnostic is driven by a real cause (a smaller last batch, a Python number baked in as a
constant, a dtype change, another op order, `.item()` in a loop, an eager fallback), and the
messages must name this file and the line that did it.  Lines are found by the `# <-- NAME`
markers below, so editing the file cannot silently point a check at another line.
"""
from __future__ import annotations

import itertools
import json
import os
import threading
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
import trio
from conftest import ON_CUDA, heavy, heavy_steps, run_python

import ltc_async as ltc
from ltc_async.diagnostics import recompiles, sync_guard
from ltc_async.tensor.lazy_tensor import unwrap

HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    """The line of this file that carries `# <-- marker`."""
    with open(HERE) as f:
        found = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <-- {marker}")]
    assert len(found) == 1, (marker, found)
    return found[0]


def site(marker: str) -> str:
    return f"{HERE}:{line_of(marker)}"


@pytest.fixture
def explain():
    recompiles.clear()
    ltc.debug.explain_recompiles(True)
    try:
        yield
    finally:
        ltc.debug.explain_recompiles(False)


@pytest.fixture(autouse=True)
def _guard_allow():
    yield
    ltc.sync_guard("allow")


def _of(records, category):
    return [r for r in records if issubclass(r.category, category)]


# -- recompile explanations ------------------------------------------------------------------

def test_recompile_smaller_last_batch_names_shape_and_lines(explain):
    w = torch.randn(8, 4).to("ltc:0")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for batch in (32, 32, 16):                        # the last batch is smaller
            x = torch.randn(batch, 8).to("ltc:0")
            loss = (x @ w).relu().sum()  # <-- SHAPE_OP
            ltc.mark_step()  # <-- SHAPE_STEP
    found = _of(rec, ltc.RecompileWarning)
    assert len(found) == 1, [str(r.message) for r in rec]
    r = found[0]
    assert (r.filename, r.lineno) == (HERE, line_of("SHAPE_STEP"))   # warned at the call site
    m = r.message
    assert m.kind == "shape" and m.node == 0 and m.op == "device_data"
    assert (m.new, m.cached) == ("[16, 8]", "[32, 8]")
    assert m.call_site.startswith(site("SHAPE_STEP")) and m.device == "ltc:0"
    text = str(m)
    assert site("SHAPE_STEP") in text and site("SHAPE_OP") in text   # call site, and who reads it
    assert "[16, 8] here, [32, 8]" in text and "smaller last batch" in text
    assert ltc.debug.recompile_log()[-1] == text
    assert loss.cpu() >= 0


def test_recompile_baked_constant_vs_lifted_scalar(explain):
    x = torch.randn(4, 8).to("ltc:0")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for lr in (0.1, 0.01, 0.001):                     # runtime scalars are lifted: no recompile
            y = x * lr
            ltc.mark_step()
        for eps in (1e-5, 1e-5, 1e-3):                    # layer_norm's `eps: float` is a constant
            y = F.layer_norm(x, (8,), eps=eps)  # <-- EPS_OP
            ltc.mark_step()  # <-- EPS_STEP
    found = _of(rec, ltc.RecompileWarning)
    assert len(found) == 1, [str(r.message) for r in found]
    m = found[0].message
    assert found[0].lineno == line_of("EPS_STEP")
    assert m.kind == "constant" and m.op.startswith("aten::native_layer_norm")
    assert (m.new, m.cached) == ("0.001 (float)", "1e-05 (float)")
    assert m.origin.startswith(site("EPS_OP"))
    assert "argument `eps` is 0.001 (float) here, 1e-05 (float)" in str(m)
    assert y.cpu().shape == (4, 8)


def test_recompile_dtype_change(explain):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for dtype in (torch.float32, torch.float64):
            x = torch.ones(5, dtype=dtype).to("ltc:0")
            y = (x * 2).exp()
            ltc.mark_step()  # <-- DTYPE_STEP
    found = _of(rec, ltc.RecompileWarning)
    assert len(found) == 1
    m = found[0].message
    assert (m.kind, m.new, m.cached) == ("dtype", "float64", "float32")
    assert found[0].lineno == line_of("DTYPE_STEP")
    assert y.cpu().dtype == torch.float64


def test_recompile_other_op_order(explain):
    a, b = torch.randn(3).to("ltc:0"), torch.randn(3).to("ltc:0")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for first_mul in (False, True):
            if first_mul:
                y = (a * b).add(1)  # <-- ORDER_OP
            else:
                y = (a + 1).mul(b)
            ltc.mark_step()  # <-- ORDER_STEP
    (r,) = _of(rec, ltc.RecompileWarning)
    m = r.message
    assert m.kind == "op" and m.node == 2
    assert m.new.startswith("aten::mul") and m.cached.startswith("aten::add")
    assert m.origin.startswith(site("ORDER_OP"))
    assert torch.allclose(y.cpu(), a.cpu() * b.cpu() + 1)


def test_first_graph_at_each_site_and_cache_hits_are_silent(explain):
    x = torch.randn(6).to("ltc:0")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            y = x.sin()
            ltc.mark_step()
        z = x.cos() * 3
        ltc.mark_step()               # another call site: its first graph
        assert float(z.sum().cpu()) == pytest.approx(float((x.cpu().cos() * 3).sum()), rel=1e-5)
    assert not _of(rec, ltc.RecompileWarning)
    del y


def test_recompile_explanations_off_still_find_the_call_site(metrics):
    recompiles.clear()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for n in (10, 10, 7):
            x = torch.randn(n, 3).to("ltc:0")
            y = x.tanh().sum(0)
            ltc.mark_step()  # <-- OFF_STEP
    ltc.wait_device_ops()   # mark_step returns before its graph compiles: the findings count compiles
    assert not _of(rec, ltc.RecompileWarning)
    found = [f for f in ltc.metrics.findings() if f.kind == "recompile"]
    assert len(found) == 1
    assert any(d.startswith(site("OFF_STEP")) and "2 graphs, 1 of them after its first 2 steps"
               in d for d in found[0].details), found[0].details
    assert "explain_recompiles" in found[0].fix
    assert y.cpu().shape == (3,)


def test_recompile_findings_count_the_step_that_scheduled_the_graph(metrics, monkeypatch):
    """The compiler thread may reach a graph after the program's next `mark_step`s (a slow
    compile, a loaded machine): the finding must still count the recompile after warm-up."""
    from ltc_async.executor import compiler
    prepare = compiler._prepare

    def slow_prepare(*args):
        time.sleep(0.2)
        return prepare(*args)

    monkeypatch.setattr(compiler, "_prepare", slow_prepare)
    for n in (11, 11, 6):   # shapes no other test compiles: each miss is this test's
        x = torch.randn(n, 3).to("ltc:0")
        y = x.sigmoid().mean(0)
        ltc.mark_step()  # <-- SLOW_STEP
    ltc.wait_device_ops()
    (found,) = [f for f in ltc.metrics.findings() if f.kind == "recompile"]
    assert any(d.startswith(site("SLOW_STEP")) and "2 graphs, 1 of them after its first 2 steps"
               in d for d in found.details), found.details
    assert y.cpu().shape == (3,)


def test_recompile_warnings_from_threads_name_their_own_lines(explain):
    def worker(device: str, sizes: tuple[int, ...]) -> None:
        for n in sizes:
            x = torch.randn(n, 2).to(device)
            y = x.exp().sum()  # noqa: F841 - synced by mark_step
            ltc.mark_step(device)  # <-- THREAD_STEP

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=worker, args=("ltc:0", (4, 4, 3))),
                   threading.Thread(target=worker, args=("ltc:1", (5, 6)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    found = sorted((r.message.device, r.message.new, r.message.cached, r.lineno)
                   for r in _of(rec, ltc.RecompileWarning))
    line = line_of("THREAD_STEP")
    assert found == [("ltc:0", "[3, 2]", "[4, 2]", line), ("ltc:1", "[6, 2]", "[5, 2]", line)]


def test_recompile_warning_in_trio_at_the_awaiting_line(explain):
    async def main() -> None:
        for n in (8, 9):
            x = torch.randn(n).to("ltc:0")
            y = x.sigmoid()  # noqa: F841
            await ltc.mark_step_async()  # <-- TRIO_STEP

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        trio.run(main)
    (r,) = _of(rec, ltc.RecompileWarning)
    assert r.lineno == line_of("TRIO_STEP") and r.message.kind == "shape"


def test_explain_recompiles_from_the_environment():
    out = run_python(
        "import warnings, torch, ltc_async as ltc\n"
        "with warnings.catch_warnings(record=True) as rec:\n"
        "    warnings.simplefilter('always')\n"
        "    for n in (3, 3, 2):\n"
        "        y = torch.ones(n).to('ltc:0') + 1\n"
        "        ltc.mark_step()\n"
        "print([(r.category.__name__, r.lineno, r.message.kind) for r in rec])\n",
        env=dict(os.environ, LTC_ASYNC_EXPLAIN_RECOMPILES="1"))
    assert out.strip() == "[('RecompileWarning', 6, 'shape')]"


# -- the sync guard ----------------------------------------------------------------------------

def test_item_in_a_loop_warns_at_its_line():
    x = torch.randn(16).to("ltc:0")
    ltc.sync_guard("warn")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        total = 0.0
        for i in range(3):
            y = (x * i).sum()
            total += y.item()  # <-- ITEM
            ltc.mark_step()
    found = _of(rec, ltc.UnexpectedSyncWarning)
    assert len(found) == 3
    assert {(r.filename, r.lineno) for r in found} == {(HERE, line_of("ITEM"))}
    assert found[0].message.what == ".item()"
    assert site("ITEM") in str(found[0].message)
    assert total == pytest.approx(float(x.cpu().sum()) * 3, rel=1e-4)


def test_raise_mode_raises_before_reading():
    x = torch.randn(4).to("ltc:0")
    y = x.exp().sum()
    with ltc.sync_guard("raise"), pytest.raises(ltc.UnexpectedSyncError) as info:
        y.item()  # <-- RAISE_ITEM
    assert site("RAISE_ITEM") in str(info.value) and info.value.what == ".item()"
    assert isinstance(info.value, RuntimeError)
    assert not unwrap(y)._v[0].is_data          # nothing was scheduled or read
    assert y.item() == pytest.approx(float(x.cpu().exp().sum()), rel=1e-5)   # allowed again


def test_each_implicit_sync_is_named():
    x = torch.tensor([1.0, -2.0, 3.0]).to("ltc:0")
    cases = {
        "bool(t)": lambda: bool((x > 0).any()),
        "float(t)": lambda: float(x.sum()),
        "int(t)": lambda: int(x.sum()),
        ".tolist()": lambda: x.tolist(),
        "print(t)": lambda: repr(x),
        "format(t)": lambda: f"{x.sum():.2f}",
        "aten::nonzero": lambda: torch.nonzero(x > 0),          # a size read of device data
        "aten::unique_consecutive": lambda: torch.unique_consecutive(x.view(1, 3), dim=1),   # an eager fallback
        "torch op aten.equal": lambda: torch.equal(x, x),
    }
    for name, fn in cases.items():
        with ltc.sync_guard("raise"), pytest.raises(ltc.UnexpectedSyncError) as info:
            fn()
        assert name in info.value.what, (name, info.value.what)
        assert info.value.where.startswith(HERE + ":")


def test_data_dependent_branch_warns_at_the_if():
    x = torch.randn(8).to("ltc:0")
    with ltc.sync_guard("warn"), warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        if x.sum() > 100:  # <-- BRANCH
            x = x * 2
    (r,) = _of(rec, ltc.UnexpectedSyncWarning)
    assert r.lineno == line_of("BRANCH") and r.message.what.startswith("bool(t)")


def test_explicit_reads_are_always_allowed():
    x = torch.randn(5).to("ltc:0")
    with ltc.sync_guard("raise"):
        a = (x + 1).cpu()
        b = (x + 2).to("cpu")
        (c,) = ltc.to_cpu([x + 3])
        d = x + 4
        ltc.sync([d])
        e = x + 5
        ltc.mark_step()
        ltc.mark_step(wait=True)
        ltc.wait_device_ops()
    host = x.cpu()
    for k, v in enumerate((a, b, c), 1):
        torch.testing.assert_close(v, host + k)
    torch.testing.assert_close(d.cpu(), host + 4)
    torch.testing.assert_close(e.cpu(), host + 5)


def test_reads_in_step_closures_are_explicit():
    x = torch.randn(3).to("ltc:0")
    seen: list[float] = []
    with ltc.sync_guard("raise"):
        loss = x.pow(2).sum()
        ltc.add_step_closure(lambda t: seen.append(t.item()), (loss,))
        ltc.add_step_closure(lambda t: seen.append(t.item()), (loss,), run_async=True)
        ltc.mark_step()
        ltc.wait_device_ops()
    assert seen == [pytest.approx(float(x.cpu().pow(2).sum()), rel=1e-5)] * 2


def test_call_form_context_manager_and_nesting():
    assert sync_guard.mode() == "allow"
    ltc.sync_guard("warn")
    assert sync_guard.mode() == "warn"
    with ltc.sync_guard("raise"):
        assert sync_guard.mode() == "raise"
        with ltc.sync_guard("allow"):
            assert sync_guard.mode() == "allow"
        assert sync_guard.mode() == "raise"
    assert sync_guard.mode() == "warn"                  # the previous mode is back
    ltc.sync_guard("allow")
    with pytest.raises(ValueError, match="unknown mode 'loud'"):
        ltc.sync_guard("loud")
    assert sync_guard.mode() == "allow"


def test_guard_block_holds_for_its_thread_only():
    x = torch.randn(4).to("ltc:0")
    inside = threading.Barrier(2, timeout=60)
    results: dict[str, object] = {}

    def strict() -> None:
        with ltc.sync_guard("raise"):
            inside.wait()                                  # the other thread reads meanwhile
            try:
                x.sum().item()
            except ltc.UnexpectedSyncError:
                results["strict"] = "raised"
            inside.wait()

    def relaxed() -> None:
        inside.wait()
        results["relaxed"] = x.sum().item()
        inside.wait()

    threads = [threading.Thread(target=strict), threading.Thread(target=relaxed)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {"strict": "raised", "relaxed": pytest.approx(float(x.cpu().sum()), rel=1e-5)}


def test_guard_block_holds_for_its_trio_task_only():
    x = torch.randn(4).to("ltc:0")
    results: dict[str, object] = {}

    async def strict(entered: trio.Event, done: trio.Event) -> None:
        with ltc.sync_guard("raise"):
            entered.set()
            await done.wait()                               # the other task reads meanwhile
            with pytest.raises(ltc.UnexpectedSyncError):
                x.sum().item()
            results["strict"] = "raised"

    async def relaxed(entered: trio.Event, done: trio.Event) -> None:
        await entered.wait()
        results["relaxed"] = x.sum().item()
        (value,) = await ltc.to_cpu_async([x.sum()])
        results["async read"] = float(value)
        done.set()

    async def main() -> None:
        entered, done = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(strict, entered, done)
            nursery.start_soon(relaxed, entered, done)

    trio.run(main)
    expected = pytest.approx(float(x.cpu().sum()), rel=1e-5)
    assert results == {"strict": "raised", "relaxed": expected, "async read": expected}


def test_sync_guard_from_the_environment():
    out = run_python(
        "import torch, ltc_async as ltc\n"
        "x = torch.ones(2).to('ltc:0')\n"
        "try:\n"
        "    x.sum().item()\n"
        "except ltc.UnexpectedSyncError as e:\n"
        "    print('raised', e.what, e.where)\n"
        "print(ltc.to_cpu([x])[0].sum().item())\n",
        env=dict(os.environ, LTC_ASYNC_SYNC_GUARD="raise"))
    assert out.split("\n")[:2] == ["raised .item() <string>:4 (<module>)", "2.0"]
    bad = run_python(
        "try:\n"
        "    import ltc_async\n"
        "except ValueError as e:\n"
        "    print(e)\n", env=dict(os.environ, LTC_ASYNC_SYNC_GUARD="sometimes"))
    assert "LTC_ASYNC_SYNC_GUARD: unknown mode 'sometimes'" in bad


# -- timelines --------------------------------------------------------------------------------

def _train_steps(n: int, read_every: int = 0) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("ltc:0")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(n):
        x, y = torch.randn(16, 32).to("ltc:0"), torch.randint(0, 4, (16,)).to("ltc:0")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ltc.mark_step()
        if read_every and i % read_every == 0:
            loss.cpu()


def test_timeline_records_every_kind_of_span_and_writes_a_chrome_trace(tmp_path):
    path = tmp_path / "step.json"
    with ltc.debug.timeline(str(path)) as tl:
        _train_steps(4, read_every=2)
        x = torch.randn(8).to("ltc:0").exp()
        moved = x.to("ltc:1") * 2                        # a transfer between lazy devices
        ltc.mark_step()
        assert moved.cpu().shape == (8,)
    names = {e.name for e in tl.events}
    assert names == {"trace", "compile", "queue", "execute", "transfer"}
    assert all(e.dur_us >= 0 and e.start_us >= 0 for e in tl.events)
    assert {e["device"] for e in tl.events} == {"ltc:0", "ltc:1"}     # keys work like attributes
    ex0 = sorted((e for e in tl.events if e.name == "execute" and e.device == "ltc:0"),
                 key=lambda e: e.start_us)
    steps = [e.step for e in ex0]     # a step after a read runs its forward as a graph of its own
    assert steps == sorted(steps) and set(steps) >= {0, 1, 2, 3}, steps
    for a, b in itertools.pairwise(ex0):                 # one FIFO worker: never overlapping
        assert a.end_us <= b.start_us + 1
    queued = {e.args["seq"]: e for e in tl.events if e.lane == "queue" and e.device == "ltc:0"}
    for e in ex0:                                       # queued before it ran
        assert queued[e.args["seq"]].end_us <= e.start_us + 1
    assert any(e.name == "transfer" and e.lane == "device" and e.device == "ltc:1" for e in tl.events)
    assert sum(e.name == "transfer" and e.lane == "host" for e in tl.events) >= 2   # the reads
    trace = json.loads(path.read_text())
    kinds = {ev["ph"] for ev in trace["traceEvents"]}
    assert kinds == {"M", "X", "b", "e"}
    assert {ev["name"] for ev in trace["traceEvents"] if ev["ph"] == "X"} >= {"trace", "execute"}
    summary = tl.summary()
    assert summary.splitlines()[0].split()[:3] == ["step", "device", "wall"]
    assert "verdict:" in summary and "ltc:0" in summary


def test_timeline_summary_sees_host_reads():
    with ltc.debug.timeline() as tl:
        x = torch.randn(64, 64).to("ltc:0")
        for _ in range(4):
            x = torch.tanh(x @ x)
            x.sum().item()                               # the host waits every step
            ltc.mark_step()
    rows = tl.steps()
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["reads"] == 1 and r["read"] > 0 and 0 <= r["busy"] <= 1 for r in rows)


def test_timeline_sees_mark_step_wait_for_a_full_queue():
    size = 4096 if ON_CUDA else 192       # a GPU's step of small matmuls is shorter than its trace
    x = (torch.randn(size, size) / size ** 0.5).to("ltc:0")
    n = heavy_steps(x, 0.05)                                # each step: >= 50 ms of device work
    steps = 10                                              # max_inflight (4) steps, then 6 more
    with ltc.debug.timeline() as tl:
        for _ in range(steps):
            x = heavy(x, n)
            ltc.mark_step()                                # the 5th on waits for a free slot
        ltc.wait_device_ops()
    waits = [e for e in tl.events if e.lane == "host" and e.name == "queue"]
    assert len(waits) == steps
    rows = tl.steps()
    late = rows[5:]                                         # the later steps waited, visibly:
    assert sum(r["blocked"] for r in late) > sum(r["trace"] for r in late)   # more than they traced
    assert "the device is the bottleneck" in tl.summary()


def test_timeline_across_threads_and_trio():
    def worker(device: str) -> None:
        for _ in range(3):
            y = torch.randn(32).to(device).exp().sum()  # noqa: F841
            ltc.mark_step(device)

    async def trio_steps() -> None:
        for _ in range(2):
            y = torch.randn(16).to("ltc:0").cos()  # noqa: F841
            await ltc.mark_step_async("ltc:0")
        await ltc.wait_device_ops_async()

    with ltc.debug.timeline() as tl:
        threads = [threading.Thread(target=worker, args=(d,)) for d in ("ltc:0", "ltc:1")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        trio.run(trio_steps)
    per_device = {d: sorted(e.step for e in tl.events if e.name == "execute" and e.device == d)
                  for d in ("ltc:0", "ltc:1")}
    assert per_device["ltc:1"] == [0, 1, 2]
    assert per_device["ltc:0"] == [0, 1, 2, 3, 4]
    threads_seen = {e.args["thread"] for e in tl.events if e.name == "trace"}
    assert len(threads_seen) >= 3                          # two workers and the trio thread


def test_profiler_sees_ltc_spans():
    from torch._C._profiler import _ExperimentalConfig
    x = torch.randn(16, 16).to("ltc:0")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        y = (x @ x).relu()
        ltc.mark_step()
        y.cpu()
    names = {e.name for e in prof.events()}
    assert {"ltc::compile", "ltc::execute"} <= names


# -- findings -----------------------------------------------------------------------------------

def test_findings_name_fallbacks_and_syncs_by_line(metrics):
    x = torch.randn(10).to("ltc:0")
    for _ in range(3):
        idx = torch.unique_consecutive(x.view(2, 5), dim=1)  # <-- FALLBACK
        if x.sum() > 1e9:  # <-- SYNC
            break
        ltc.mark_step()
    found = {f.kind: f for f in ltc.metrics.findings()}
    assert f"aten::unique_consecutive x3 at {site('FALLBACK')}" in "\n".join(found["fallback"].details)
    # "bool(t) (`if t:` ...)" once a sync guard has wrapped the Tensor methods (any earlier
    # test may have), the generic ".item() / bool(t) / ..." before
    assert any("bool(t)" in d and site("SYNC") in d for d in found["sync"].details), found["sync"].details
    assert "per step over 3 mark_step(s)" in found["sync"].title
    report = ltc.metrics.report()
    tail = report[report.index("Findings"):]
    assert "Fix:" in tail and site("FALLBACK") in tail
    ltc.metrics.reset()
    assert ltc.metrics.findings() == []
    assert "Findings: none" in ltc.metrics.report()
    assert idx.cpu().shape == (2, 5)   # random values: no two equal neighbouring columns


def test_findings_device_idle_while_the_host_traces(metrics):
    x = torch.randn(4).to("ltc:0")
    for _ in range(12):                                    # hundreds of tiny ops per step: the
        for _ in range(150):                               # host traces far longer than the
            x = x * 1.0001 + 0.0001                        # device needs to run them
        ltc.mark_step()
    ltc.wait_device_ops()
    found = {f.kind: f for f in ltc.metrics.findings()}
    assert "idle" in found, ltc.metrics.report()
    assert "waits for the host" in found["idle"].title and "timeline" in found["idle"].fix
