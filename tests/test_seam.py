"""Where ltc tensors meet CPU tensors, as users' programs mix them: copies both ways,
checkpoints, CPU scalars, Python numbers, refused mixes, module fast paths.  Every result is
compared with eager (the same program on CPU tensors); a refused mix must raise a RuntimeError
naming both devices (what eager CUDA raises) and leave both tensors unchanged and usable."""
from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn as nn
from torch.torch_version import TorchVersion

import ltc_async as ltc

D = "ltc:0"


def _no_internal(e: BaseException) -> None:
    text = str(e)
    assert "INTERNAL ASSERT" not in text and "Internal error" not in text, text


# -- copies ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("src_dtype,dst_dtype", [
    (torch.float32, torch.float32), (torch.float32, torch.float64), (torch.float64, torch.bfloat16),
    (torch.int64, torch.float32), (torch.float32, torch.int32), (torch.bool, torch.float16),
    (torch.bfloat16, torch.float32), (torch.complex64, torch.complex128)])
def test_host_tensor_takes_a_copy_of_an_ltc_tensor_in_any_dtype(src_dtype, dst_dtype):
    src = (torch.arange(12).reshape(3, 4) - 5).to(src_dtype)
    dst = torch.zeros(3, 4, dtype=dst_dtype)
    out = dst.copy_(src.to(D))
    assert out is dst
    torch.testing.assert_close(dst, torch.zeros(3, 4, dtype=dst_dtype).copy_(src))


def test_host_copies_broadcast_write_into_views_and_accept_non_blocking():
    src = torch.randn(4)
    lazy = src.to(D)
    dst = torch.zeros(3, 4)
    dst.copy_(lazy)                                  # broadcast over rows
    torch.testing.assert_close(dst, src.expand(3, 4))
    dst = torch.zeros(4, 6)
    dst[:, 1:5].t().copy_(torch.arange(16.).reshape(4, 4).to(D), non_blocking=True)
    want = torch.zeros(4, 6)
    want[:, 1:5].t().copy_(torch.arange(16.).reshape(4, 4))
    torch.testing.assert_close(dst, want)
    # the source stays an ordinary, usable ltc tensor
    torch.testing.assert_close((lazy * 2).cpu(), src * 2)


def test_host_copy_of_a_pending_result_waits_for_it():
    x = torch.randn(5, 5)
    lazy = x.to(D)
    y = lazy @ lazy + 1                             # pending: not computed yet
    dst = torch.empty(5, 5)
    dst.copy_(y)
    torch.testing.assert_close(dst, x @ x + 1)


def test_copy_gradients_flow_back_to_the_ltc_source():
    w = torch.randn(3, requires_grad=True)
    lw = w.detach().to(D).requires_grad_()
    host = torch.zeros(3)
    host.copy_(lw * 2)
    host.sum().backward()
    ref = torch.zeros(3)
    ref.copy_(w * 2)
    ref.sum().backward()
    torch.testing.assert_close(lw.grad.cpu(), w.grad)


@pytest.mark.parametrize("value", [7, 2.5, True])
def test_python_number_as_copy_source(value):
    v = torch.zeros(2, 4, device=D)
    v.view(-1).copy_(value)
    v[1].copy_(value)
    want = torch.zeros(2, 4)
    want.view(-1).copy_(value)
    torch.testing.assert_close(v.cpu(), want)


def test_ltc_tensor_takes_host_values_of_any_shape_that_broadcasts():
    v = torch.zeros(3, 4, device=D)
    v.copy_(torch.arange(4.))
    v[0].copy_(torch.tensor(9.))                     # a 0-dim host tensor
    want = torch.zeros(3, 4)
    want.copy_(torch.arange(4.))
    want[0].copy_(torch.tensor(9.))
    torch.testing.assert_close(v.cpu(), want)


# -- CPU scalars and refused mixes ----------------------------------------------------------------

