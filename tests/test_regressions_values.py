"""Regressions: the tensor/IR/lowering layer never silently computes the wrong thing.

Each test pins one bug found by review or by the differential fuzzer (`tests/test_fuzz.py`) and
compares with eager PyTorch.  Cache keys are the recurring theme: two ops that differ only in a
constant Python calls equal (`1 == 1.0 == True`, `0.0 == -0.0`, NaN) must not share a shape
inference result, a compiled graph or a cached upload.
"""
from __future__ import annotations

import pytest
import torch
from conftest import eager_device

import ltc_async as ltc

DEV = "ltc:0"
NAN = float("nan")


def same(lazy: torch.Tensor, eager: torch.Tensor) -> None:
    host = lazy.cpu()
    assert host.dtype == eager.dtype, (host.dtype, eager.dtype)
    assert host.shape == eager.shape, (host.shape, eager.shape)
    torch.testing.assert_close(host, eager, equal_nan=True, rtol=0, atol=0)
    # signs of zeros and NaNs too
    assert torch.equal(torch.signbit(host), torch.signbit(eager)), (host, eager)


def both(fn):
    """Run `fn(device)` eagerly and lazily (twice, with a step between: the second run hits
    every cache the first filled); compare each lazy result with eager."""
    expected = fn("cpu")
    for _ in range(2):
        same(fn(DEV), expected)
        ltc.mark_step()


# -- 1. constants that Python calls equal ------------------------------------------------------

@pytest.mark.parametrize("first,second", [(4, 4.0), (4.0, 4), (True, 1), (1, True), (1.0, True)])
def test_factory_scalar_type_decides_dtype(first, second):
    # `arange(4)` traced first must not make `arange(4.0)` int64 (and vice versa)
    for v in (first, second):
        both(lambda d: torch.arange(v, device=d))
        both(lambda d: torch.full((2,), v, device=d))


@pytest.mark.parametrize("order", [(0.0, -0.0), (-0.0, 0.0)])
def test_signed_zero_constants(order):
    for v in order:
        both(lambda d: 1 / torch.full((2,), v, device=d))
        both(lambda d: torch.nan_to_num(torch.tensor([NAN, 1.0], device=d), nan=v))
        both(lambda d: torch.tensor([1.0, 2.0], device=d) * v)          # runtime scalar
        both(lambda d: torch.tensor([1.0, -2.0], device=d).clamp(min=v))


@pytest.mark.parametrize("order", [(0, 0.0), (0.0, 0), (False, 0)])
def test_scalar_optional_type_decides_dtype(order):
    t = torch.tensor([1, -2, 3])
    for v in order:
        both(lambda d: t.to(d).clamp(min=v))


def test_nan_constants_match_and_reuse_the_compiled_graph():
    x = torch.tensor([1.0, NAN, -0.0])
    for v in (NAN, -NAN, NAN):
        both(lambda d: torch.copysign(torch.full((3,), v, device=d), x.to(d)))
        both(lambda d: torch.copysign(torch.ones(3, device=d), torch.full((3,), v, device=d)))
    # a NaN constant is equal to itself as a key: the same program does not recompile
    ltc.metrics.reset()
    for _ in range(3):
        y = torch.full((3,), float("nan"), device=DEV) + 1
        ltc.mark_step()
    assert ltc.metrics.counter_value("UncachedCompile") <= 1
    assert torch.isnan(y.cpu()).all()


def test_zero_dim_upload_cache_keeps_nan_sign_and_zero_sign():
    x = torch.tensor([1.0, 2.0])
    for v in (NAN, -NAN, 0.0, -0.0, 1, True):
        both(lambda d: torch.copysign(x.to(d), torch.tensor(v).to(d)))


def test_ir_dump_shows_constant_values():
    t = torch.tensor([1.0, 2.0], device=DEV).clamp(min=-0.0)
    assert "-0.0" in ltc.debug.dump_ir([t])


# -- 2. layouts: a tensor's strides are its value's strides ------------------------------------

def _group_norm_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 4, 3, generator=g), torch.randn(4, generator=g), torch.randn(4, generator=g))


