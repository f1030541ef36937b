"""`torch.compile(..., backend="ltc")`: trace once, one IR node per graph call (issue 11).

Every case runs the same program eagerly on the CPU (and, where the random stream matters,
uncompiled on `ltc`) and compares values; counters show that graph calls were captured
(`CompiledGraphCall`), not replayed op by op, and that steady steps compile nothing.
"""
from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

import ltc_async as ltc
from ltc_async.executor import arena
from ltc_async.ir.interpreter import Interpreter
from ltc_async.ir.lint import lint
from ltc_async.ir.node import DEVICE_DATA, post_order
from ltc_async.tensor.lazy_tensor import unwrap

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _count(name: str) -> int:
    return ltc.metrics.counter_value(name) or 0


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batches(n: int, batch: int = 6, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 4, (batch,), generator=g))
            for _ in range(n)]


def _assert_params(lazy: nn.Module, eager: nn.Module, **kw) -> None:
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), msg=lambda m, name=name: f"{name}: {m}", **kw)


def test_backend_is_registered():
    from torch._dynamo.backends.registry import list_backends
    assert "ltc" in list_backends()


def test_function_one_node_per_call(metrics):
    def f(x, y):
        return (x @ y).relu().sum(1) * 2 + x.mean()
    cf = torch.compile(f, backend="ltc")
    x, y = torch.randn(5, 5), torch.randn(5, 5)
    xl, yl = x.to("ltc:0"), y.to("ltc:0")
    ltc.mark_step()
    for _ in range(3):
        out = cf(xl, yl)
    torch.testing.assert_close(out.cpu(), f(x, y))
    out = cf(xl, yl)
    # the pending IR of the output: its inputs and ONE node standing for the whole graph
    order = post_order([unwrap(out)._v[0]])
    assert [n.op is DEVICE_DATA for n in order].count(False) == 1
    lint([unwrap(out)._v])                          # the IR invariants hold for that node too
    assert _count("CompiledGraphCapture") == 1
    assert _count("CompiledGraphCall") == 4
    assert _count("CompiledGraphReplay") == 0
    assert "ltc_compile" in ltc.debug.dump_ir([out])
    backend_text = ltc.debug.dump_ir([out], "backend")
    if arena.get("ltc:0").backend.name == "torchscript":    # the body inlined into the program
        assert "aten::mm" in backend_text or "aten::matmul" in backend_text
    else:                                                   # the interpreter runs it as one step
        assert "ltc_compile" in backend_text


def test_module_with_parameters_on_ltc():
    # Dynamo fake-ified a parameter on ltc as a non-leaf: `is_leaf True != False`
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    assert lazy[0].weight.is_leaf and lazy[0].weight.requires_grad
    cm = torch.compile(lazy, backend="ltc")
    x = torch.randn(6, 8)
    torch.testing.assert_close(cm(x.to("ltc:0")).cpu(), eager(x))
    with torch.no_grad():
        torch.testing.assert_close(cm(x.to("ltc:0")).cpu(), eager(x))


def test_default_backend_on_an_ltc_model_trains_like_eager(metrics):
    """Only the device string changed: `torch.compile(model)` with PyTorch's default backend
    (Inductor, which has no code generation for ltc: `KeyError: 'ltc'`) runs the model's graphs
    through backend="ltc"; a function creating ltc tensors from host inputs too."""
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    cm, ce = torch.compile(lazy), torch.compile(eager)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1)
    for x, y in _batches(3):
        loss = nn.functional.cross_entropy(cm(x.to("ltc:0")), y.to("ltc:0"))
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        ltc.mark_step()
        le = nn.functional.cross_entropy(ce(x), y)
        le.backward()
        opt_e.step()
        opt_e.zero_grad()
        torch.testing.assert_close(loss.cpu(), le.detach())
    _assert_params(lazy, eager)
    assert _count("CompiledGraphCall") == 2 * 3      # forward and backward, each step

    @torch.compile
    def make_on_device(n):
        return torch.arange(n, device="ltc:0").float().sin() * 2
    torch.testing.assert_close(make_on_device(5).cpu(), torch.arange(5).float().sin() * 2)