def test_cpu_zero_dim_tensors_act_as_scalars_on_both_sides():
    x = torch.randn(4, 3)
    s = torch.tensor(1.5)
    lx = x.to(D)
    cases = [lambda a, b: a + b, lambda a, b: b * a, lambda a, b: torch.where(a > 0, a, b),
             lambda a, b: torch.lerp(a, a * 2, b),
             lambda a, b: a.masked_fill(a > 0, b), lambda a, b: torch.maximum(a, b)]
    for f in cases:
        torch.testing.assert_close(f(lx, s).cpu(), f(x, s))
    y = torch.zeros(4, 3, device=D)
    y.add_(s)
    y.mul_(s)
    torch.testing.assert_close(y.cpu(), torch.zeros(4, 3).add_(s).mul_(s))


def test_cpu_zero_dim_tensors_are_refused_where_eager_cuda_refuses_them():
    # PyTorch's generated CUDA wrappers check devices for ops not declared `device_check: NoCheck`
    # (clamp.Tensor, mm): a CPU 0-dim tensor is no scalar there
    x = torch.randn(4, 3)
    lx = x.to(D)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*ltc:0 and cpu"):
        torch.clamp(lx, min=torch.tensor(0.0))
    torch.testing.assert_close(torch.clamp(lx, min=torch.tensor(0.0).to(D)).cpu(), x.clamp(min=0.0))
    torch.testing.assert_close(torch.clamp(lx, min=0.0).cpu(), x.clamp(min=0.0))


def test_scatter_views_copy_host_sources_as_eager_does():
    # slice_scatter and kin are clone + copy_ in eager: a host source is copied, on CUDA too
    base = torch.zeros(4, 6)
    src = torch.arange(12.).reshape(4, 3)
    got = torch.slice_scatter(base.to(D), src, dim=1, start=0, end=6, step=2)
    torch.testing.assert_close(got.cpu(), torch.slice_scatter(base, src, dim=1, start=0, end=6, step=2))
    got = torch.diagonal_scatter(base.to(D), torch.ones(4))
    torch.testing.assert_close(got.cpu(), torch.diagonal_scatter(base, torch.ones(4)))


@pytest.mark.parametrize("write", [
    lambda c, l: c.add_(l), lambda c, l: c.mul_(l), lambda c, l: c.sub_(l, alpha=2),
    lambda c, l: c.masked_fill_(l > 0, 1.0),
    lambda c, l: c.index_put_((torch.tensor([0, 2]),), l[:2]),
    lambda c, l: torch.add(l, l, out=c),
    lambda c, l: c[0].add_(l[0]),
    lambda c, l: c.addcmul_(l, l),
], ids=["add_", "mul_", "sub_", "masked_fill_", "index_put_", "add_out", "view_add_", "addcmul_"])
def test_writing_a_host_tensor_from_ltc_tensors_raises_like_eager_cuda(write):
    host = torch.arange(4.)
    lazy = torch.ones(4).to(D)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*ltc:0 and cpu") as e:
        write(host, lazy)
    _no_internal(e.value)
    # both unchanged and usable
    torch.testing.assert_close(host, torch.arange(4.))
    torch.testing.assert_close((lazy + host.to(D)).cpu(), torch.arange(4.) + 1)


def test_host_self_indexed_by_ltc_indices_is_written_on_the_host():
    host = torch.zeros(5)
    idx = torch.tensor([1, 3]).to(D)
    host.index_put_((idx,), torch.tensor([7., 8.]))
    torch.testing.assert_close(host, torch.tensor([0., 7., 0., 8., 0.]))


def test_host_tensor_read_through_ltc_indices_and_masks_gives_a_host_tensor():
    host = torch.arange(10.).reshape(5, 2)
    idx = torch.tensor([4, 0, 2])
    mask = torch.tensor([True, False, True, True, False])
    got = host[idx.to(D)]
    assert got.device.type == "cpu" and not torch._is_functional_tensor(got)
    torch.testing.assert_close(got, host[idx])
    torch.testing.assert_close(host[mask.to(D)], host[mask])
    got.add_(1)                                       # an ordinary host tensor
    torch.testing.assert_close(got, host[idx] + 1)


