"""Eager aliasing semantics on `ltc:0`: views share storage with their base, in-place ops on a view
show up in the base (and vice versa), and `ltc.mark_step()` between mutations changes nothing.

Every program below is written once as `prog(dev, step)`; it builds its inputs on the CPU from a
fixed seed, moves them to `dev`, mutates them and returns the tensors to compare.  It runs eagerly
on `cpu` (where `step` does nothing) and on `ltc:0`, once without and once with `ltc.mark_step()`
at each `step()` call; all three must give the same values, dtypes and shapes.
"""
from __future__ import annotations

import pytest
import torch

import ltc_async as ltc

DEV = "ltc:0"


def rn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _host(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    return type(v)(_host(e) for e in v)


def assert_same(actual, expected):
    if isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape, (actual.shape, expected.shape)
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        torch.testing.assert_close(actual, expected)
    else:
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)


def _no_step():
    pass


def _mark_step():
    ltc.mark_step()


def _mark_step_wait():
    ltc.mark_step(wait=True)


STEPS = {"no_step": _no_step, "mark_step": _mark_step, "mark_step_wait": _mark_step_wait}


def run_compare(prog, step_kind):
    expected = _host(prog("cpu", _no_step))
    got = prog(DEV, STEPS[step_kind])
    got_host = _host(got)
    assert_same(got_host, expected)
    # reading again (after another step) gives the same values
    ltc.mark_step()
    assert_same(_host(got), expected)


# -- programs ------------------------------------------------------------------------------------

def select_view_add_(dev, step):
    x = rn(3, 4).to(dev)
    v = x[0]
    v.add_(1)
    step()
    return x, v


def base_mutation_seen_by_view(dev, step):
    x = rn(3, 4).to(dev)
    v = x[1]
    step()
    x.mul_(2)
    return x, v


def view_then_base_then_view(dev, step):
    x = rn(4, 4).to(dev)
    v = x[:, 1]
    v.mul_(10)
    step()
    x[2].fill_(-1)
    step()
    v.sub_(3)
    return x, v


def transpose_inplace(dev, step):
    x = rn(3, 4).to(dev)
    y = x  # same object
    x.t_()
    step()
    x.add_(torch.arange(3.0).to(dev))  # broadcast over the new last dim (size 3)
    return y, x.contiguous()


def transpose_view_mutation(dev, step):
    x = rn(3, 4).to(dev)
    xt = x.t()
    xt[0].zero_()
    step()
    return x, xt


def view_reshape_inplace(dev, step):
    x = rn(2, 6).to(dev)
    v = x.view(3, 4)
    v[1].add_(100)
    step()
    w = x.view(-1)
    w[::5].mul_(-1)
    return x, v, w


def unsqueeze_view_inplace(dev, step):
    x = rn(3).to(dev)
    v = x.unsqueeze(0)
    v.mul_(3)
    step()
    return x, v


def slice_copy_(dev, step):
    x = torch.zeros(4, 5).to(dev)
    src = rn(2, 5).to(dev)
    x[1:3].copy_(src)
    step()
    x[:, 4].copy_(torch.arange(4.0))  # copy_ from a host tensor
    return x


def slice_assign_scalar(dev, step):
    x = rn(5, 3).to(dev)
    x[1:3] = 5
    step()
    x[:, -1] = -2.5
    return x


def step_slice_assign(dev, step):
    x = rn(8).to(dev)
    x[::2] = 0
    step()
    x[1::3] += 10
    return x


def setitem_tensor_value(dev, step):
    x = rn(4, 3).to(dev)
    x[2] = torch.tensor([1.0, 2.0, 3.0]).to(dev)
    x[0, 1] = x[3, 2] * 2
    return x


def setitem_bool_mask(dev, step):
    x = rn(4, 5).to(dev)
    x[x < 0] = 0
    step()
    x[x > 1] *= 2
    return x


def setitem_long_index(dev, step):
    x = rn(5, 3).to(dev)
    idx = torch.tensor([0, 3]).to(dev)
    x[idx] = -7.0
    return x


def index_put_accumulate(dev, step):
    x = torch.zeros(5).to(dev)
    idx = torch.tensor([0, 1, 1, 4]).to(dev)
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(dev)
    x.index_put_((idx,), vals, accumulate=True)
    return x


