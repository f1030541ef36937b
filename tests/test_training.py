"""End-to-end training parity with eager PyTorch."""
from __future__ import annotations

import copy
import os

import pytest
import torch

import ltc_async as ltc


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                               torch.nn.ReLU(), torch.nn.Linear(256, 10))


def test_mlp_training_parity_20_steps(metrics):
    torch.manual_seed(0)
    eager = _mlp()
    lazy = copy.deepcopy(eager).to("ltc:0")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(20):
        x = torch.randn(64, 64)
        y = torch.randint(0, 10, (64,))
        opt_e.zero_grad()
        le = loss_fn(eager(x), y)
        le.backward()
        opt_e.step()
        opt_l.zero_grad()
        ll = loss_fn(lazy(x.to("ltc:0")), y.to("ltc:0"))
        ll.backward()
        opt_l.step()
        ltc.mark_step()
        torch.testing.assert_close(ll.cpu(), le.detach(), rtol=1e-4, atol=1e-5)
    for pe, pl in zip(eager.parameters(), lazy.parameters()):
        assert pl.device == torch.device("ltc", 0)
        torch.testing.assert_close(pl.cpu(), pe.detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pl.grad.cpu(), pe.grad, rtol=1e-4, atol=1e-5)
    # Step 1 creates the momentum buffers; from step 2 on, the loop having read its loss, each
    # backward starts by queuing the forward: the forward and the backward with the update are
    # two graphs, compiled once (`graph_executor.before_backward`).  Three compiles in all.
    assert metrics.counter_value("UncachedCompile") == 3
    assert metrics.counter_value("CachedCompile") >= 18
    assert metrics.counter_value("EagerFallback") == 0


def test_learning_rate_change_does_not_recompile(metrics):
    torch.manual_seed(1)
    model = torch.nn.Linear(8, 4).to("ltc:0")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8).to("ltc:0")
    ref = copy.deepcopy(model).cpu()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    xc = x.cpu()
    for step in range(6):
        for o in (opt, ref_opt):
            for g in o.param_groups:
                g["lr"] = 0.1 / (step + 1)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        ltc.mark_step()
        ref_opt.zero_grad()
        ref(xc).pow(2).mean().backward()
        ref_opt.step()
    torch.testing.assert_close(model.weight.cpu(), ref.weight.detach(), rtol=1e-5, atol=1e-6)
    # zero_grad() sets grads to None, so every step is the same graph: the changing lr is a
    # runtime scalar, not part of the graph key
    assert metrics.counter_value("UncachedCompile") == 1
    assert metrics.counter_value("CachedCompile") == 5


def test_module_to_and_back():
    torch.manual_seed(2)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    lm = copy.deepcopy(m).to("ltc:0")
    ref = m(x)
    out = lm(x.to("ltc:0"))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    # BatchNorm's running stats are updated in place on the lazy device too
    torch.testing.assert_close(lm[1].running_mean.cpu(), m[1].running_mean, rtol=1e-5, atol=1e-6)
    back = lm.cpu()
    torch.testing.assert_close(back[0].weight, m[0].weight)


def test_smaller_last_batch_compiles_once_per_shape(metrics):
    """An epoch loop whose last batch is smaller: two graphs, each compiled once, reused by
    every later epoch; the per-shape compile counts say so."""
    torch.manual_seed(3)
    model = torch.nn.Linear(6, 3).to("ltc:0")
    ref = copy.deepcopy(model).cpu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = torch.randn(50, 6)
    for epoch in range(3):
        for start in range(0, 50, 16):               # batches of 16, 16, 16 and 2
            xb = data[start:start + 16]
            opt.zero_grad()
            model(xb.to("ltc:0")).pow(2).mean().backward()
            opt.step()
            ltc.mark_step()
            ref_opt.zero_grad()
            ref(xb).pow(2).mean().backward()
            ref_opt.step()
    torch.testing.assert_close(model.weight.cpu(), ref.weight.detach(), rtol=1e-5, atol=1e-6)
    assert metrics.counter_value("UncachedCompile") == 2
    assert metrics.counter_value("CachedCompile") == 10
    by_shape = metrics.compiles_by_shape()
    assert sorted(by_shape.values()) == [1, 1]
    assert any("16x6" in k for k in by_shape) and any("2x6" in k for k in by_shape)


@pytest.mark.skipif(os.environ.get("LTC_ASYNC_BACKEND", "torchscript") != "torchscript",
                    reason="sharing compiled programs across shapes is a TorchScript-backend feature")
def test_new_batch_size_reuses_the_compiled_program(metrics):
    """Beyond LTC: a graph that differs only in input shapes lowers to the same TorchScript
    program, which is shape-generic: the new batch size reuses it instead of compiling."""
    torch.manual_seed(4)
    # (a structure no other test uses: a graph of another test's structure, whatever its
    # sizes, would reuse that test's shape-generic program, not compile its own)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Softplus(beta=2.0), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    lazy = model.to("ltc:0")
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = torch.nn.functional.cross_entropy
    compiled, generic = [], []
    for batch in (16, 16, 5, 5, 16):
        # the last step's graphs prepared (compiled or found) before counting: the update's
        # graph may still be in preparation after the loss was read
        ltc.wait_device_ops()
        compiled.append(metrics.counter_value("UncachedCompile") or 0)
        generic.append(metrics.counter_value("GenericProgramHit") or 0)
        x, y = torch.randn(batch, 8), torch.randint(0, 4, (batch,))
        opt.zero_grad()
        loss = loss_fn(lazy(x.to("ltc:0")), y.to("ltc:0"))
        loss.backward()
        opt.step()
        ltc.mark_step()
        ref_opt.zero_grad()
        ref_loss = loss_fn(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(lazy.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    # the loop reads its loss every step: the first step is one graph, later ones a forward and
    # a backward with the update (`graph_executor.before_backward`); the batches of 5 compile
    # nothing: both their graphs reuse the programs compiled for 16 ...
    ltc.wait_device_ops()
    compiled.append(metrics.counter_value("UncachedCompile"))
    assert compiled[2] == compiled[3] == compiled[4] == compiled[5] > 0, compiled
    assert generic[4] - generic[2] == 2    # the first batch of 5: both graphs (the process's
    # compile cache may hold graphs of earlier programs: only this loop's steps are counted)
    assert not metrics.counter_value("CompileReuse")         # (not even lowered again)
    assert all(n == 1 for n in metrics.compiles_by_shape().values())