@pytest.mark.parametrize("compile_optimizer", [False, True])
def test_training_matches_eager(metrics, compile_optimizer):
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    cm = torch.compile(lazy, backend="ltc")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
    step = torch.compile(opt_l.step, backend="ltc") if compile_optimizer else opt_l.step
    losses = []
    batches = _batches(6)
    for i, (x, y) in enumerate(batches):
        loss = nn.functional.cross_entropy(cm(x.to("ltc:0")), y.to("ltc:0"))
        loss.backward()
        step()
        opt_l.zero_grad()
        ltc.mark_step()
        losses.append(loss)
        le = nn.functional.cross_entropy(eager(x), y)
        le.backward()
        opt_e.step()
        opt_e.zero_grad()
        torch.testing.assert_close(loss.cpu(), le.detach())
        if i == 2:   # warmed up: from here on every step is a cache hit
            ltc.wait_device_ops()
            compiles = _count("UncachedCompile")
            captures = _count("CompiledGraphCapture")     # no Dynamo recompile either
    ltc.wait_device_ops()
    _assert_params(lazy, eager)
    assert _count("UncachedCompile") == compiles
    assert _count("CompiledGraphCapture") == captures
    assert _count("CompiledGraphReplay") == 0
    assert _count("EagerFallback") == 0
    per_step = 3 if compile_optimizer else 2     # forward, backward (, optimizer)
    assert _count("CompiledGraphCall") == per_step * len(batches)


def test_optimizer_state_and_momentum_buffers_written():
    # AOTAutograd keeps the optimizer's input mutations in the graph: they are replayed as
    # writes into the parameters and momentum buffers (views of them see the update too)
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    step = torch.compile(opt_l.step, backend="ltc")
    row = lazy[0].weight[0]          # a view of a parameter, taken before the steps
    for x, y in _batches(3):
        nn.functional.cross_entropy(lazy(x.to("ltc:0")), y.to("ltc:0")).backward()
        step()
        opt_l.zero_grad()
        nn.functional.cross_entropy(eager(x), y).backward()
        opt_e.step()
        opt_e.zero_grad()
    _assert_params(lazy, eager)
    torch.testing.assert_close(row.detach().cpu(), eager[0].weight[0].detach())
    for p_l, p_e in zip(lazy.parameters(), eager.parameters()):
        torch.testing.assert_close(opt_l.state[p_l]["momentum_buffer"].cpu(), opt_e.state[p_e]["momentum_buffer"])


@pytest.mark.parametrize("kw", [{}, {"capturable": True}, {"foreach": False}, {"fused": True}],
                         ids=["host_step_counts", "capturable", "single_tensor", "fused"])
def test_compiled_adamw_variants(metrics, kw):
    # AdamW keeps `step` as a CPU tensor (capturable=False): the compiled step runs the count
    # updates on the host, everything else captured; capturable=True keeps them on ltc.
    # foreach=False: Dynamo writes `addcmul_(..., value=v)` as Inductor's `prims::fma` (it used
    # to take the eager fallback and make the graph replay); fused=True: `_fused_adamw_`
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.1,
                              **{k: v for k, v in kw.items() if k != "capturable"})
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-2, weight_decay=0.1, **kw)
    step = torch.compile(opt_l.step, backend="ltc")
    for x, y in _batches(4):
        nn.functional.cross_entropy(lazy(x.to("ltc:0")), y.to("ltc:0")).backward()
        step()
        opt_l.zero_grad()
        ltc.mark_step()
        nn.functional.cross_entropy(eager(x), y).backward()
        opt_e.step()
        opt_e.zero_grad()
    _assert_params(lazy, eager)
    state = opt_l.state[lazy[0].weight]
    on_ltc = kw.get("capturable") or kw.get("fused")
    assert state["step"].device.type == ("ltc" if on_ltc else "cpu")
    assert float(state["step"].cpu()) == 4.0
    torch.testing.assert_close(state["exp_avg_sq"].cpu(), opt_e.state[eager[0].weight]["exp_avg_sq"])
    assert _count("CompiledGraphReplay") == 0
    assert _count("EagerFallback") == 0
    if not on_ltc:
        assert _count("CompiledGraphHostSplit") == 4


def test_scalar_foreach_lists_vectorized():
    # an optimizer's per-parameter scalars (lists of 0-dim tensors) run as one op per foreach
    def f(steps, x):
        bc = torch._foreach_sub(torch._foreach_pow(0.9, steps), 1)
        root = torch._foreach_sqrt(torch._foreach_neg(bc))
        return [x * r for r in root]
    steps = [torch.tensor(float(k + 1)) for k in range(5)]
    x = torch.randn(3)
    out = torch.compile(f, backend="ltc")([s.to("ltc:0") for s in steps], x.to("ltc:0"))
    names = [n.name for n in unwrap(out[0])._v[0].op.ops]     # the captured body, still pending
    for a, b in zip(out, f(steps, x)):
        torch.testing.assert_close(a.cpu(), b)
    assert not any("_foreach" in n for n in names), names
    assert any(n.startswith("aten::pow") for n in names), names