def test_group_norm_backward_through_sum_matches_eager():
    # `.sum()`'s incoming gradient is an expanded (stride-0) tensor; autograd's formula calls
    # `.contiguous()` on it for a kernel that reads raw memory
    import torch.nn.functional as F
    grads = []
    for dev in ("cpu", DEV):
        x, w, b = (t.to(dev).requires_grad_() for t in _group_norm_inputs())
        F.group_norm(x, 2, w, b).sum().backward()
        grads.append([t.grad.cpu() for t in (x, w, b)])
    for lazy, eager in zip(grads[1], grads[0]):
        torch.testing.assert_close(lazy, eager)


@pytest.mark.parametrize("make", ["expand", "transpose", "copy_"])
def test_contiguous_and_copy_give_the_layout_they_promise(make):
    # a raw-memory kernel given `.contiguous()` / a copied-into buffer must see that layout
    aten = torch.ops.aten
    x, w, _ = _group_norm_inputs()
    _, mean, rstd = aten.native_group_norm(x, w, None, 2, 4, 3, 2, 1e-5)

    def run(d):
        if make == "expand":
            g = torch.tensor(1.5, device=d).expand(2, 4, 3).contiguous()
        elif make == "transpose":
            g = torch.arange(24., device=d).reshape(3, 4, 2).transpose(0, 2).contiguous()
        else:
            g = torch.empty(2, 4, 3, device=d)
            g.copy_(torch.arange(24., device=d).reshape(3, 4, 2).transpose(0, 2))
        return aten.native_group_norm_backward(g, x.to(d), mean.to(d), rstd.to(d), w.to(d),
                                               2, 4, 3, 2, [True, True, False])[0]
    expected = run("cpu")
    got = run(DEV)
    torch.testing.assert_close(got.cpu(), expected)


# -- 3. in-place ops whose result is cast back to the target's dtype ---------------------------

@pytest.mark.parametrize("case", ["add_f64", "add_f64_view", "cumsum_int32", "mul_f64_0dim", "sub_int_bool"])
def test_inplace_result_cast_to_target_dtype(case):
    def prog(d):
        if case == "add_f64":
            x = torch.ones(3, device=d)
            x.add_(torch.full((3,), 0.25, dtype=torch.float64, device=d))
        elif case == "add_f64_view":
            x = torch.ones(2, 3, device=d)
            x[1].add_(torch.full((3,), 0.25, dtype=torch.float64, device=d))
        elif case == "cumsum_int32":
            x = torch.arange(4, dtype=torch.int32, device=d)
            x.cumsum_(0)
        elif case == "mul_f64_0dim":
            x = torch.ones(3, device=d)
            x.mul_(torch.tensor(2.5, dtype=torch.float64, device=d))
        else:
            x = torch.arange(3, dtype=torch.int32, device=d)
            x.sub_(torch.ones(3, dtype=torch.bool, device=d).to(torch.int64))
        return x * 2  # the target stays usable
    expected = prog("cpu")
    same(prog(DEV), expected)


# -- 4. a failing op leaves its inputs intact --------------------------------------------------

@pytest.mark.parametrize("bad", ["t_", "transpose_", "unsqueeze_", "squeeze_", "swapdims_", "as_strided_"])
def test_failing_inplace_view_leaves_tensor_intact(bad):
    calls = {"t_": lambda y: y.t_(), "transpose_": lambda y: y.transpose_(0, 5),
             "unsqueeze_": lambda y: y.unsqueeze_(7), "squeeze_": lambda y: y.squeeze_(7),
             "swapdims_": lambda y: y.swapdims_(0, 9), "as_strided_": lambda y: y.as_strided_((100,), (1,))}

    def prog(d):
        y = torch.arange(24., device=d).reshape(2, 3, 4)
        z = y[0]                     # a view: updating it makes `y` replay its view chain
        with pytest.raises((RuntimeError, IndexError)) as info:
            calls[bad](y)
        z.add_(1)
        return y, type(info.value)
    (ey, etype), (ly, ltype) = prog("cpu"), prog(DEV)
    assert ltype is etype
    same(ly, ey)
    same(ly.t() if ly.dim() == 2 else ly.sum(0), ey.t() if ey.dim() == 2 else ey.sum(0))