def test_foreach_copy_into_host_tensors_and_set_across_devices():
    hosts = [torch.zeros(3), torch.zeros(2, 2)]
    srcs = [torch.randn(3), torch.randn(2, 2)]
    torch._foreach_copy_(hosts, [s.to(D) for s in srcs])
    for h, s in zip(hosts, srcs):
        torch.testing.assert_close(h, s)
    lazy, host = torch.zeros(3, device=D), torch.ones(3)
    for a, b in ((lazy, host), (host, lazy)):        # eager: a storage of another device
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as e:
            a.set_(b)
        _no_internal(e.value)
    torch.testing.assert_close(lazy.cpu(), torch.zeros(3))
    torch.testing.assert_close(host, torch.ones(3))


def test_ltc_written_from_full_host_tensors_raises_naming_both_devices():
    lazy = torch.zeros(3, device=D)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*cpu"):
        lazy.add_(torch.ones(3))
    torch.testing.assert_close(lazy.cpu(), torch.zeros(3))


# -- checkpoints ----------------------------------------------------------------------------------

def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 3))


def _train(model: nn.Module, opt: torch.optim.Optimizer, device: str | None, steps: int = 2) -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        if device:
            x, y = x.to(device), y.to(device)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if device:
            ltc.mark_step()


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x.cpu(), y.cpu(), msg=n)


@pytest.mark.parametrize("load", [dict(), dict(weights_only=True), dict(map_location="cpu"),
                                  dict(map_location=lambda storage, loc: storage)],
                         ids=["plain", "weights_only", "map_location_cpu", "map_location_callable"])
def test_checkpoint_of_an_ltc_model_loads_into_a_cpu_model_and_optimizer(load):
    eager = _mlp()
    lazy = copy.deepcopy(eager).to(D)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-2)
    _train(eager, opt_e, None)
    _train(lazy, opt_l, D)
    f = io.BytesIO()
    torch.save({"model": lazy.state_dict(), "opt": opt_l.state_dict()}, f)
    f.seek(0)
    ckpt = torch.load(f, **load)
    # every tensor copied into CPU memory; training resumes there as the eager run continues
    _resumes_like_eager(ckpt, None, eager, opt_e)