def test_batchnorm_running_stats(metrics):
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    eager = build()
    lazy = build().to("ltc:0")
    cm = torch.compile(lazy, backend="ltc")
    for x, _ in _batches(3, batch=8):
        cm(x.to("ltc:0")).sum().backward()
        eager(x).sum().backward()
        ltc.mark_step()
    bn_l, bn_e = lazy[1], eager[1]
    torch.testing.assert_close(bn_l.running_mean.cpu(), bn_e.running_mean)
    torch.testing.assert_close(bn_l.running_var.cpu(), bn_e.running_var)
    assert int(bn_l.num_batches_tracked.cpu()) == 3
    _assert_params(lazy, eager)   # the gradients flowed into the same .grad
    for p_l, p_e in zip(lazy.parameters(), eager.parameters()):
        torch.testing.assert_close(p_l.grad.cpu(), p_e.grad)
    assert _count("CompiledGraphReplay") == 0


def test_recompiles_on_new_shape_via_guards(metrics):
    def f(x):
        return (x @ x.t()).tanh().sum(0)
    cf = torch.compile(f, backend="ltc")
    for n in (3, 5, 7, 3):     # the second size makes Dynamo recompile with a dynamic dim
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x.to("ltc:0")).cpu(), f(x))
    assert _count("CompiledGraphReplay") == 0
    # the dynamic graph is captured once per concrete size it is called with...
    captures = _count("CompiledGraphCapture")
    assert 3 <= captures <= 4
    for n in (7, 5, 3, 7):     # ...and sizes seen before are cache hits
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x.to("ltc:0")).cpu(), f(x))
    assert _count("CompiledGraphCapture") == captures
    assert _count("CompiledGraphReplay") == 0


def test_graph_break_falls_back_to_lazy_tracing(metrics):
    seen = []

    def f(x):
        y = torch.sin(x) * 2
        seen.append(1)            # a Python side effect: Dynamo breaks the graph here...
        torch._dynamo.graph_break()
        z = y.cumsum(0) + 1       # ...and this part is captured as a second graph
        return z.relu()
    cf = torch.compile(f, backend="ltc")
    x = torch.randn(6, 3)
    out = cf(x.to("ltc:0"))
    torch.testing.assert_close(out.cpu(), f(x))
    assert _count("CompiledGraphCall") == 2
    assert _count("EagerFallback") == 0
    # code Dynamo cannot capture at all runs op by op as ordinary lazy tracing (never eagerly)
    g = torch.compile(lambda x: torch.nonzero(x > 0).float().sum() + x.sum(), backend="ltc")
    before = _count("ltc::sum")
    torch.testing.assert_close(g(x.to("ltc:0")).cpu(), torch.nonzero(x > 0).float().sum() + x.sum())
    assert _count("ltc::sum") > before          # traced lazily, outside any captured graph


def test_whole_training_step_compiled(metrics):
    # backward, the optimizer and mark_step inside the compiled function: Dynamo breaks the
    # graph at `loss.backward()` and at `ltc.mark_step()` (it never traces into ltc_async)
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)

    @torch.compile(backend="ltc")
    def train_step(x, y):
        loss = nn.functional.cross_entropy(lazy(x), y)
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        ltc.mark_step()
        return loss
    for x, y in _batches(4):
        loss = train_step(x.to("ltc:0"), y.to("ltc:0"))
        assert unwrap(loss)._v[0].is_data           # mark_step ran inside the function
        le = nn.functional.cross_entropy(eager(x), y)
        le.backward()
        opt_e.step()
        opt_e.zero_grad()
        torch.testing.assert_close(loss.cpu(), le.detach())
    _assert_params(lazy, eager)
    assert _count("MarkStep") == 4
    assert _count("CompiledGraphReplay") == 0


