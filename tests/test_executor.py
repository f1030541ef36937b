"""Graph executor, computation cache, eager fallback, device configuration, metrics, debug."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ltc_async as ltc
from conftest import assert_eager, run_python


def _step(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w).sum(0) * 0.5


def test_second_identical_step_hits_cache(metrics):
    torch.manual_seed(0)
    w, x = torch.randn(8, 8), torch.randn(4, 8)
    lw, lx = w.to("ltc:0"), x.to("ltc:0")
    out1 = _step(lw, lx)
    ltc.mark_step()
    assert metrics.counter_value("UncachedCompile") == 1
    # new values, same shapes: the graph is found in the cache
    w2, x2 = torch.randn(8, 8), torch.randn(4, 8)
    out2 = _step(w2.to("ltc:0"), x2.to("ltc:0"))
    ltc.mark_step()
    assert metrics.counter_value("UncachedCompile") == 1
    assert metrics.counter_value("CachedCompile") == 1
    assert_eager(out1, _step(w, x))
    assert_eager(out2, _step(w2, x2))
    assert metrics.counter_value("MarkStep") == 2
    count, total, samples = metrics.metric_data("ExecuteTime")
    assert count == 2 and total > 0 and len(samples) == 2


def test_graph_key_distinguishes_shared_inputs(metrics):
    """`a + a` and `a + b` have equal DAG hashes node by node; the exact key tells them apart."""
    from ltc_async.executor import compiler
    compiler.cache.clear()    # an earlier test may have compiled either graph: then a cache hit
    a = torch.randn(5).to("ltc:0")
    b = torch.randn(5).to("ltc:0")
    s1 = a + a
    s2 = a + b
    assert ltc.debug.graph_hash([s1]) != ltc.debug.graph_hash([s2])
    ltc.sync([s1])   # one graph each (a read would run both live tensors in one graph)
    ltc.sync([s2])
    assert_eager(s1, a.cpu() + a.cpu())
    assert_eager(s2, a.cpu() + b.cpu())
    # two graph keys
    assert (metrics.counter_value("UncachedCompile") or 0) + (metrics.counter_value("CompileReuse") or 0) == 2


def test_graph_hash_ignores_values():
    a1, b1 = torch.randn(3, 3).to("ltc:0"), torch.randn(3, 3).to("ltc:0")
    a2, b2 = torch.randn(3, 3).to("ltc:0"), torch.randn(3, 3).to("ltc:0")
    assert ltc.debug.graph_hash([a1 @ b1 + 1.5]) == ltc.debug.graph_hash([a2 @ b2 + 2.5])
    assert ltc.debug.graph_hash([a1 @ b1]) != ltc.debug.graph_hash([a1 @ b1.t()])


def test_eager_fallback_is_counted_and_correct(metrics):
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    lx = x.to("ltc:0")
    runs = torch.unique_consecutive(lx, dim=1)   # no lowering along a dim: eagerly on device data
    sel = lx[lx != 0] * 2            # boolean mask indexing: on the device (one size read)
    assert metrics.counter_value("EagerFallback") == 1
    assert metrics.counter_value("EagerFallback::unique_consecutive") == 1
    assert metrics.counter_value("SizeRead::nonzero") == 1
    assert_eager(runs, torch.unique_consecutive(x, dim=1))
    assert_eager(sel, x[x != 0] * 2)


def test_cache_is_lru_bounded():
    from ltc_async.executor.graph_executor import ComputationCache
    c = ComputationCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1     # refresh a
    c.put("c", 3)              # evicts b, the least recently used
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3 and len(c) == 2


def test_trace_time_shape_error_raises_at_the_line():
    a = torch.randn(3, 4).to("ltc:0")
    b = torch.randn(5, 6).to("ltc:0")
    with pytest.raises(RuntimeError, match="reduction dim|cannot be multiplied"):
        torch.mm(a, b)
    with pytest.raises(RuntimeError):
        a + b
    with pytest.raises(IndexError):
        a.sum(dim=5)
    # nothing bad was recorded: the device still works
    assert_eager(a * 2, a.cpu() * 2)


def test_devices_and_registration():
    devs = ltc.devices()
    assert devs[0] == torch.device("ltc", 0)
    assert ltc.backend_device("ltc:0").type in ("cpu", "cuda")
    t = torch.zeros(2, device="ltc:0")
    assert t.device == torch.device("ltc:0") and t.is_ltc
    assert torch.ltc.device_count() == len(devs)
    with pytest.raises(ValueError, match="ltc:99"):
        ltc.backend_device("ltc:99")
    with pytest.raises(ValueError, match="not a lazy device"):
        ltc.backend_device("cpu")


def test_bad_device_entry_names_it():
    with pytest.raises(ValueError, match="tpu:0"):
        ltc.init(devices=["cpu", "tpu:0"])
    with pytest.raises(ValueError, match="cuda:7"):
        ltc.init(devices=["cuda:7"])


def test_bad_device_entry_from_environment():
    env = dict(os.environ, LTC_ASYNC_DEVICES="cpu,bogus")
    code = "import torch, ltc_async; torch.zeros(1, device='ltc:0')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ValueError" in r.stderr and "'bogus'" in r.stderr


def test_two_virtual_cpu_devices_from_environment():
    env = dict(os.environ, LTC_ASYNC_DEVICES="cpu,cpu")
    code = ("import torch, ltc_async as ltc\n"
            "x = torch.arange(6.).to('ltc:1') * 2\n"
            "assert ltc.devices() == [torch.device('ltc', 0), torch.device('ltc', 1)]\n"
            "assert x.device == torch.device('ltc:1')\n"
            "assert x.cpu().tolist() == [0., 2., 4., 6., 8., 10.]\n"
            "print('ok')\n")
    assert run_python(code, env).strip() == "ok"


_OMP_HELPERS = """
import os, time, torch, ltc_async as ltc
torch.set_num_threads(2)
x = torch.randn(512, 512)
x @ x                                   # the user's own thread has its OpenMP helpers
def threads():
    return len(os.listdir("/proc/self/task"))