def test_failing_ops_leave_inputs_intact():
    def prog(d):
        y = torch.arange(6., device=d)
        v = y[1:]
        for bad in (lambda: y.view(4, 2), lambda: y.add_(torch.ones(2, 3, device=d)),
                    lambda: torch.ones(3, dtype=torch.int64, device=d).add_(torch.ones(3, device=d)),
                    lambda: v.unsqueeze_(0).unsqueeze_(0).t_()):
            with pytest.raises(RuntimeError):
                bad()
        v.mul_(2)
        return y, v
    (ly, lv), (ey, ev) = prog(DEV), prog("cpu")
    same(ly, ey)
    same(lv, ev)


# -- 5. in-place writes through views whose elements share memory -----------------------------

_ALIASED_WRITES = {
    "expand.fill_": lambda x: x.expand(2, 4).fill_(3.0),
    "expand.zero_": lambda x: x.unsqueeze(0).expand(3, 4).zero_(),
    "expand_0d.fill_": lambda x: x[0].expand(4).fill_(5.0),
    "expand.masked_fill_": lambda x: x.expand(2, 4).masked_fill_(torch.tensor([True, False, True, False]).to(x.device), 9.0),
    "expand.setitem": lambda x: x.expand(2, 4).__setitem__((slice(None), 1), 7.0),
    "expand.add_": lambda x: x.expand(2, 4).add_(1),
    "expand.iadd": lambda x: x.expand(2, 4).__iadd__(1),
    "expand.copy_": lambda x: x.expand(2, 4).copy_(torch.ones(4).to(x.device)),
    "as_strided_overlap.add_": lambda x: x.as_strided((2, 2), (1, 1)).add_(1),
    "as_strided_overlap.copy_": lambda x: x.as_strided((2, 2), (1, 1)).copy_(torch.arange(4.0).view(2, 2).to(x.device)),
    "as_strided_of_view.add_": lambda x: x[1:].as_strided((2,), (2,)).add_(1),
    "unfold.fill_": lambda x: x.unfold(0, 2, 1).fill_(1.0),
    "unfold.mul_": lambda x: x.unfold(0, 2, 1).mul_(2.0),
}


@pytest.mark.filterwarnings("ignore:Use of .* on expanded tensors is deprecated")
@pytest.mark.parametrize("write", sorted(_ALIASED_WRITES))
def test_inplace_write_through_aliasing_view_matches_eager(write):
    def prog(d):
        x = torch.arange(4.0, device=d)
        keep = x[1:3]                        # another view of the base sees the write too
        try:
            _ALIASED_WRITES[write](x)
            error = None
        except RuntimeError as e:
            error = str(e).split(".")[0]
        return x, keep, error
    ex, ekeep, eerr = prog("cpu")
    lx, lkeep, lerr = prog(DEV)
    assert lerr == eerr
    same(lx, ex)
    same(lkeep, ekeep)
    same(lx + 1, ex + 1)                    # and the base stays usable


def test_aliasing_write_with_autograd_raises_clearly():
    w = torch.ones(4, device=DEV, requires_grad=True)
    y = w * 2
    with pytest.raises(RuntimeError, match="autograd"):
        y.expand(2, 4).fill_(0.0)
    torch.testing.assert_close(y.cpu(), torch.full((4,), 2.0))


def test_inplace_view_op_on_tensor_requiring_grad_raises_instead_of_wrong_gradient():
    # autograd replays `b = a[0]` on `a`'s new layout after `a.t_()`: the gradient went to
    # `a`'s first column; ltc refuses the in-place view op instead
    w = torch.arange(4.0, device=DEV).view(2, 2).requires_grad_()
    a = w * 1
    b = a[0]
    with pytest.raises(RuntimeError, match="in-place view op"):
        a.t_()
    (b * torch.tensor([1.0, 10.0], device=DEV)).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), torch.tensor([[1.0, 10.0], [0.0, 0.0]]))
    with torch.no_grad():                   # without autograd it is fine
        a.t_()
    torch.testing.assert_close(a.detach().cpu(), torch.arange(4.0).view(2, 2).t())


# -- 6. found by the fuzzer ---------------------------------------------------------------------

@pytest.mark.parametrize("case", ["mul_float", "imul_float", "add_float_tensor", "bool_add_int", "div_",
                                  "clamp_float", "float_add_complex"])