def test_compiled_function_writes_its_inputs(metrics):
    def f(x, y):
        x.mul_(2)
        y[1:].add_(x[1:])
        return x.sum() + y.sum()
    cf = torch.compile(f, backend="ltc")
    for keep_view in (False, True):
        xe, ye = torch.randn(4, 3), torch.randn(4, 3)
        xl, yl = xe.to("ltc:0"), ye.to("ltc:0")
        view = xl[2] if keep_view else None        # an alias that must see the write
        out = cf(xl, yl)
        torch.testing.assert_close(out.cpu(), f(xe, ye))
        torch.testing.assert_close(xl.cpu(), xe)
        torch.testing.assert_close(yl.cpu(), ye)
        if view is not None:
            torch.testing.assert_close(view.cpu(), xe[2])
    assert _count("CompiledGraphReplay") == 0


def test_two_devices(metrics):
    eager = _mlp()
    m0 = copy.deepcopy(eager).to("ltc:0")
    m1 = copy.deepcopy(eager).to("ltc:1")
    c0, c1 = torch.compile(m0, backend="ltc"), torch.compile(m1, backend="ltc")
    x = torch.randn(6, 8)
    o0, o1 = c0(x.to("ltc:0")), c1(x.to("ltc:1"))
    assert o0.device == torch.device("ltc:0") and o1.device == torch.device("ltc:1")
    o0.sum().backward()
    o1.sum().backward()
    ltc.mark_step()
    eager(x).sum().backward()
    for m in (m0, m1):
        for p_l, p_e in zip(m.parameters(), eager.parameters()):
            torch.testing.assert_close(p_l.grad.cpu(), p_e.grad)
    # a result moved between the devices, then compiled code on the other device
    f = torch.compile(lambda a, b: (a * 2 + b).relu(), backend="ltc")
    moved = f(o0.detach().to("ltc:1"), o1.detach())
    assert moved.device == torch.device("ltc:1")
    e = eager(x).detach()
    torch.testing.assert_close(moved.cpu(), (e * 2 + e).relu())


def test_threads_share_a_compiled_function():
    from conftest import run_in_threads
    f = torch.compile(lambda x, w: (x @ w).relu().sum(0), backend="ltc")
    w = torch.randn(6, 6)
    results: dict = {}

    def work(device: str, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        wl = w.to(device)
        for _ in range(5):
            x = torch.randn(4, 6, generator=g)
            results.setdefault(device + str(seed), []).append((f(x.to(device), wl), (x @ w).relu().sum(0)))
            ltc.mark_step([device])
    run_in_threads(work, [("ltc:0", 1), ("ltc:1", 2), ("ltc:0", 3)], timeout=300)
    for pairs in results.values():
        for lazy, eager in pairs:
            torch.testing.assert_close(lazy.cpu(), eager)


def test_a_thread_compiling_beside_another_that_steps_the_same_device():
    """A first call (the capture) on one thread while another thread cuts steps on the same
    device: the other thread's `mark_step` must not take the capture's recording."""
    from conftest import backing_ref, run_in_threads

    def body(x, w):
        for _ in range(60):
            x = torch.tanh(x @ w) + x
        return x.sum(0)
    f = torch.compile(body, backend="ltc")
    w = torch.randn(6, 6) / 6
    xs = [torch.randn(n, 6) for n in range(2, 12)]   # each new batch size is captured again
    done = threading.Event()
    seen: dict = {}

    def compiles() -> None:
        try:
            seen["out"] = [f(x.to("ltc:0"), w.to("ltc:0")).cpu() for x in xs]
        finally:
            done.set()

    def steps() -> None:
        y = torch.ones(3).to("ltc:0")
        n = 0
        while not done.is_set() or n < 3:
            y = y + 1
            ltc.mark_step(["ltc:0"])
            n += 1
        seen["y"], seen["n"] = y.cpu(), n
    # the threads interleave within the capture's few ms
    run_in_threads(lambda k: compiles() if k == 0 else steps(), [(0,), (1,)], timeout=300,
                   switch_interval=1e-5)
    for x, out in zip(xs, seen["out"]):
        torch.testing.assert_close(out, backing_ref(body, x, w))
    torch.testing.assert_close(seen["y"], torch.full((3,), 1.0 + seen["n"]))


def test_random_draws_of_a_thread_beside_a_capture_never_repeat():
    """A capture of a graph with dropout on one thread does not rewind the device's generator
    under another thread drawing random numbers on the same device meanwhile."""
    from conftest import run_in_threads

    def body(x):
        for _ in range(20):
            x = torch.nn.functional.dropout(torch.tanh(x), 0.5)
        return x
    f = torch.compile(body, backend="ltc")
    done = threading.Event()
    draws: list = []

    def compiles() -> None:
        try:
            for n in range(2, 12):     # each new batch size is captured again
                f(torch.ones(n, 6).to("ltc:0"))
        finally:
            done.set()

    def draws_numbers() -> None:
        while not done.is_set() or len(draws) < 3:
            draws.append(torch.rand(64, device="ltc:0"))
            ltc.mark_step(["ltc:0"])
    run_in_threads(lambda k: compiles() if k == 0 else draws_numbers(), [(0,), (1,)], timeout=300,
                   switch_interval=1e-5)
    values = {tuple(d.cpu().tolist()) for d in draws}
    assert len(values) == len(draws), f"{len(draws) - len(values)} of {len(draws)} draws repeated"


def test_mark_step_semantics(metrics):
    cm = torch.compile(_mlp().to("ltc:0"), backend="ltc")
    x = torch.randn(6, 8).to("ltc:0")
    ltc.mark_step()
    out = cm(x)
    assert not unwrap(out)._v[0].is_data          # pending IR until the step is cut
    ctx = arena.get("ltc:0")
    assert any(t is unwrap(out) for t in ctx.live_tensors())
    ltc.mark_step()                                # cut and queued; returns at once
    assert unwrap(out)._v[0].is_data
    assert _count("MarkStep") == 2
    ltc.wait_device_ops()
    # a second step reuses the compiled program
    before = _count("UncachedCompile")
    out2 = cm(x)
    ltc.mark_step(wait=True)
    assert _count("UncachedCompile") == before
    torch.testing.assert_close(out2.cpu(), out.cpu())


def test_random_ops_equal_uncompiled_lazy_run():
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.Linear(32, 4)).to("ltc:0")
    cm = torch.compile(model, backend="ltc")
    x = torch.randn(6, 8).to("ltc:0")
    torch.manual_seed(7)
    compiled = [cm(x).cpu() for _ in range(3)]
    torch.manual_seed(7)
    plain = [model(x).cpu() for _ in range(3)]
    for a, b in zip(compiled, plain):
        assert torch.equal(a, b)                   # the same seeds, drawn in the same order
    assert not torch.equal(compiled[0], compiled[1])   # fresh numbers every call