def _resumes_like_eager(ckpt: dict, device: str | None, eager: nn.Module, opt_e: torch.optim.Optimizer) -> None:
    """A fresh model and AdamW on `device` (None: the CPU) loaded from `ckpt` equal the eager
    run, and keep equal to it through more training."""
    model = _mlp() if device is None else _mlp().to(device)
    model.load_state_dict(ckpt["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(ckpt["opt"])
    _assert_same(model, eager)
    _train(model, opt, device)
    _train(eager, opt_e, None)
    _assert_same(model, eager)


@pytest.mark.parametrize("assign", [False, True])
def test_cpu_checkpoint_loads_into_an_ltc_model(assign):
    eager = _mlp()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    _train(eager, opt_e, None)
    f = io.BytesIO()
    torch.save(eager.state_dict(), f)
    f.seek(0)
    state = torch.load(f, weights_only=True)
    lazy = _mlp().to(D)
    lazy.load_state_dict(state, assign=assign)
    _assert_same(lazy, eager)
    assert all(p.device.type == ("cpu" if assign else "ltc") for p in lazy.parameters())
    if not assign:
        opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
        _train(lazy, opt_l, D)
        _train(eager, opt_e, None)
        _assert_same(lazy, eager)


MAP_LOCATIONS = {"str": D, "device": torch.device(D), "dict": {"cpu": D},
                 "function": lambda storage, loc: storage.to(device=D)}


@pytest.mark.parametrize("weights_only", [True, False], ids=["weights_only", "full"])
@pytest.mark.parametrize("where", list(MAP_LOCATIONS))
def test_a_cpu_checkpoint_loads_straight_onto_the_device_and_training_resumes(where, weights_only):
    """`torch.load(f, map_location="ltc:0")`, as with "cuda:0" (it killed the process with a
    segfault: PyTorch allocated a device storage, and ltc has no allocator)."""
    eager = _mlp()
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    _train(eager, opt_e, None)
    f = io.BytesIO()
    torch.save({"model": eager.state_dict(), "opt": opt_e.state_dict()}, f)
    f.seek(0)
    ckpt = torch.load(f, map_location=MAP_LOCATIONS[where], weights_only=weights_only)
    assert all(t.device == torch.device(D) for t in ckpt["model"].values())
    _resumes_like_eager(ckpt, D, eager, opt_e)


@pytest.mark.parametrize("saved_on", ["cpu", D])
@pytest.mark.parametrize("load", [dict(), dict(map_location=D), dict(map_location="cpu")],
                         ids=["plain", "to_ltc", "to_cpu"])
def test_views_saved_together_load_as_views_of_one_storage(saved_on, load):
    """A checkpoint holding a tensor and views of it (a flat parameter buffer and its slices):
    after loading, a write through the base shows in the views, as in eager."""
    def program(device, load):
        base = torch.arange(12.0).view(3, 4).to(device)
        f = io.BytesIO()
        torch.save({"row": base[1], "base": base, "t": base.t(), "col": base[:, 2],
                    "alias": base.detach()}, f)
        f.seek(0)
        r = torch.load(f, **load)
        r["base"][1, 0] = 100.0
        r["t"][2, 2] = -1.0
        return {k: (v.cpu(), v.stride(), v.device.type) for k, v in r.items()}

    want = program("cpu", {})
    got = program(saved_on, load)
    for k, (v, stride, _) in want.items():
        torch.testing.assert_close(got[k][0], v, rtol=0, atol=0, msg=k)
        assert got[k][1] == stride, k
    lands_on = {None: torch.device(saved_on).type, D: "ltc", "cpu": "cpu"}[load.get("map_location")]
    assert all(got[k][2] == lands_on for k in got)


def test_ltc_storages_cannot_be_made_and_say_why():
    with pytest.raises(RuntimeError, match="has no storages of its own"):
        torch.UntypedStorage(12, device=D)
    with pytest.raises(RuntimeError, match="has no storages of its own"):
        torch.randn(3).untyped_storage().to(device=D)


def test_ltc_state_dict_assigned_into_a_cpu_model_and_deepcopies():
    lazy = _mlp().to(D)
    cpu_model = _mlp()
    cpu_model.load_state_dict(lazy.state_dict(), assign=True)
    assert next(cpu_model.parameters()).device.type == "ltc"
    _assert_same(cpu_model, lazy)
    twin = copy.deepcopy(lazy)
    _assert_same(twin, lazy)
    with torch.no_grad():
        twin[0].weight.add_(1)
    assert not torch.equal(twin[0].weight.cpu(), lazy[0].weight.cpu())


# -- module fast paths ----------------------------------------------------------------------------

@pytest.mark.parametrize("final_norm", [False, True])
def test_transformer_encoder_eval_with_padding_mask_matches_eager_fast_path(final_norm):
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2,
                                norm=nn.LayerNorm(16) if final_norm else None).eval()
    x = torch.randn(3, 6, 16)
    mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] + [True] * 5])
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=mask)        # eager: nested-tensor fast path
        before = ltc.metrics.counter_value("EagerFallback")
        got = enc.to(D)(x.to(D), src_key_padding_mask=mask.to(D))
        assert got.device.type == "ltc"
        assert ltc.metrics.counter_value("EagerFallback") == before
    torch.testing.assert_close(got.cpu(), want)


def test_multihead_attention_fast_path_without_weights_matches_eager():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        want = mha(x, x, x, need_weights=False, key_padding_mask=mask)[0]
        lx = x.to(D)
        got = mha.to(D)(lx, lx, lx, need_weights=False, key_padding_mask=mask.to(D))[0]
    torch.testing.assert_close(got.cpu(), want)