def index_add_scatter_inplace(dev, step):
    x = torch.zeros(3, 4).to(dev)
    x.index_add_(0, torch.tensor([0, 2]).to(dev), torch.ones(2, 4).to(dev))
    step()
    x.scatter_(1, torch.tensor([[1], [2], [3]]).to(dev), 9.0)
    return x


def masked_fill_inplace(dev, step):
    x = rn(3, 4).to(dev)
    v = x[1:]
    v.masked_fill_(v > 0, 0.5)
    return x, v


def inplace_on_leaf_view(dev, step):
    x = rn(3, 4).to(dev)
    row = x[2]
    row.clamp_(min=-0.1, max=0.1)
    step()
    col = x[:, 0]
    col.copy_(row[:3])  # reads the view of the already-mutated row
    return x, row, col


def view_of_view_chain(dev, step):
    x = rn(2, 3, 4).to(dev)
    a = x[1]
    b = a[:, 1:3]
    c = b.t()
    c[0].mul_(0)
    step()
    a.add_(1)
    return x, a, b, c


def chunk_views_mutation(dev, step):
    x = rn(6, 2).to(dev)
    p, q, r = x.chunk(3)
    q.fill_(3.0)
    step()
    r.add_(p)
    return x, p, q, r


def split_unbind_mutation(dev, step):
    x = rn(3, 4).to(dev)
    rows = x.unbind(0)
    rows[1].neg_()
    return x, rows[1]


def diagonal_view_mutation(dev, step):
    x = torch.zeros(4, 4).to(dev)
    x.diagonal().fill_(1.0)
    step()
    x.diagonal(1).add_(2.0)
    return x


def expand_read_after_base_mutation(dev, step):
    x = rn(3, 1).to(dev)
    e = x.expand(3, 4)
    x.mul_(2)
    return e * 1  # an expanded view must see the mutation (compute to avoid stride-0 copies)


def inplace_chain_dtypes(dev, step):
    x = torch.arange(6).view(2, 3).to(dev)
    x.mul_(3)
    step()
    x.add_(torch.tensor(1))
    x.floor_divide_(2)
    return x


def clone_breaks_aliasing(dev, step):
    x = rn(3).to(dev)
    y = x.clone()
    d = x.detach()
    y.add_(1)  # must not touch x
    step()
    d.mul_(2)  # detach shares storage with x
    return x, y, d


def out_of_place_result_not_aliased(dev, step):
    x = rn(3).to(dev)
    y = x + 0
    x.zero_()
    return x, y


def many_small_mutations_with_steps(dev, step):
    x = torch.zeros(4).to(dev)
    for i in range(6):
        x[i % 4] += i
        if i % 2:
            step()
    return x


def data_assignment(dev, step):
    x = rn(3).to(dev)
    with torch.no_grad():
        x.data.mul_(5)
    return x


def cast_then_view_inplace(dev, step):
    x = rn(2, 3).to(dev)
    y = x.double()  # a fresh tensor; its views must alias it like any other
    v = y[0]
    v.add_(1)
    step()
    z = (x * 10).long()
    z[:, 1].zero_()
    return y, v, z


def inplace_view_ops(dev, step):
    x = rn(2, 3).to(dev)
    x.unsqueeze_(0)
    step()
    x.transpose_(1, 2)
    x.squeeze_(0)
    x.add_(torch.arange(2.0).to(dev))
    return x


def self_overlapping_read_write(dev, step):
    x = rn(3, 4).to(dev)
    x[0] += x[1]
    x[:, 1:] -= x[:, :-1].clone()
    step()
    x[2] = x[0] * x[1]
    return x


def functional_inplace_on_view(dev, step):
    x = rn(4, 4).to(dev)
    torch.nn.functional.relu(x[1:3], inplace=True)
    step()
    torch.nn.functional.dropout(x, p=0.0, training=True, inplace=True)
    x[:, 0].sigmoid_()
    return x


def batch_norm_running_stats_as_views(dev, step):
    # domain-specific batch norm: one stacked buffer, each domain's running stats a row of it
    running_mean, running_var = torch.zeros(2, 3).to(dev), torch.ones(2, 3).to(dev)
    for domain, seed in ((0, 1), (1, 2), (0, 3)):
        x = rn(8, 3, seed=seed).to(dev)
        torch.nn.functional.batch_norm(x, running_mean[domain], running_var[domain], training=True, momentum=0.5)
        step()
    return running_mean, running_var