def test_inplace_result_that_cannot_be_cast_back_raises_like_eager(case):
    calls = {"mul_float": lambda x, d: x.mul_(1.0), "imul_float": lambda x, d: x.__imul__(1.5),
             "add_float_tensor": lambda x, d: x.add_(torch.ones(3, device=d)),
             "bool_add_int": lambda x, d: x.bool().add_(1), "div_": lambda x, d: x.div_(2),
             "clamp_float": lambda x, d: x.clamp_(min=0.5),
             "float_add_complex": lambda x, d: x.float().add_(1j)}

    def prog(d):
        x = torch.arange(3, device=d)
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type") as info:
            calls[case](x, d)
        return x * 2, str(info.value)
    (lx, lmsg), (ex, emsg) = prog(DEV), prog("cpu")
    same(lx, ex)
    assert lmsg.split(" type ")[1] == emsg.split(" type ")[1]   # names the same result type


@pytest.mark.parametrize("case", ["shift_copy", "add_transposed", "add_own_row", "disjoint_chunks",
                                  "full_alias", "index_put_from_slice"])
def test_inplace_write_reading_an_aliased_argument_matches_eager(case):
    calls = {"shift_copy": lambda x: x[1:].copy_(x[:-1]),
             "add_transposed": lambda x: x.view(2, 2).add_(x.view(2, 2).t()),
             "add_own_row": lambda x: x.view(2, 2).add_(x.view(2, 2)[0]),
             "disjoint_chunks": lambda x: x.chunk(2)[1].add_(x.chunk(2)[0]),
             "full_alias": lambda x: x.add_(x.view(2, 2).view(4)),
             "index_put_from_slice": lambda x: x.index_put_((torch.tensor([0, 1]).to(x.device),), x[2:])}

    def prog(d):
        x = torch.arange(4.0, device=d)
        try:
            calls[case](x)
            err = None
        except RuntimeError as e:
            err = str(e)[:60]
        return x, err
    (lx, lerr), (ex, eerr) = prog(DEV), prog("cpu")
    assert lerr == eerr
    same(lx, ex)


@pytest.mark.parametrize("layout", ["expanded", "sliced", "transposed"])
def test_upload_takes_the_strides_of_the_device_copy(layout):
    base = torch.arange(12.0).reshape(3, 4)
    host = {"expanded": base[:1].expand(3, 4), "sliced": base[:, ::2], "transposed": base.t()}[layout]
    lazy = host.to(DEV)
    assert lazy.stride() == host.clone().stride()        # what `.to(device)` gives in eager
    lazy.add_(1)                                          # a dense copy: writes do not alias
    same(lazy, host + 1)


@pytest.mark.filterwarnings("ignore:Use of .* on expanded tensors is deprecated")
def test_aliasing_write_through_a_detached_alias_reaches_the_base():
    def prog(d):
        t = torch.tensor([[1.0, 2.0]], device=d, requires_grad=True)
        e = t.detach().expand(3, 2)     # detach() aliases t's storage without an autograd base
        e.masked_fill_(torch.tensor([[True, False]] * 3).to(d), 3.0)
        return t.detach(), e
    (lt, le), (et, ee) = prog(DEV), prog("cpu")
    same(lt, et)
    same(le, ee)


def test_aliasing_write_through_a_detached_view_raises_clearly():
    t = torch.tensor([[1.0, 2.0]], device=DEV)
    v = t.expand(3, 2).detach()         # no way back to `t` from here on ltc
    with pytest.raises(RuntimeError, match="clone"):
        v.fill_(3.0)
    same(t, torch.tensor([[1.0, 2.0]]))  # nothing half-written


def test_aliasing_write_after_an_inplace_transpose_of_the_base():
    # found by the fuzzer: after `x.t_()` the base itself carries a view (t_) of its storage
    def prog(d):
        x = torch.arange(6.0, device=d).reshape(2, 3)
        x.t_()
        s = x.as_strided((2,), (2,))
        s.add_(10)
        x[:, :1].expand(3, 2).fill_(-1.0)
        return x, s
    (lx, ls), (ex, es) = prog(DEV), prog("cpu")
    same(lx, ex)
    same(ls, es)


def test_write_through_an_alias_reading_its_base():
    # found by the fuzzer: `v.t()` of a 0-dim tensor aliases it whole; lerp_ reads the base
    def prog(d):
        x = torch.tensor(0.5, device=d, dtype=torch.float64)
        v = x.t()
        v.lerp_(x, 0.5)
        return x, v
    (lx, lv), (ex, ev) = prog(DEV), prog("cpu")
    same(lx, ex)
    same(lv, ev)


