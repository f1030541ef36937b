"""Composite ops (`linear`, `matmul`, `scaled_dot_product_attention`) traced whole where autograd
records nothing (`ltc_async/tensor/composites.py`), and decomposed as before where it does.

Users' programs against eager: a Llama decoder's greedy decoding, attention in its variants and
dtypes, an evaluation in grad mode with frozen weights, a training step, dropout under no_grad,
forward-mode AD, a FlopCounterMode, and errors at the line that made them.
"""
from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from conftest import ON_CUDA

import ltc_async as ltc

DEV = "ltc:0"
G = lambda seed: torch.Generator().manual_seed(seed)   # noqa: E731


def _count(name: str) -> int:
    return ltc.metrics.counter_value(name) or 0


def _llama() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=128)     # GQA: 4 query heads, 2 KV heads
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_greedy_decoding_traces_each_projection_and_attention_as_one_op():
    eager = _llama()
    lazy = copy.deepcopy(eager).to(DEV)
    prompt = torch.randint(1, 128, (1, 7), generator=G(1))
    with torch.no_grad():
        want = eager.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
        ltc.metrics.reset()
        got = lazy.generate(prompt.to(DEV), max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(got.cpu(), want)
    # per token: 7 projections a layer and the head; 1 attention a layer (2 layers)
    assert _count("ltc::linear") == 8 * 15
    assert _count("ltc::scaled_dot_product_attention") == 8 * 2
    for part in ("ltc::t_copy", "ltc::mm", "ltc::bmm", "ltc::_safe_softmax"):
        assert _count(part) == 0, part
    assert _count("EagerFallback") == 0


def _qkv(dtype, gqa=False, q_len=5, kv_len=7):
    q = torch.randn(2, 4, q_len, 16, generator=G(1)).to(dtype)
    k = torch.randn(2, 2 if gqa else 4, kv_len, 16, generator=G(2)).to(dtype)
    v = torch.randn(2, 2 if gqa else 4, kv_len, 16, generator=G(3)).to(dtype)
    return q, k, v


ATTENTION = {
    "plain": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "scaled": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
    "bool_mask": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool).tril(2).to(q.device)),
    "float_mask": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.randn(2, 1, 5, 7, generator=G(4)).to(q.dtype).to(q.device)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(ATTENTION))
def test_attention_traced_whole_gives_eagers_values(variant, dtype):
    """One node, run by the device's own kernel: the values eager computes on the backing device
    (the decomposed math path, which no device picks for eager, rounded otherwise in bf16)."""
    fn = ATTENTION[variant]
    q, k, v = _qkv(dtype, q_len=5, kv_len=7 if variant != "causal" else 5)
    ref = [t.to("cuda:0") for t in (q, k, v)] if ON_CUDA else (q, k, v)
    with torch.no_grad():
        want = fn(*ref).cpu()
        ltc.metrics.reset()
        got = fn(*(t.to(DEV) for t in (q, k, v))).cpu()
    assert _count("ltc::scaled_dot_product_attention") == 1
    torch.testing.assert_close(got, want, atol=0, rtol=0) if dtype == torch.float32 and not ON_CUDA \
        else torch.testing.assert_close(got, want)


def test_grouped_query_attention_traced_whole():
    q, k, v = _qkv(torch.float32, gqa=True)
    with torch.no_grad():
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        ltc.metrics.reset()
        got = F.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV), enable_gqa=True)
        torch.testing.assert_close(got.cpu(), want)
    assert _count("ltc::scaled_dot_product_attention") == 1