def batch_norm_buffers_assigned_from_another_state_dict(dev, step):
    # meta-device init, then load_state_dict(..., assign=True): the new module's buffers are the
    # source's, so training it updates the source's running stats too, as in eager
    torch.manual_seed(0)
    source = torch.nn.BatchNorm1d(3).to(dev)
    with torch.device("meta"):
        target = torch.nn.BatchNorm1d(3)
    target.load_state_dict(source.state_dict(), assign=True)
    target(rn(4, 3, seed=4).to(dev) + 1)
    step()
    target(rn(4, 3, seed=5).to(dev))
    return source.running_mean, source.running_var, target.running_var, source.num_batches_tracked


PROGRAMS = [
    select_view_add_, base_mutation_seen_by_view, view_then_base_then_view, transpose_inplace,
    transpose_view_mutation, view_reshape_inplace, unsqueeze_view_inplace, slice_copy_,
    slice_assign_scalar, step_slice_assign, setitem_tensor_value, setitem_bool_mask,
    setitem_long_index, index_put_accumulate, index_add_scatter_inplace, masked_fill_inplace,
    inplace_on_leaf_view, view_of_view_chain, chunk_views_mutation, split_unbind_mutation,
    diagonal_view_mutation, expand_read_after_base_mutation, inplace_chain_dtypes,
    clone_breaks_aliasing, out_of_place_result_not_aliased, many_small_mutations_with_steps,
    data_assignment, cast_then_view_inplace, inplace_view_ops, self_overlapping_read_write,
    functional_inplace_on_view, batch_norm_running_stats_as_views,
    batch_norm_buffers_assigned_from_another_state_dict,
]

# Programs failing because of engine bugs: name -> reason.
KNOWN_BUGS: dict[str, str] = {}  # program name -> one-line bug description (xfail strict)


def _params():
    out = []
    for p in PROGRAMS:
        for kind in STEPS:
            marks = []
            if p.__name__ in KNOWN_BUGS:
                marks.append(pytest.mark.xfail(strict=True, reason="BUG: " + KNOWN_BUGS[p.__name__]))
            out.append(pytest.param(p, kind, id=f"{p.__name__}-{kind}", marks=marks))
    return out


@pytest.mark.parametrize("prog,step_kind", _params())
def test_aliasing_matches_eager(prog, step_kind):
    run_compare(prog, step_kind)


def test_view_add_changes_base_explicit():
    """The headline case, spelled out."""
    x = torch.zeros(2, 3).to(DEV)
    v = x[0]
    v.add_(1)
    assert x.cpu().tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert v.cpu().tolist() == [1.0, 1.0, 1.0]


def test_t_inplace_changes_shape_and_values():
    h = rn(2, 5)
    x = h.to(DEV)
    x.t_()
    assert x.shape == (5, 2)
    torch.testing.assert_close(x.cpu(), h.t())


def test_view_shares_storage_visible_through_both_ways():
    h = rn(3, 4)
    x = h.to(DEV)
    v = x.view(4, 3)
    x[0, 0] = 42.0
    v[3, 2] = -42.0
    exp = h.clone()
    exp[0, 0] = 42.0
    exp[2, 3] = -42.0
    torch.testing.assert_close(x.cpu(), exp)
    torch.testing.assert_close(v.cpu(), exp.view(4, 3))


def test_host_tensor_not_modified_by_device_mutation():
    h = rn(3, 4)
    orig = h.clone()
    x = h.to(DEV)
    x.add_(1)
    x.cpu()
    torch.testing.assert_close(h, orig)
    # and the other way round: mutating the host source later does not leak into the device copy
    y = h.to(DEV)
    h.mul_(0)
    torch.testing.assert_close(y.cpu(), orig)


def test_cpu_result_is_a_copy():
    x = rn(3).to(DEV)
    c = x.cpu()
    before = c.clone()
    x.add_(5)
    torch.testing.assert_close(c, before)
    torch.testing.assert_close(x.cpu(), before + 5)


# -- optimizers ----------------------------------------------------------------------------------