a = torch.ones(2, device="ltc:0") + 1
ltc.mark_step()
ltc.wait_device_ops()                   # the device's threads are up, nothing parallel yet
time.sleep(0.2)
before = threads()
w = x.to("ltc:0")
y = ((w @ w).relu() @ w).sum()
ltc.mark_step()                         # a parallel execution on the device's worker (a read
ltc.wait_device_ops()                   # of an idle device's graph would run it on this thread)
during = threads()
y = y.item()
time.sleep(float(os.environ["LTC_ASYNC_OMP_IDLE"] or 0) + 1.0)
after = threads()
assert abs(y - ((x @ x).relu() @ x).sum().item()) <= 1e-3 * abs(y)
ltc.wait_device_ops()
print(before, during, after)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="counts the threads in /proc; needs 2 cores for a parallel worker")
def test_an_idle_cpu_device_gives_its_openmp_threads_back():
    """A user who trains on `ltc:0` and then runs eager CPU code: once the device has nothing to
    do, its worker's OpenMP helpers exit (libgomp sleeps at every barrier while the process has
    more OpenMP threads than cores: eager code beside an idle device ran up to 3.6x slower)."""
    from ltc_async.base import openmp
    if openmp._pause() is None:
        pytest.skip("the OpenMP runtime torch loaded is not libgomp")
    env = dict(os.environ, LTC_ASYNC_DEVICES="cpu", LTC_ASYNC_CPU_THREADS="2", LTC_ASYNC_OMP_IDLE="0.5")
    before, during, after = map(int, run_python(_OMP_HELPERS, env).split())
    assert during > before and after == before, (before, during, after)
    # with the release turned off, the helpers stay for good (what every process had before)
    env["LTC_ASYNC_OMP_IDLE"] = "0"
    before, during, after = map(int, run_python(_OMP_HELPERS, env).split())
    assert during > before and after == during, (before, during, after)