# -- bf16 through a transformer, forward and backward ----------------------------------------------

def test_bf16_transformer_layer_backward_matches_eager():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0).to(torch.bfloat16)
    lazy = copy.deepcopy(layer).to(D)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    layer(x).float().pow(2).mean().backward()
    lazy(x.to(D)).float().pow(2).mean().backward()
    for (n, a), (_, b) in zip(lazy.named_parameters(), layer.named_parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=2e-2, atol=2e-2, msg=n)


# -- failures and threads ------------------------------------------------------------------------

@pytest.mark.kernel_assert
def test_host_copy_of_a_failed_computation_raises_and_leaves_the_host_tensor_alone():
    x = torch.randn(4)
    lx = x.to(D)
    bad = lx[torch.tensor([0, 9]).to(D)] * 2          # out of range: only the kernel can tell
    host = torch.zeros(2)
    with pytest.raises(ltc.ComputationError, match="index"):
        host.copy_(bad)
    torch.testing.assert_close(host, torch.zeros(2))
    host.copy_(lx[1:3] * 2)                           # the device and the source stay usable
    torch.testing.assert_close(host, x[1:3] * 2)


def test_threads_mixing_host_copies_numbers_and_refused_writes():
    import threading
    errors: list = []

    def work(seed: int) -> None:
        try:
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(16, generator=g)
            lx = x.to(D)
            for k in range(20):
                lx.mul_(0.5).add_(k)                  # numbers in Tensor slots (seam.py)
                x.mul_(0.5).add_(k)
                host = torch.empty(16)
                host.copy_(lx)
                torch.testing.assert_close(host, x)
                with pytest.raises(RuntimeError, match="same device"):
                    host.add_(lx)
                ltc.mark_step()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]


# -- TorchScript -------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: nn.ReLU(), lambda: nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True)),
                                  lambda: nn.Hardtanh(), lambda: nn.ELU(), lambda: nn.Dropout()],
                         ids=["relu", "sequential", "hardtanh", "elu", "dropout"])
def test_torch_jit_script_still_scripts_modules_with_in_place_functional_ops(make):
    """ltc_async wraps `torch.relu_` and friends (in-place checks); TorchScript must still see
    them as the aten ops they stand for (it refused to compile the wrappers, on every device)."""
    m = make().eval()
    scripted = torch.jit.script(m)
    x = torch.randn(3, 2)
    torch.testing.assert_close(scripted(x), m(x))
    lazy = torch.jit.script(make().to(D).eval())
    assert lazy(x.to(D)).device == torch.device(D)


def test_torchscript_archives_with_ltc_tensors_say_what_works():
    f = io.BytesIO()
    torch.jit.save(torch.jit.script(nn.Linear(4, 3)), f)
    for where in (D, torch.device(D), {"cpu": D}):
        f.seek(0)
        with pytest.raises(RuntimeError, match="load it on the CPU"):
            torch.jit.load(f, map_location=where)
    f.seek(0)
    assert torch.jit.load(f, map_location="cpu").weight.shape == (3, 4)
    with pytest.raises(RuntimeError, match="state_dict"):
        torch.jit.save(torch.jit.script(nn.Linear(4, 3).to(D)), io.BytesIO())


def test_modes_over_meta_and_fake_tensors_after_ltc_in_place_ops_work_as_in_pytorch():
    # ltc's in-place ops replace the meta kernels functionalization checks with; a user's mode
    # over meta tensors (PyTorch's trampoline calls kernels differently there) and FakeTensorMode
    # must still get PyTorch's own answers, refusals included
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    host = torch.randn(3)
    x = host.to(D)
    x.add_(1).mul_(2).clamp_(0, 1)
    m = torch.empty(3, 4, device="meta")
    with FlopCounterMode(display=False):
        assert m.add_(1).mul_(2).clamp_(0, 1).shape == (3, 4)
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            torch.empty(4, device="meta").add_(m)
    with FakeTensorMode():
        assert torch.empty(2, 3).clamp_(0, 1).shape == (2, 3)
        with pytest.raises(RuntimeError, match="Promotion of int"):
            torch.empty(3, dtype=torch.long).add_(1.5)
    x.add_(1).mul_(3)   # and ltc's in-place ops keep working after the modes
    assert torch.equal(x.cpu(), host.add_(1).mul_(2).clamp_(0, 1).add_(1).mul_(3))