def _train(dev, opt_name, steps=4, mark_step=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model = model.to(dev)
    if opt_name == "sgd_momentum":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3,
                              foreach=False)
    elif opt_name == "sgd_momentum_foreach":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, foreach=True)
    elif opt_name == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    losses = []
    for i in range(steps):
        x = rn(5, 6, seed=10 + i).to(dev)
        y = rn(5, 2, seed=20 + i).to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if mark_step and dev != "cpu":
            ltc.mark_step()
    params = [p.detach().cpu() for p in model.parameters()]
    bufs = [opt.state[p]["momentum_buffer" if "sgd" in opt_name else "exp_avg"].detach().cpu()
            for p in model.parameters()]
    return [l.cpu() for l in losses], params, bufs


@pytest.mark.parametrize("mark_step", [False, True], ids=["no_step", "mark_step"])
@pytest.mark.parametrize("opt_name", ["sgd_momentum", "sgd_momentum_foreach", "adam", "adamw_foreach"])
def test_optimizer_matches_eager(opt_name, mark_step):
    exp = _train("cpu", opt_name)
    got = _train(DEV, opt_name, mark_step=mark_step)
    for g, e in zip(got, exp):
        assert_same(g, e)
    # a real training signal: parameters actually moved away from initialization
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    assert not torch.allclose(got[1][0], init[0].weight.detach())


def test_param_view_inplace_under_no_grad():
    """`with torch.no_grad(): p[0].zero_()` on a parameter (a leaf view mutation)."""
    def run(dev):
        torch.manual_seed(1)
        lin = torch.nn.Linear(3, 4).to(dev)
        with torch.no_grad():
            lin.weight[0].zero_()
            lin.bias[1:3].fill_(2.0)
        out = lin(torch.ones(2, 3).to(dev))
        return lin.weight.detach().cpu(), lin.bias.detach().cpu(), out.detach().cpu()
    assert_same(run(DEV), run("cpu"))


def test_inplace_on_leaf_view_requiring_grad_raises_like_eager():
    h = rn(3)
    x = h.to(DEV).requires_grad_()
    with pytest.raises(RuntimeError):
        x[0].add_(1)  # a view of a leaf that requires grad
    xc = h.clone().requires_grad_()
    with pytest.raises(RuntimeError):
        xc[0].add_(1)


def test_inplace_after_grad_graph():
    """In-place ops on non-leaf tensors inside autograd, then backward."""
    def run(dev):
        w = rn(4, seed=3).to(dev).requires_grad_()
        y = w * 2
        y[1:3].mul_(3)
        y.relu_()
        y.sum().backward()
        return y.detach().cpu(), w.grad.cpu()
    assert_same(run(DEV), run("cpu"))


@pytest.mark.parametrize("mark_step", [False, True], ids=["no_step", "mark_step"])
def test_batchnorm_running_stats_inplace_updates(mark_step):
    """BatchNorm updates its buffers in place every training forward."""
    def run(dev):
        torch.manual_seed(2)
        bn = torch.nn.BatchNorm1d(4, momentum=0.3).to(dev)
        for i in range(3):
            bn(rn(8, 4, seed=30 + i).to(dev))
            if mark_step and dev != "cpu":
                ltc.mark_step()
        bn.eval()
        out = bn(rn(2, 4, seed=40).to(dev))
        return (bn.running_mean.cpu(), bn.running_var.cpu(), bn.num_batches_tracked.cpu(),
                out.detach().cpu())
    assert_same(run(DEV), run("cpu"))


def test_out_variants_and_grad_modes_match_eager():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    la, lb = a.to("ltc:0"), b.to("ltc:0")
    out = torch.empty(3, 4, device="ltc:0")
    ret = torch.add(la, lb, alpha=2, out=out)
    assert ret is out
    torch.testing.assert_close(out.cpu(), torch.add(a, b, alpha=2))
    resized = torch.empty(0, device="ltc:0")
    torch.mul(la, 3, out=resized)                   # out= resizes like eager
    assert resized.shape == (3, 4)
    torch.testing.assert_close(resized.cpu(), a * 3)
    w = torch.ones(4, device="ltc:0", requires_grad=True)
    with torch.no_grad():
        w.mul_(2)                                   # in-place on a leaf under no_grad
        frozen = la @ w
    assert w.requires_grad and not frozen.requires_grad
    d = w.detach()
    d.add_(1)                                       # detach shares storage, as in eager
    torch.testing.assert_close(w.detach().cpu(), torch.full((4,), 3.0))
    c = w.clone()
    c.add_(1)                                       # clone does not
    torch.testing.assert_close(w.detach().cpu(), torch.full((4,), 3.0))
    v = torch.zeros(2, 2, device="ltc:0").requires_grad_()
    (v * la[:2, :2]).sum().backward()
    torch.testing.assert_close(v.grad.cpu(), a[:2, :2])