def test_op_failing_inside_a_cpp_backward_formula_raises_at_backward():
    # found by the fuzzer: atan2's backward negates its bool input; the error used to abort the
    # process (PyTorch's Python-backed device guard is called while the exception unwinds)
    def prog(d):
        x = torch.ones(3, dtype=torch.float64, device=d, requires_grad=True)
        y = torch.atan2(torch.ones(3, dtype=torch.bool, device=d), x)
        with pytest.raises(RuntimeError, match="Negation, the `-` operator, on a bool tensor"):
            y.sum().backward()
        (x * 2).sum().backward()            # the next backward works
        return x.grad
    same(prog(DEV), prog("cpu"))


@pytest.mark.parametrize("case", ["expand_same_shape", "expand_unsqueezed", "unfold_with_gaps", "bool_expand_add"])
def test_write_through_expand_or_unfold_view_matches_eager(case):
    # found by the fuzzer: functionalization writes these back as base + (new - old), or by
    # summing windows into zeros; big values, infinities, bools and uncovered elements broke
    calls = {"expand_same_shape": lambda x: x.expand(6).fill_(1.0),
             "expand_unsqueezed": lambda x: x.unsqueeze(0).expand(1, 6).fill_(1.0),
             "unfold_with_gaps": lambda x: x.unfold(0, 2, 3).mul_(2.0),
             "bool_expand_add": lambda x: x.bool()[:1].expand(1).add_(True)}

    def prog(d):
        x = torch.tensor([1e20, float("inf"), 3.0, 4.0, 5.0, 6.0], device=d)
        out = calls[case](x)
        return x, out
    (lx, lo), (ex, eo) = prog(DEV), prog("cpu")
    same(lx, ex)
    same(lo, eo)


def test_write_reading_a_detached_alias_after_an_inplace_as_strided():
    # found by the fuzzer: the written tensor carries its own as_strided_ view; the detached
    # alias is a view of it, so it serves as the base of the host write
    def prog(d):
        x = torch.tensor(2.0, device=d)
        x.as_strided_((1,), (1,))
        x.add_(x.detach())
        return x
    same(prog(DEV), prog("cpu"))


def test_write_to_a_detached_alias_reading_its_source():
    # found by the long fuzz run: the argument is the base of the written alias
    def prog(d):
        x = torch.tensor(2.0, device=d)
        y = x.detach()
        y.add_(x)
        return x, y
    (lx, ly), (ex, ey) = prog(DEV), prog("cpu")
    same(lx, ex)
    same(ly, ey)


def test_inplace_as_strided_on_an_empty_slice_checks_the_base_storage():
    # found by the long fuzz run: the bounds check used the view's own (empty) storage
    def prog(d):
        x = torch.arange(2.0, device=d).reshape(2, 1)
        v = x[..., 1:]                      # (2, 0), storage offset 1 in eager
        v.as_strided_((1,), (1,))
        return x, v
    (lx, lv), (ex, ev) = prog(DEV), prog("cpu")
    same(lx, ex)
    same(lv, ev)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.arange(2.0, device=DEV)[1:].as_strided_((2,), (1,))


def test_recorded_write_reading_an_overlapping_argument_raises_like_eager():
    # found by the long fuzz run: under autograd the write keeps the functional semantics, but
    # must still reject what eager rejects
    def prog(d):
        w = torch.ones(1, 2, device=d, requires_grad=True)
        x = w * 1
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            x.add_(x.unbind(0)[0][:1])
        return x
    same(prog(DEV), prog("cpu"))


def test_write_reading_an_alias_made_before_an_inplace_view_op_raises_clearly():
    # documented limit: no tensor holds the base any more (x.squeeze_() re-viewed it)
    x = torch.arange(4.0, device=DEV).view(2, 2).clone()
    s = x.as_strided((2,), (2,))
    x.squeeze_()
    with pytest.raises(RuntimeError, match="whole base"):
        x.add_(s)
    same(x, torch.arange(4.0).view(2, 2))


def test_write_through_as_strided_view_after_inplace_as_strided_of_its_base():
    # found by the long fuzz run: the base itself was re-viewed by as_strided_, which
    # functionalization cannot write through; the host write chose it as its base and recursed
    def prog(d):
        x = torch.arange(9, device=d).reshape(3, 3)
        t = x.t()                           # an alias taken before the in-place view ops
        x.squeeze_()
        v = x.as_strided((2,), (1,))
        x.add_(x)
        x.as_strided_((1,), (1,))
        v.clamp_(min=x.min().item())
        return x, v, t
    for lazy, eager in zip(prog(DEV), prog("cpu")):
        same(lazy, eager)