def test_body_runs_on_the_interpreter_too():
    # the reference backend and the compile fallback run a captured graph node by node
    f = torch.compile(lambda x: (x * 3).softmax(-1) @ x.t(), backend="ltc")
    x = torch.randn(4, 4)
    out = f(x.to("ltc:0"))
    roots = [unwrap(out)._v]
    order = post_order([roots[0][0]])
    values = [n.data.get() for n in order if n.op is DEVICE_DATA]
    for n in order:
        if n.op is not DEVICE_DATA:
            values.extend(n.scalars)
    got = Interpreter(order, roots, torch.device("cpu")).execute(values)[0]
    torch.testing.assert_close(got.cpu(), (x * 3).softmax(-1) @ x.t())   # values on ltc:0's backing device


def test_trio_training_step():
    trio = pytest.importorskip("trio")
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    cm = torch.compile(lazy, backend="ltc")
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)

    async def main():
        for x, y in _batches(3):
            nn.functional.cross_entropy(cm(x.to("ltc:0")), y.to("ltc:0")).backward()
            opt.step()
            opt.zero_grad()
            await ltc.mark_step_async()
        await ltc.wait_device_ops_async()
    trio.run(main)
    for x, y in _batches(3):
        nn.functional.cross_entropy(eager(x), y).backward()
        opt_e.step()
        opt_e.zero_grad()
    _assert_params(lazy, eager)


def test_transformers_gpt2_trains_like_eager(metrics):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    eager = transformers.GPT2LMHeadModel(cfg)
    lazy = copy.deepcopy(eager).to("ltc:0")
    cm = torch.compile(lazy, backend="ltc")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.05, momentum=0.9)
    step = torch.compile(opt_l.step, backend="ltc")
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        ids = torch.randint(0, 64, (2, 8), generator=g)
        loss = cm(input_ids=ids.to("ltc:0"), labels=ids.to("ltc:0")).loss
        loss.backward()
        step()
        opt_l.zero_grad()
        ltc.mark_step()
        le = eager(input_ids=ids, labels=ids).loss
        le.backward()
        opt_e.step()
        opt_e.zero_grad()
        torch.testing.assert_close(loss.cpu(), le.detach(), atol=1e-5, rtol=1e-5)
    _assert_params(lazy, eager, atol=1e-5, rtol=1e-4)
    assert _count("CompiledGraphReplay") == 0
    assert _count("EagerFallback") == 0