def test_metrics_api(metrics):
    x = torch.randn(4).to("ltc:0")
    y = torch.relu(x) + 1
    ltc.mark_step(wait=True)
    names = metrics.counter_names()
    for required in ("MarkStep", "UncachedCompile", "CreateLtcTensor", "ltc::relu", "ltc::add"):
        assert required in names, required
    assert metrics.counter_value("ltc::relu") == 1
    assert metrics.counter_value("NoSuchCounter") is None
    for required in ("CompileTime", "ExecuteTime", "SyncTensorsGraph"):
        assert required in metrics.metric_names()
    report = metrics.report()
    assert "UncachedCompile" in report and "ExecuteTime" in report
    assert_eager(y, torch.relu(x.cpu()) + 1)
    metrics.reset()
    assert metrics.counter_value("MarkStep") == 0 and metrics.metric_data("ExecuteTime") is None
    for always in ("MarkStep", "CachedCompile", "UncachedCompile", "DeviceDataCacheMiss",
                   "CreateLtcTensor", "DestroyLtcTensor", "EagerFallback"):
        assert always in metrics.counter_names() and metrics.counter_value(always) == 0


def test_create_and_destroy_counters(metrics):
    x = torch.randn(4).to("ltc:0")
    for _ in range(3):
        x = x * 2
    del x
    import gc
    gc.collect()
    created = metrics.counter_value("CreateLtcTensor")
    destroyed = metrics.counter_value("DestroyLtcTensor")
    assert created is not None and created >= 4
    assert destroyed is not None and destroyed >= 3


def test_dump_ir_formats():
    a = torch.randn(2, 3).to("ltc:0")
    y = torch.sigmoid(a) * 3.0
    text = ltc.debug.dump_ir([y], "text")
    assert "aten::sigmoid" in text and "device_data" in text and "ROOT" in text
    dot = ltc.debug.dump_ir([y], "dot")
    assert dot.startswith("digraph") and "->" in dot
    backend = ltc.debug.dump_ir([y], "backend")
    assert "aten::sigmoid" in backend and "graph(" in backend
    with pytest.raises(ValueError, match="unknown fmt"):
        ltc.debug.dump_ir([y], "svg")
    assert_eager(y, torch.sigmoid(a.cpu()) * 3.0)


def test_print_and_tolist():
    x = torch.tensor([1.0, 2.0]).to("ltc:0")
    s = repr(x * 2)
    assert "tensor([2., 4.]" in s and "device='ltc:0'" in s
    w = torch.ones(2, device="ltc:0", requires_grad=True)
    assert "requires_grad=True" in repr(w)
    assert "grad_fn=<MulBackward0>" in repr(w * 2)
    assert (x + 1).tolist() == [2.0, 3.0]
    assert (x.sum()).item() == 3.0


def test_reference_backend_agrees_with_eager():
    """The interpreter backend runs the same executor without TorchScript."""
    code = ("import torch, ltc_async as ltc\n"
            "ltc.init(backend='reference')\n"
            "torch.manual_seed(0)\n"
            "m = torch.nn.Linear(4, 3)\n"
            "lm = torch.nn.Linear(4, 3).to('ltc:0'); lm.load_state_dict(m.state_dict())\n"
            "x = torch.randn(5, 4)\n"
            "out = lm(x.to('ltc:0')).relu().sum(); out.backward(); ltc.mark_step()\n"
            "ref = m(x).relu().sum(); ref.backward()\n"
            "torch.testing.assert_close(out.cpu(), ref.detach())\n"
            "torch.testing.assert_close(lm.weight.grad.cpu(), m.weight.grad)\n"
            "assert ltc.metrics.counter_value('UncachedCompile') >= 1\n"
            "print('ok')\n")
    env = dict(os.environ, LTC_ASYNC_DEVICES="cpu")   # the interpreter has CPU devices only
    assert run_python(code, env=env).strip() == "ok"


def test_bad_device_strings_raise_at_the_call():
    with pytest.raises(ValueError, match="ltc:5 does not exist"):
        torch.randn(3, device="ltc:5")
    with pytest.raises(ValueError, match="ltc:7 does not exist"):
        torch.ones(3).to("ltc:7")
    with pytest.raises(ValueError, match="ltc:9"):
        ltc.mark_step("ltc:9")
    with pytest.raises(ValueError, match="not a lazy device"):
        ltc.wait_device_ops(["cpu"])