def test_write_through_as_strided_of_a_reviewed_base_raises_clearly():
    # the long fuzz run's program: neither the view nor its base takes the write exactly any
    # more (as_strided past their first view); a documented limit, a clear error, data intact
    g = torch.Generator().manual_seed(1487)
    data = torch.randint(-6, 7, (3, 3), generator=g)
    x = data.to(DEV)
    x.detach().cpu()
    x.t()
    x.squeeze_()
    v = x.as_strided((2,), (1,))
    x.add_(x)
    x.as_strided_((1,), (1,))
    with pytest.raises(RuntimeError, match="whole base"):
        v.clamp_(min=x.min().item())
    expected = data * 2
    same(v, expected.view(-1)[:2])
    same(x, expected.view(-1)[:1])


def test_write_through_inplace_as_strided_of_a_slice_reaches_the_base():
    # found by the long fuzz run: functionalization dropped the write silently
    def prog(d):
        x = torch.tensor([[1.0], [2.0]], device=d)
        v = x[..., 1:]                      # (2, 0) at storage offset 1
        v.as_strided_((1,), (1,))           # now x[1, 0]
        v.add_(torch.tensor(10.0, device=d))
        return x, v
    (lx, lv), (ex, ev) = prog(DEV), prog("cpu")
    same(lx, ex)
    same(lv, ev)


def test_inplace_as_strided_of_an_empty_slice_of_an_as_strided_base():
    # found by the CI fuzz run: the slice's base was itself re-viewed by as_strided_, so the
    # bounds check had no base of whole views and used the empty slice's own storage
    def prog(d):
        x = torch.tensor([1.0, 2.0, 3.0], device=d)
        x.as_strided_((1,), (1,))           # storage keeps 3 elements
        v = x[..., 1:]                      # (0,) at storage offset 1 in eager
        v.as_strided_((2,), (1,))           # storage elements 1 and 2
        return x, v
    for lazy, eager in zip(prog(DEV), prog("cpu")):
        same(lazy, eager)
    x = torch.tensor([1.0, 2.0], device=DEV)
    x.as_strided_((1,), (1,))
    with pytest.raises(RuntimeError, match="out of bounds"):
        x[..., 1:].as_strided_((2,), (1,))
    same(x, torch.tensor([1.0]))


def test_write_through_as_strided_of_a_slice_of_an_as_strided_base_raises_clearly():
    # writing there needs the storage's elements outside `x` (eager writes element 1 of 0..3,
    # which `x` does not show): a documented limit, not a wrong element
    x = torch.arange(4.0, device=DEV)
    x.as_strided_((2,), (2,))               # [0, 2]
    v = x[1:]
    v.as_strided_((1,), (1,), 1)
    with pytest.raises(RuntimeError, match="whole base"):
        v.mul_(10)
    same(x, torch.tensor([0.0, 2.0]))
    same(v, torch.tensor([1.0]))


def test_as_strided_of_a_view_reading_past_it_raises_clearly():
    # found by the CI fuzz run: a view of a computed tensor keeps only its own elements on ltc,
    # so an as_strided reaching into the rest of eager's storage is a documented limit
    x = torch.arange(2.0, device=DEV).reshape(1, 2, 1).permute(2, 1, 0) * 1
    v = torch.diagonal(x, 0)                     # one element of x's two
    with pytest.raises(RuntimeError, match="an ltc view keeps only its own elements"):
        v.as_strided((2,), (1,))
    same(v.as_strided((1,), (1,)), torch.tensor([0.0]))   # within the view: eager's value
    same(x.as_strided((2,), (1,)), torch.tensor([0.0, 1.0]))  # on the base, as the error says