# -- the same in-place call again and again (after its first call per signature, the op path
# skips functionalization's kernel: patches/seam.py, "in-place ops on ltc tensors")

def _message_passing_steps(dev):
    """PyG's sum aggregation and GCN normalization, as a training loop runs them: the same
    in-place calls (`scatter_add_`, `pow_`, `masked_fill_`, `index_add_`, `add_` through a view)
    every step, under autograd, with an optimizer writing the weights in place."""
    g = torch.Generator().manual_seed(0)
    x, ei = torch.randn(20, 8, generator=g), torch.randint(0, 20, (2, 60), generator=g)
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    x, ei, lin = x.to(dev), ei.to(dev), lin.to(dev)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, foreach=False)   # per-tensor add_ writes
    out = []
    for _ in range(4):
        opt.zero_grad()
        deg = torch.zeros(20, device=dev).scatter_add_(0, ei[1], torch.ones(60, device=dev))
        norm = deg.pow_(-0.5)
        norm.masked_fill_(norm == float("inf"), 0)
        h = lin(x)
        msg = h[ei[0]] * (norm[ei[0]] * norm[ei[1]]).unsqueeze(-1)
        agg = torch.zeros(20, 4, device=dev).index_add_(0, ei[1], msg)
        agg[:, 0].add_(1.0)                    # a write through a view of a fresh tensor
        loss = agg.square().mean()
        loss.backward()
        opt.step()
        if dev != "cpu":
            ltc.mark_step()
        out.append(loss.detach())
    return [*out, lin.weight.detach(), lin.bias.detach(), norm]


def test_repeated_in_place_ops_under_autograd_match_eager():
    assert_same(_host(_message_passing_steps(DEV)), _host(_message_passing_steps("cpu")))


def test_repeated_in_place_errors_are_raised_every_time_and_leave_the_target_as_it_was():
    x = torch.ones(3, 4, device=DEV)
    i = torch.zeros(3, dtype=torch.long, device=DEV)
    for _ in range(3):
        x.add_(torch.ones(4, device=DEV))           # the signature passes, then the bad call
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            x.add_(torch.ones(2, 3, 4, device=DEV))
        with pytest.raises(RuntimeError, match="can't be cast"):
            i.add_(1.5)
    torch.testing.assert_close(x.cpu(), torch.full((3, 4), 4.0))
    assert i.cpu().tolist() == [0, 0, 0]


def test_repeated_in_place_writes_through_views_reach_every_alias():
    def prog(dev, step):
        x = rn(4, 6).to(dev)
        v = x[1:3]                                  # a view written many times
        vt = x.t()                                  # another alias, read after
        for k in range(5):
            v.mul_(1.5)
            x[:, k].add_(k)
            step()
        return x, v, vt.contiguous()
    for kind in STEPS:
        run_compare(prog, kind)


def test_a_dispatch_mode_sees_the_functional_op_of_a_repeated_in_place_call():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    x = torch.zeros(5, device=DEV)
    for _ in range(3):
        x.add_(1)                                   # the signature is known
    with Seen() as seen:
        x.add_(1)
    assert any("add" in op for op in seen.ops), seen.ops
    assert x.cpu().tolist() == [4.0] * 5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_repeated_in_place_ops_cast_back_to_the_target_dtype_like_eager(dtype):
    """`x.add_(y)` with a wider `y`: eager computes in the promoted type and casts into `x`;
    the same calls again and again (the fast path after the first) give eager's values."""
    def prog(dev, step):
        g = torch.Generator().manual_seed(3)
        x = (torch.randn(4, 5, generator=g) * 10).to(dtype).to(dev)
        y = torch.randn(4, 5, generator=g).to(dev)           # float32
        v = x[1]                                             # a view of the target
        for k in range(4):
            if dtype.is_floating_point:
                x.add_(y, alpha=0.5)
                x.mul_(1.25)
            else:
                x.add_(x[0].clone())                         # ints stay ints
                x.mul_(2)
            v.sub_(1)
            step()
        return x, v
    for kind in STEPS:
        run_compare(prog, kind)