def test_signed_zero_and_nan_scalars_are_not_merged():
    x = torch.ones(2).to("ltc:0")
    assert (x / torch.tensor(-0.0)).cpu().tolist() == [float("-inf")] * 2
    assert (x / torch.tensor(0.0)).cpu().tolist() == [float("inf")] * 2
    assert torch.isnan((x + torch.tensor(float("nan"))).cpu()).all()


def test_data_dependent_syncs_are_counted(metrics):
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    lx = x.to("ltc:0")
    assert lx.sum().item() == x.sum().item()
    assert bool(lx.sum() > 0) is True
    taken = "yes" if (lx < 0).any() else "no"        # Python control flow on a lazy value
    assert taken == "yes"
    assert lx.tolist() == x.tolist()
    assert metrics.counter_value("DataDependentSync") == 3
    assert metrics.counter_value("TensorToHost") == 1


@pytest.mark.parametrize("view", [lambda t: t.t(), lambda t: t[:, 1:3], lambda t: t.permute(1, 0).unsqueeze(0),
                                  lambda t: t.expand(2, 3, 4), lambda t: t[::2], lambda t: t.t() + 1,
                                  lambda t: t.t().contiguous()])
def test_strides_and_contiguity_reported_like_eager(view):
    x = torch.randn(3, 4)
    a, b = view(x), view(x.to("ltc:0"))
    assert b.stride() == a.stride() and b.is_contiguous() == a.is_contiguous()
    assert_eager(b, a)


def test_compile_failure_falls_back_to_the_interpreter(metrics, monkeypatch):
    """A graph the backend cannot compile still runs (eagerly, counted), never poisons the device."""
    ctx = ltc_async_arena().get("ltc:0")

    def broken(*args, **kwargs):
        raise RuntimeError("lowering exploded")
    monkeypatch.setattr(ctx.backend, "compile", broken)
    x = torch.randn(3, 5)
    y = torch.tanh(x.to("ltc:0")).sum(1) * 7.0   # a shape no earlier test compiled
    with pytest.warns(UserWarning, match="lowering exploded"):
        ltc.mark_step()            # returns at once: the compiler thread warns
        ltc.wait_device_ops()
    assert metrics.counter_value("CompileFallback") == 1
    assert_eager(y, torch.tanh(x).sum(1) * 7.0)


def ltc_async_arena():
    from ltc_async.executor import arena
    return arena


def _window(x: torch.Tensor, n: int, start: int) -> torch.Tensor:
    # a user's length-dependent program: view sizes, a narrow and an arange follow `n`
    y = x.reshape(n, -1).narrow(0, start, n - start) * 2
    return (y.sum(1) + torch.arange(n - start, device=x.device)).cumsum(0)


def test_graphs_differing_only_in_ints_share_one_generic_program(metrics):
    """Beyond LTC: a growing length (a KV cache, a sequence) compiles twice, not per length."""
    torch.manual_seed(0)
    for n in range(4, 12):
        x = torch.randn(n * 3)
        got = _window(x.to("ltc:0"), n, 1)
        ltc.mark_step()
        assert_eager(got, _window(x, n, 1))
    compiles = (metrics.counter_value("UncachedCompile") or 0) + (metrics.counter_value("CompileReuse") or 0)
    assert compiles == 2                                   # n=4 exactly, n=5 with n lifted
    assert metrics.counter_value("GenericProgramHit") == 6
    # an int that stayed a constant so far (the narrow's start) changes: one more compile
    # lifts it too, and every later combination runs that program
    for n, start in ((6, 2), (9, 3), (5, 0), (7, 1)):
        x = torch.randn(n * 3)
        got = _window(x.to("ltc:0"), n, start)
        ltc.mark_step()
        assert_eager(got, _window(x, n, start))
    compiles = (metrics.counter_value("UncachedCompile") or 0) + (metrics.counter_value("CompileReuse") or 0)
    assert compiles == 3
    # the exact cache still answers first: a length seen before is a plain cache hit
    before = metrics.counter_value("GenericProgramHit")
    x = torch.randn(9 * 3)
    got = _window(x.to("ltc:0"), 9, 3)
    ltc.mark_step()
    assert_eager(got, _window(x, 9, 3))
    assert metrics.counter_value("GenericProgramHit") == before