def test_an_evaluation_in_grad_mode_with_frozen_weights_is_traced_whole():
    """Nothing requires grad, so autograd records nothing even in grad mode."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    eager.requires_grad_(False)
    lazy = copy.deepcopy(eager).to(DEV)
    x = torch.randn(3, 5, 8, generator=G(1))
    ltc.metrics.reset()
    got = lazy(x.to(DEV)) @ torch.ones(4, 2).to(DEV)
    torch.testing.assert_close(got.cpu(), eager(x) @ torch.ones(4, 2))
    assert _count("ltc::linear") == 2 and _count("ltc::matmul") == 1
    assert _count("ltc::t_copy") == 0


class _Block(torch.nn.Module):
    """An attention block, as written by hand in many training scripts."""

    def __init__(self, width=32, heads=4, dropout=0.0):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


def test_a_training_step_runs_the_attention_eager_runs_and_matches_eager():
    """Autograd records the projections' parts; the attention is the op eager's CPU runs (its
    flash kernel, forward and backward one op each), so AdamW's weights follow eager's closely
    (the math decomposition drifted 7e-4 in 3 steps).  On a CUDA-backed device autograd gets
    the decomposition."""
    torch.manual_seed(0)
    eager = _Block()
    lazy = copy.deepcopy(eager).to(DEV)
    x = torch.randn(2, 6, 32, generator=G(1))
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (eager, lazy)]
    for step in range(3):
        ltc.metrics.reset()
        for model, opt, dev in ((eager, opts[0], "cpu"), (lazy, opts[1], DEV)):
            opt.zero_grad()
            (model(x.to(dev)) ** 2).mean().backward()
            opt.step()
        ltc.mark_step()
        assert _count("ltc::linear") == 0 and _count("ltc::scaled_dot_product_attention") == 0
        fused = 0 if ON_CUDA else 1
        assert _count("ltc::_scaled_dot_product_flash_attention_for_cpu") == fused
        assert _count("ltc::_scaled_dot_product_flash_attention_for_cpu_backward") == fused
    for a, b in zip(lazy.parameters(), eager.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), **({"rtol": 1e-4, "atol": 1e-3} if ON_CUDA else {}))


@pytest.mark.parametrize("mask", ["bool", "float", "none"])
def test_attention_gradients_equal_eagers(mask):
    q, k, v = _qkv(torch.float32)
    masks = {"bool": torch.ones(5, 7, dtype=torch.bool).tril(3), "none": None,
             "float": torch.randn(2, 1, 5, 7, generator=G(4))}
    grads = []
    for dev in ("cpu", DEV):
        leaves = [t.detach().to(dev).requires_grad_() for t in (q, k, v)]
        m = masks[mask]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=None if m is None else m.to(dev))
        (out * torch.linspace(-1, 1, 16).to(dev)).sum().backward()
        grads.append([out.detach().cpu()] + [t.grad.cpu() for t in leaves])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want)


def test_calling_the_cpu_flash_attention_op_directly_gives_its_logsumexp():
    """PyTorch's decomposition of the op (export's) returns the attention weights in its place."""
    q, k, v = _qkv(torch.float32, q_len=6, kv_len=6)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    want = op(q, k, v, 0.0, True)
    got = op(q.to(DEV), k.to(DEV), v.to(DEV), 0.0, True)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b)


def test_attention_with_dropout_under_no_grad_draws_from_the_lazy_generator():
    """Dropout inside the device's kernel would draw numbers the lazy RNG cannot replay: the
    attention is decomposed, and a seed gives the same result twice."""
    block = _Block(dropout=0.5).to(DEV).train()
    x = torch.randn(2, 6, 32, generator=G(1)).to(DEV)
    outs = []
    with torch.no_grad():
        for _ in range(2):
            torch.manual_seed(7)
            ltc.metrics.reset()
            outs.append(block(x).cpu())
            assert _count("ltc::scaled_dot_product_attention") == 0
            assert _count("ltc::linear") == 2
    torch.testing.assert_close(outs[0], outs[1])
    with torch.no_grad():
        block.eval()
        assert not torch.equal(block(x).cpu(), outs[0])   # dropout did drop


def test_forward_mode_ad_sees_the_decomposition():
    x = torch.randn(2, 3, generator=G(1))
    w = torch.randn(4, 3, generator=G(2))
    tangents = []
    for dev in ("cpu", DEV):
        with fwAD.dual_level():
            out = F.linear(fwAD.make_dual(x.to(dev), torch.ones(2, 3).to(dev)), w.to(dev))
            tangents.append(fwAD.unpack_dual(out).tangent.cpu())
    torch.testing.assert_close(tangents[1], tangents[0])


def test_a_dispatch_mode_sees_the_parts_as_before():
    """A TorchDispatchMode over ltc tensors sees the ops it saw before: `linear` as its parts."""
    from torch.utils.flop_counter import FlopCounterMode
    x, w = torch.randn(2, 3).to(DEV), torch.randn(4, 3).to(DEV)
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        F.linear(x, w)
    assert flops.get_total_flops() == 2 * 2 * 3 * 4


@pytest.mark.parametrize("call", [
    lambda d: F.linear(torch.randn(2, 3, device=d), torch.randn(4, 5, device=d)),
    lambda d: F.linear(torch.ones(2, 3, device=d), torch.ones(4, 3, device=d, dtype=torch.double)),
    lambda d: torch.randn(2, 3, device=d) @ torch.randn(4, 5, device=d),
    lambda d: F.scaled_dot_product_attention(torch.randn(1, 2, 3, 4, device=d), torch.randn(1, 2, 3, 4, device=d).double(),
                                             torch.randn(1, 2, 3, 4, device=d)),
], ids=["linear_shapes", "linear_dtypes", "matmul_shapes", "attention_dtypes"])
def test_a_bad_call_raises_eagers_error_at_its_line(call):
    with pytest.raises(RuntimeError) as want, torch.no_grad():
        call("cpu")
    with pytest.raises(RuntimeError) as got, torch.no_grad():
        call(DEV)
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]
    with torch.no_grad():   # the device is usable afterwards
        torch.testing.assert_close(F.linear(torch.ones(2, 3).to(DEV), torch.ones(4, 3).to(DEV)).cpu(),
                                   torch.full((2, 4), 3.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["fp32", "bf16", "fp64"])
def test_the_cpu_kernel_choice_is_eagers_on_small_stand_ins(dtype):
    """The CPU's choice between flash attention and the math path is asked on stand-ins one row
    of memory large (a large model's full-size stand-ins would take hundreds of megabytes):
    the same choice as on the call's tensors, over head sizes, masks, GQA, layouts, grads."""
    from ltc_async.tensor.composites import _layout, _stand_in
    picks = set()
    for (b, h, q_len, kv_len, e), grad, mask, gqa, transposed in itertools.product(
            [(2, 4, 5, 7, 16), (1, 8, 1, 9, 64), (2, 4, 5, 7, 300)], [False, True],
            [None, "bool", "float"], [False, True], [False, True]):
        kv_heads = h // 2 if gqa else h
        q = torch.randn(b, h, q_len, e).to(dtype)
        if transposed:
            q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
        q.requires_grad_(grad)
        k, v = torch.randn(b, kv_heads, kv_len, e).to(dtype), torch.randn(b, kv_heads, kv_len, e).to(dtype)
        m = {None: None, "bool": torch.ones(q_len, kv_len, dtype=torch.bool),
             "float": torch.randn(b, 1, q_len, kv_len).to(dtype)}[mask]
        want = torch._fused_sdp_choice(q, k, v, m, 0.0, False, scale=None, enable_gqa=gqa)
        got = torch._fused_sdp_choice(*(_stand_in(_layout(t)) for t in (q, k, v, m)), 0.0, False,
                                      scale=None, enable_gqa=gqa)
        assert got == want
        picks.add(want)
    assert picks == {0, 1}   # both paths were chosen somewhere: math (0) and flash (1)


def test_torch_func_transforms_over_linear_and_attention_match_eager():
    """`torch.func.grad`, `vmap` and `jacrev` over the composites: PyTorch's decomposition, as
    before (inside a transform no tensor may be made to require grad, which the CPU kernel
    choice's stand-ins did)."""
    x, w, b = torch.randn(3, 5, generator=G(1)), torch.randn(4, 5, generator=G(2)), torch.randn(4, generator=G(3))
    q = torch.randn(2, 2, 3, 8, generator=G(4))

    def run(dev):
        xd, wd, bd, qd = (t.to(dev) for t in (x, w, b, q))
        return [*torch.func.grad(lambda x, w, b: (F.linear(x, w, b).tanh() ** 2).sum(), argnums=(0, 1, 2))(xd, wd, bd),
                torch.func.grad(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True).pow(2).sum())(qd),
                torch.func.vmap(lambda r: F.linear(r, wd, bd))(xd.unsqueeze(1)),
                torch.func.jacrev(lambda r: torch.matmul(wd, r))(xd[0])]
    for got, want in zip(run(DEV), run("cpu")):
        torch.testing.assert_close(got.cpu(), want)


def test_an_eval_transformer_layer_and_multihead_attention_match_eager():
    y = torch.randn(2, 5, 8, generator=G(5))
    outs = []
    for dev in ("cpu", DEV):
        torch.manual_seed(0)
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval().to(dev)
        torch.manual_seed(0)
        enc = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0).eval().to(dev)
        with torch.no_grad():
            yd = y.to(dev)
            outs.append([mha(yd, yd, yd)[0].cpu(), enc(yd).cpu()])
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want)