def test_device_generic_pytorch_utilities_work_with_ltc_as_the_accelerator():
    # with no GPU, importing ltc_async makes `ltc` PyTorch's current accelerator: the utilities
    # that then ask it for streams and synchronization must work, for CPU code too
    import tempfile

    import torch.distributed.checkpoint as dcp
    import torch.utils.benchmark as benchmark
    assert torch.accelerator.current_accelerator().type == "ltc"
    x = torch.randn(32, 32)
    assert benchmark.Timer("x @ x", globals={"x": x}).timeit(3).median > 0     # synchronizes
    y = x.to(D)
    assert benchmark.Timer("(y @ y).sum(); ltc.mark_step()", globals={"y": y, "ltc": ltc}).timeit(2).median > 0
    torch.accelerator.synchronize()
    torch.ltc.current_stream().synchronize()
    assert torch.ltc.current_stream().query()
    torch.manual_seed(3)
    # `fork_rng` forks the current accelerator's generators by default from PyTorch 2.13
    # (before, CUDA's unless told `device_type`)
    fork = {} if TorchVersion(torch.__version__) >= (2, 13) else {"device_type": "ltc"}
    with torch.random.fork_rng(**fork):
        inside = (torch.rand(3), torch.rand(3, device=D).cpu())
    assert torch.equal(torch.rand(3), inside[0]) and torch.equal(torch.rand(3, device=D).cpu(), inside[1])
    model = nn.Linear(4, 2)   # a CPU model's distributed checkpoint
    folder = tempfile.mkdtemp()
    dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
    fresh = nn.Linear(4, 2)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    fresh.load_state_dict(state["model"])
    assert torch.equal(fresh.weight, model.weight)


def test_make_fx_and_linearize_refuse_ltc_tensors_instead_of_tracing_constants():
    """`make_fx` in its real-tensor mode saw an ltc program's ops below functionalization and
    baked its results into the graph as constants (`torch.func.linearize` then returned garbage
    tangents): now a clear error; the same function captured with torch.compile(backend="ltc")
    and traced on host tensors still works."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(t):
        return t.sin() * 3.0 + 1.0

    x = torch.tensor([0.5, -1.0, 2.0])
    with pytest.raises(RuntimeError, match="make_fx .* cannot trace ltc tensors"):
        make_fx(f)(x.to(D))
    with pytest.raises(RuntimeError, match="cannot trace ltc tensors"):
        torch.func.linearize(torch.sin, x.to(D))
    graph = make_fx(f)(x)                   # traced on the host, run on ltc
    torch.testing.assert_close(graph(x.to(D)).cpu(), f(x))
    torch.testing.assert_close(torch.compile(f, backend="ltc")(x.to(D)).cpu(), f(x))


def test_a_custom_op_without_a_fake_impl_runs_like_eager():
    """A `torch.library.custom_op` with no `register_fake` runs eagerly on any device; on ltc
    its output shape cannot be inferred, so it runs as an eager fallback (counted), with the
    same values and gradients, and the ops around it stay on the device."""
    @torch.library.custom_op("ltc_tests::scaled_sin", mutates_args=())
    def scaled_sin(x: torch.Tensor, k: float) -> torch.Tensor:
        return x.sin() * k

    x = torch.tensor([0.5, -1.0, 2.0])
    ltc.metrics.reset()
    got = (scaled_sin(x.to(D) * 2, 3.0) + 1).cpu()
    torch.testing.assert_close(got, scaled_sin(x * 2, 3.0) + 1)
    assert ltc.metrics.counter_value("EagerFallback") == 1