def test_generic_program_keeps_other_graphs_apart(metrics):
    """Graphs of one skeleton but another dtype, op or operand wiring never share a program."""
    a = torch.randn(6)
    outs = []
    for n in (2, 3):
        la = a.to("ltc:0")
        outs.append(((la.reshape(n, -1) + 1).sum(0), (a.reshape(n, -1) + 1).sum(0)))
        outs.append(((la.reshape(n, -1) * 1).sum(0), (a.reshape(n, -1) * 1).sum(0)))
        li = a.to(torch.int64).to("ltc:0")
        outs.append(((li.reshape(n, -1) + 1).sum(0), (a.to(torch.int64).reshape(n, -1) + 1).sum(0)))
        ltc.mark_step()
    for got, want in outs:
        assert_eager(got, want)


def test_a_read_runs_the_live_graph_once_no_work_twice(metrics):
    """A loop that reads a value each iteration without `mark_step` (greedy decoding, a
    data-dependent stop): each read runs every live tensor's pending work, so the state the
    loop carries becomes device data and no iteration re-runs an earlier one's ops."""
    torch.manual_seed(0)
    w = torch.randn(16, 16) / 4
    state, lstate = torch.randn(1, 16), None
    lw = w.to("ltc:0")
    lstate = state.to("ltc:0")
    per_iteration = []
    for _ in range(12):
        before = metrics.counter_value("ExecutedIrNodes") or 0
        lstate = torch.tanh(lstate @ lw) + 0.1
        state = torch.tanh(state @ w) + 0.1
        assert lstate.argmax().item() == state.argmax().item()
        per_iteration.append(metrics.counter_value("ExecutedIrNodes") - before)
    assert max(per_iteration) == min(per_iteration), per_iteration   # does not grow
    assert_eager(lstate, state)


def test_generic_program_keeps_the_number_of_split_outputs(metrics):
    """`split` of a longer input yields more tensors: such graphs never share a program."""
    outs = []
    for n in (4, 6, 8, 10):
        x = torch.arange(float(n))
        outs.append((x.to("ltc:0").split(2)[0] * n, x.split(2)[0] * n))   # n/2 outputs, one used
        ltc.mark_step()
    for got, want in outs:
        assert_eager(got, want)
    assert not metrics.counter_value("ExecutionSalvaged")   # no program failed and was replayed


@pytest.mark.parametrize("fill", [(False, True), (0, 7), (0.5, -2.0)], ids=["bool", "int", "float"])
def test_a_fill_value_is_a_runtime_scalar(metrics, fill):
    """`torch.full(..., flag, dtype=torch.bool)` -- transformers' stopping criteria make one per
    token, turning True at the last -- and `scalar_tensor` take their fill as a runtime scalar:
    a new value runs the same graph, with eager's values and dtypes."""
    x = torch.arange(6).to("ltc:0")
    outs = []
    for i, v in enumerate(fill):
        dtype = torch.bool if type(v) is bool else None
        f = torch.full((6,), v, device="ltc:0", dtype=dtype)
        s = torch.scalar_tensor(v, device="ltc:0", dtype=dtype or torch.float32)
        outs.append((f, s, torch.where(f.bool(), x, -x)))
        ltc.mark_step()
        if i == 0:
            compiled = metrics.counter_value("UncachedCompile") + (metrics.counter_value("CompileReuse") or 0)
    assert metrics.counter_value("UncachedCompile") + (metrics.counter_value("CompileReuse") or 0) == compiled
    for v, (f, s, w) in zip(fill, outs):
        dtype = torch.bool if type(v) is bool else None
        want = torch.full((6,), v, dtype=dtype)
        assert_eager(f, want)
        assert_eager(s, torch.scalar_tensor(v, dtype=dtype or torch.float32))
        assert_eager(w, torch.where(want.bool(), torch.arange(6), -torch.arange(6)))
    # without a dtype the fill decides it: a bool is a constant (another graph), values stay eager's
    assert_eager(torch.full((2,), True, device="ltc:0"), torch.full((2,), True))
    assert_eager(torch.full((2,), 3, device="ltc:0"), torch.full((2,), 3))