def _default_dtype_program(device: str) -> list:
    """Scientific code switching the default dtype, as a `with` block or a test fixture does."""
    out = []
    ids = torch.arange(5).to(device)
    for default in (torch.float32, torch.float64, torch.float32):
        old = torch.get_default_dtype()
        torch.set_default_dtype(default)
        try:
            out += [torch.ones(3, device=device), torch.full((2,), 0.1, device=device),
                    torch.linspace(0, 1, 7, device=device), torch.arange(0, 1, 0.125, device=device),
                    ids * 0.1, ids / 3, ids.sqrt(), torch.atan2(ids, ids + 1), (ids > 2) * 0.5,
                    torch.zeros(2, 2, device=device).dtype, torch.scalar_tensor(1 / 3, device=device)]
            pending = ids * (1 / 7)         # read after the default changed back: the trace's
        finally:                            # default decides, not the one at the cut
            torch.set_default_dtype(old)
        if device.startswith("ltc"):
            ltc.mark_step()
        out.append(pending)
    return out


def test_the_default_dtype_when_traced_decides_dtypes_and_precision():
    """`torch.set_default_dtype` after ops had run: factories and integer tensors promoted by a
    Python float kept the old dtype (a per-signature cache), and a graph cut after the default
    changed back computed float64 results in float32."""
    want = _default_dtype_program(str(eager_device()))   # eager on ltc:0's backing device
    got = _default_dtype_program("ltc:0")
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor):
            h, w = g.cpu(), w.cpu()
            assert h.dtype == w.dtype, (i, h.dtype, w.dtype)
            torch.testing.assert_close(h, w, rtol=0, atol=0, msg=lambda m: f"output {i}: {m}")
        else:
            assert g == w, (i, g, w)


_IN_PLACE_CALLS = {
    "cast_back": lambda d, i, x: i.add_(0.5),
    "grows_the_target": lambda d, i, x: x.add_(torch.ones(2, 3, 4).to(d)),
    "overlapping_input": lambda d, i, x: x[0].mul_(x),
    "negative_int_power": lambda d, i, x: i.pow_(-1),
    "bound_does_not_broadcast": lambda d, i, x: x.clamp_(min=torch.ones(5).to(d)),
    "out_cannot_hold_it": lambda d, i, x: torch.add(x, 1, out=torch.empty(3, 4, dtype=torch.long).to(d)),
    "out_overlaps_an_input": lambda d, i, x: torch.add(x[1:], 1, out=x[:-1]),
    "out_into_its_own_pieces": lambda d, i, x: torch.cat([x[:1], x[1:]], out=x),
    "out_is_the_input": lambda d, i, x: torch.mul(x, 1.0, out=x),
    "out_beside_the_input": lambda d, i, x: torch.mul(x[:1], 1.0, out=x[2:]),
    "valid_clamp": lambda d, i, x: x.clamp_(0.2, 0.8),
    "valid_pow": lambda d, i, x: x.pow_(0.5),
    "valid_int_add": lambda d, i, x: i.add_(2),
    "valid_index_add": lambda d, i, x: x.index_add_(0, torch.tensor([0, 2]).to(d), x[:2].clone()),
}


def _in_place_program(device: str) -> tuple[list, torch.Tensor, torch.Tensor]:
    i = torch.arange(4).to(device)
    x = torch.linspace(0.1, 1.2, 12).view(3, 4).to(device)
    outcomes = []
    for _ in range(3):   # a valid call and a refused one, again and again: each answers the same
        for name, call in _IN_PLACE_CALLS.items():
            try:
                call(device, i, x)
                outcomes.append((name, None))
            except RuntimeError as e:
                outcomes.append((name, type(e), str(e).split("\n")[0]))
    return outcomes, i, x


def test_in_place_ops_refuse_and_accept_the_same_calls_every_time():
    """Functionalization checks each in-place call on meta tensors first; ltc_async remembers the
    verdict per signature (the check is Python code costing up to milliseconds): a refused call
    must be refused every time, in eager's words, and a valid one must still write."""
    want = _in_place_program("cpu")
    got = _in_place_program("ltc:0")
    assert got[0] == want[0]
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=0, atol=0)
    torch.testing.assert_close(got[2].cpu(), want[2])


def test_subtracting_a_python_bool_raises_eagers_error_at_the_line():
    # found by the fuzzer: a bool Scalar travels as an int where the result's dtype allows it,
    # but eager's kernels refuse `True - t` and `t - True` (the meta kernels do not)
    for d in ("cpu", DEV):
        v = torch.tensor(2.0).to(d)
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
            True - v
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
            v - True
        assert (v + True).cpu().item() == 3.0 and (v * False).cpu().item() == 0.0
