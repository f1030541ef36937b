"""Everyday PyTorch features, each as a short user program run on eager CPU and on `ltc:0` with
the same data: every returned value must agree (dtype, shape, values), and none but the few
listed ops may take the eager fallback.

The programs are what users write around a model rather than the model itself: attention
modules and `nn.TransformerEncoder` (its nested-tensor fast path in eval mode), `torch.func`,
double backward, checkpointing, linear algebra, FFTs, complex numbers, sorting, scatter
reductions, gradient clipping, weight and spectral norm, interpolation, transposed convolution,
embeddings, distributions, AMP's `GradScaler`, LBFGS and LR schedules, `einsum`, strided views
written in place, boolean masks, `.item()` control flow, gradient hooks, losses with their
options, SDPA, data-dependent ops, `torch.compile` with a graph break.  Random tensors are made
on the host (a lazy device draws its own numbers, as CUDA does) and moved with `.to(device)`.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ltc_async as ltc

PROGRAMS: dict[str, Callable[[str], Any]] = {}
# ops that these programs may run eagerly (no device lowering yet), by program: none today
ALLOWED_FALLBACKS: dict[str, set[str]] = {}


def program(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    PROGRAMS[fn.__name__] = fn
    return fn


@program
def multihead_attention(d):
    m = nn.MultiheadAttention(16, 4, batch_first=True).to(d)
    x = torch.randn(2, 5, 16).to(d)
    out, w = m(x, x, x, need_weights=True)
    out.sum().backward()
    return out, w, m.in_proj_weight.grad


@program
def transformer_encoder_eval_fast_path(d):
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0)
    enc = nn.TransformerEncoder(layer, 2).to(d).eval()
    x = torch.randn(2, 5, 16).to(d)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2]).to(d)
    with torch.no_grad():
        return enc(x, src_key_padding_mask=mask)


@program
def transformer_encoder_training(d):
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0)
    enc = nn.TransformerEncoder(layer, 2).to(d)
    y = enc(torch.randn(2, 5, 16).to(d))
    y.pow(2).mean().backward()
    return y, enc.layers[0].linear1.weight.grad


@program
def torch_func_vmap_grad_jacrev(d):
    from torch.func import grad, jacrev, vmap
    w = torch.randn(3, 3).to(d)
    x = torch.randn(4, 3).to(d)
    return vmap(grad(lambda x: (x @ w).tanh().sum()))(x), jacrev(lambda x: (x @ w).sin())(x[0])


@program
def double_backward(d):
    x = torch.randn(5).to(d).requires_grad_()
    g, = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
    g2, = torch.autograd.grad(g.sum(), x)
    return g, g2


@program
def checkpoint_non_reentrant(d):
    from torch.utils.checkpoint import checkpoint
    lin = nn.Linear(8, 8).to(d)
    x = torch.randn(4, 8).to(d).requires_grad_()
    y = checkpoint(lambda t: lin(t).relu(), x, use_reentrant=False)
    y.sum().backward()
    return y, lin.weight.grad, x.grad


@program
def linear_algebra(d):
    a = torch.randn(4, 4).to(d)
    spd = a @ a.T + 4 * torch.eye(4).to(d)
    return (torch.linalg.inv(spd), torch.linalg.cholesky(spd), torch.linalg.solve(spd, a),
            torch.linalg.det(spd), torch.linalg.norm(a), torch.linalg.qr(a)[1].abs(),
            torch.linalg.eigvalsh(spd), torch.linalg.pinv(a[:, :3]), torch.linalg.pinv(spd, hermitian=True),
            torch.linalg.pinv(a, rtol=0.3))


@program
def fft(d):
    x = torch.randn(8, 16).to(d)
    return torch.fft.rfft(x).abs(), torch.fft.irfft(torch.fft.rfft(x), n=16)


@program
def complex_numbers(d):
    x = torch.randn(4, dtype=torch.complex64).to(d)
    return (x * x.conj()).real, torch.view_as_real(x), x.abs(), x.angle()


@program
def sorts_cumulative_unique_consecutive(d):
    x = torch.randint(0, 5, (20,)).float().to(d)
    s = torch.sort(x, stable=True)
    return (s.values, s.indices, x.argsort(stable=True), x.topk(3).values, x.cumsum(0),
            x.cumprod(0), torch.unique_consecutive(x.sort().values))


@program
def scatter_reduce(d):
    src = torch.randn(10).to(d)
    idx = torch.tensor([0, 1, 0, 2, 1, 3, 3, 0, 2, 1]).to(d)
    return (torch.zeros(4).to(d).scatter_reduce(0, idx, src, "amax", include_self=False),
            torch.zeros(4).to(d).scatter_reduce(0, idx, src, "mean"))


@program
def clip_grad_norm(d):
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(d)
    m(torch.randn(3, 8).to(d)).sum().backward()
    return nn.utils.clip_grad_norm_(m.parameters(), 0.1), m[0].weight.grad


@program
def weight_and_spectral_norm(d):
    from torch.nn.utils.parametrizations import spectral_norm, weight_norm
    m = weight_norm(nn.Linear(6, 4)).to(d)
    s = spectral_norm(nn.Linear(6, 4)).to(d)
    x = torch.randn(3, 6).to(d)
    y = m(x) + s(x)
    y.sum().backward()
    return y, m.parametrizations.weight.original0.grad


@program
def interpolate(d):
    x = torch.randn(1, 2, 5, 5).to(d).requires_grad_()
    y = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    z = F.interpolate(x, size=(7, 7), mode="nearest")
    w = F.interpolate(x, scale_factor=1.5, mode="bicubic", align_corners=True)
    (y.sum() + z.sum() + w.sum()).backward()
    return y, z, w, x.grad


@program
def conv_transpose_group_norm_pixel_shuffle(d):
    m = nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2), nn.GroupNorm(2, 4), nn.PixelShuffle(2)).to(d)
    y = m(torch.randn(2, 3, 5, 5).to(d))
    y.sum().backward()
    return y, m[0].weight.grad


@program
def embeddings(d):
    e = nn.Embedding(10, 4, padding_idx=0).to(d)
    e(torch.tensor([[0, 2, 3], [4, 0, 9]]).to(d)).sum().backward()
    bag = nn.EmbeddingBag(10, 4, mode="mean").to(d)
    return e.weight.grad, bag(torch.tensor([1, 2, 4, 5, 4, 3]).to(d), torch.tensor([0, 3]).to(d))


@program
def distributions(d):
    from torch.distributions import Categorical, Normal, kl_divergence
    mu, sd = torch.randn(3).to(d), (torch.rand(3) + 0.5).to(d)
    n, c = Normal(mu, sd), Categorical(logits=torch.randn(3, 4).to(d))
    return (n.log_prob(torch.zeros(3).to(d)), kl_divergence(n, Normal(0 * mu, sd)), c.entropy(),
            c.log_prob(torch.tensor([0, 1, 3]).to(d)))


@program
def grad_scaler_with_autocast(d):
    kind = d.split(":")[0]
    m = nn.Linear(4, 2).to(d)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(kind, init_scale=1024.0)
    for _ in range(2):
        opt.zero_grad()
        with torch.autocast(kind, dtype=torch.bfloat16):
            loss = m(torch.randn(3, 4).to(d)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return m.weight.detach(), torch.tensor(scaler.get_scale())


@program
def lbfgs_with_closure(d):
    x = torch.zeros(2).to(d).requires_grad_()
    target = torch.tensor([1.0, -2.0]).to(d)
    opt = torch.optim.LBFGS([x], lr=0.5, max_iter=5)

    def closure():
        opt.zero_grad()
        loss = ((x - target) ** 2).sum()
        loss.backward()
        return loss
    for _ in range(3):
        opt.step(closure)
    return x.detach()


@program
def adam_one_cycle_schedule(d):
    m = nn.Linear(4, 1).to(d)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    for _ in range(5):
        opt.zero_grad()
        m(torch.ones(2, 4).to(d)).sum().backward()
        opt.step()
        sched.step()
        if d != "cpu":
            ltc.mark_step()
    return m.weight.detach(), m.bias.detach()


@program
def einsum_tensordot(d):
    a, b = torch.randn(2, 3, 4).to(d), torch.randn(2, 4, 5).to(d)
    return (torch.einsum("bij,bjk->bik", a, b), torch.einsum("bii->b", torch.randn(2, 3, 3).to(d)),
            torch.tensordot(a, b, dims=([0, 2], [0, 1])))


@program
def strided_views_written_in_place(d):
    x = torch.arange(24.0).reshape(4, 6).to(d)
    y = x[:, ::2].t().contiguous()
    z = x.unfold(1, 3, 2)
    x[1:3, ::3] = -1
    return y, z, x, x.diagonal(), torch.roll(x, 2, 1), x.flip(0), x.as_strided((2, 6), (6, 1), 6)


@program
def boolean_masks(d):
    x = torch.randn(10).to(d)
    m = x > 0
    return (x[m], x.masked_fill(~m, 0), m.any(), m.all(), m.sum(), torch.nonzero(m),
            torch.count_nonzero(m), x.clamp(min=-0.5, max=0.5))


@program
def item_driven_control_flow(d):
    x = torch.randn(10).to(d)
    s = 0.0
    for i in range(3):
        s += float(x[i]) if x[i].item() > 0 else -float(x.max())
    return torch.tensor(s), torch.tensor(x.tolist()[:3]), torch.tensor(len(x.nonzero()))


@program
def gradient_hooks_and_retain_grad(d):
    m = nn.Linear(4, 3).to(d)
    seen = []
    m.weight.register_hook(lambda g: g * 2)
    x = torch.randn(2, 4).to(d).requires_grad_()
    h = m(x)
    h.retain_grad()
    h.register_hook(lambda g: seen.append(g.clone()))
    h.tanh().sum().backward()
    return m.weight.grad, h.grad, seen[0], x.grad


@program
def losses_with_options(d):
    logits = torch.randn(6, 5).to(d).requires_grad_()
    t = torch.tensor([0, 4, -100, 2, 1, 4]).to(d)
    l1 = F.cross_entropy(logits, t, label_smoothing=0.1, ignore_index=-100)
    l2 = F.binary_cross_entropy_with_logits(logits, torch.rand(6, 5).to(d), pos_weight=torch.full((5,), 2.0).to(d))
    l3 = F.smooth_l1_loss(logits, torch.zeros(6, 5).to(d), beta=0.5) + F.kl_div(
        logits.log_softmax(-1), torch.softmax(torch.randn(6, 5), -1).to(d), reduction="batchmean")
    (l1 + l2 + l3).backward()
    return l1, l2, l3, logits.grad


@program
def scaled_dot_product_attention(d):
    q = torch.randn(2, 3, 5, 8).to(d).requires_grad_()
    k, v = torch.randn(2, 3, 5, 8).to(d), torch.randn(2, 3, 5, 8).to(d)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool).tril().to(d))
    (causal.sum() + masked.sum()).backward()
    return causal, masked, q.grad


@program
def data_dependent_ops(d):
    x = torch.tensor([3, 1, 3, 2, 1, 1]).to(d)
    u, inverse, counts = x.unique(return_inverse=True, return_counts=True)
    f = torch.randn(6).to(d)
    return (u, inverse, counts, torch.bincount(x, minlength=5),
            torch.bucketize(f, torch.tensor([-1.0, 0.0, 1.0]).to(d)),
            torch.searchsorted(torch.tensor([0.0, 1.0, 2.0]).to(d), f),
            torch.histc(f, bins=4, min=-2, max=2), F.one_hot(x), torch.where(x > 1))


@program
def distances_indices_flat_parameters(d):
    a, b = torch.randn(4, 3).to(d), torch.randn(5, 3).to(d)
    m = nn.Linear(3, 2).to(d)
    return (torch.cdist(a, b), torch.triu_indices(3, 3, device=d),
            nn.utils.parameters_to_vector(m.parameters()),
            torch.index_reduce(torch.ones(3).to(d), 0, torch.tensor([0, 0, 2]).to(d),
                               torch.tensor([2.0, 3.0, 4.0]).to(d), "prod"))


@program
def compile_with_a_graph_break(d):
    def f(x):
        y = x.sin() * 2
        if y.sum() > 0:   # data-dependent: a graph break
            y = y + 1
        return y.cos()
    compiled = torch.compile(f, backend="ltc" if d != "cpu" else "eager")
    x = torch.randn(4).to(d)
    return compiled(x), compiled(x + 1)


@program
def copies_to_the_host(d):
    x = torch.arange(6.0).to(d) * 3
    y = x.to("cpu", non_blocking=True)
    if d != "cpu":
        ltc.wait_device_ops()
    z = torch.empty(6)
    z.copy_(x)
    return y, z


@program
def module_forward_hooks(d):
    m = nn.Linear(3, 3).to(d)
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: out + 1)
    y = m(torch.ones(2, 3).to(d))
    y.sum().backward()
    return y, m.weight.grad


@program
def optimizer_in_backward(d):
    """`register_post_accumulate_grad_hook`: each parameter stepped as its gradient lands."""
    m = nn.Linear(3, 2).to(d)
    opts = {p: torch.optim.SGD([p], lr=0.1) for p in m.parameters()}

    def step(p):
        opts[p].step()
        opts[p].zero_grad()
    for p in m.parameters():
        p.register_post_accumulate_grad_hook(step)
    for i in range(2):
        m(torch.full((4, 3), float(i + 1)).to(d)).pow(2).sum().backward()
        if d != "cpu":
            ltc.mark_step()
    return m.weight.detach(), m.bias.detach()


@program
def optimizer_options(d):
    """AdamW without foreach, maximizing, with AMSGrad, `capturable` (its step count a device
    tensor: on `ltc` only, as on CUDA), and other optimizers, three steps each."""
    makers = [lambda p: torch.optim.AdamW(p, lr=0.05, foreach=False),
              lambda p: torch.optim.AdamW(p, lr=0.05, maximize=True),
              lambda p: torch.optim.AdamW(p, lr=0.05, amsgrad=True, weight_decay=0.1),
              lambda p: torch.optim.AdamW(p, lr=0.05, capturable=d != "cpu"),
              lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9, centered=True),
              lambda p: torch.optim.NAdam(p, lr=0.01), lambda p: torch.optim.RAdam(p, lr=0.01),
              lambda p: torch.optim.Rprop(p), lambda p: torch.optim.Adadelta(p)]
    out = []
    for make in makers:
        torch.manual_seed(0)
        m = nn.Linear(3, 2).to(d)
        opt = make(m.parameters())
        for i in range(3):
            opt.zero_grad()
            m(torch.full((2, 3), float(i)).to(d)).sin().sum().backward()
            opt.step()
            if d != "cpu":
                ltc.mark_step()
        out.append(m.weight.detach().clone())
    return out


@program
def gather_scatter_and_friends(d):
    x = torch.randn(5, 4).to(d).requires_grad_()
    i = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 0]]).to(d)
    g = torch.gather(x, 1, i)
    s = torch.zeros(5, 4).to(d).scatter_add(1, i, g * 2)
    (g.sum() + s.pow(2).sum()).backward()
    y = torch.zeros(3, 4).to(d)
    y.index_fill_(1, torch.tensor([0, 2]).to(d), 5.0)
    y.masked_scatter_(y == 0, torch.arange(12.0).to(d))
    y.put_(torch.tensor([0, 11]).to(d), torch.tensor([-1.0, -2.0]).to(d))
    return (g, s, x.grad, y, torch.take(x, torch.tensor([0, 5, 19]).to(d)), torch.diff(x, dim=1),
            torch.combinations(torch.arange(4).to(d)), torch.block_diag(torch.ones(2, 2).to(d), torch.eye(1).to(d)),
            torch.logcumsumexp(x.detach(), 1), torch.special.erfinv(torch.tensor([0.1, -0.5]).to(d)))


@program
def padding_modes(d):
    x = torch.randn(1, 2, 4, 5).to(d).requires_grad_()
    outs = [F.pad(x, (1, 2, 2, 1), mode=m) for m in ("reflect", "replicate", "circular")]
    outs.append(F.pad(x, (1, 1), value=3.0))
    sum(o.sum() for o in outs).backward()
    return outs + [x.grad]


@program
def embedding_max_norm(d):
    """`max_norm` renormalizes the looked-up rows of the weight in place, inside forward."""
    e = nn.Embedding(5, 3, max_norm=1.0).to(d)
    with torch.no_grad():
        e.weight.mul_(3)
    return e(torch.tensor([0, 2, 2]).to(d)), e.weight.detach()


@program
def custom_parametrization(d):
    import torch.nn.utils.parametrize as P

    class Symmetric(nn.Module):
        def forward(self, w):
            return w.triu() + w.triu(1).transpose(-1, -2)
    m = nn.Linear(3, 3).to(d)
    P.register_parametrization(m, "weight", Symmetric())   # no right_inverse: original.set_(original)
    y = m(torch.ones(2, 3).to(d))
    y.sum().backward()
    grad = m.parametrizations.weight.original.grad.clone()
    # ... and training it, as the tutorial does (the step writes the original in place)
    for opt in (torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.Adam(m.parameters(), lr=0.01)):
        for _ in range(2):
            opt.zero_grad()
            m(torch.arange(6.0).view(2, 3).to(d)).square().mean().backward()
            opt.step()
    return y, grad, m.weight, m.parametrizations.weight.original


@program
def optimizer_built_before_the_move(d):
    # the optimizer holds the parameter objects made on the host; moving the model must move
    # those objects (as on CUDA), or the optimizer trains stale host copies and the model none
    emb = nn.Embedding(12, 8)
    head = nn.Linear(8, 12)
    head.weight = emb.weight                       # tied, as in GPT-2
    model = nn.Sequential(emb, nn.Tanh(), head)
    emb.weight.note = "tied"
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    model.to(d)
    ids = torch.randint(0, 12, (4, 5)).to(d)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    same = [model[0].weight is opt.param_groups[0]["params"][0], model[2].weight is model[0].weight,
            model[0].weight.note == "tied", model[0].weight.device.type == torch.device(d).type]
    model.cpu()                                    # and back: still the optimizer's objects
    same.append(model[2].bias is opt.param_groups[0]["params"][-1])
    return torch.stack(losses), model[0].weight.detach(), model[2].bias.detach(), same


@program
def mutation_of_saved_tensors_allowed(d):
    # torch.autograd.graph.allow_mutation_on_saved_tensors: backward must see the values saved
    # before the in-place writes (a scratch buffer reused across layers)
    x = torch.randn(4, 6).to(d).requires_grad_()
    w = torch.randn(6, 6).to(d).requires_grad_()
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        shift = torch.full((4, 6), 0.25).to(d)   # moved inside the context (its mode copies it)
        buf = x @ w + shift
        h = buf.tanh()                  # saves its output, and buf is read by the product below
        g = (buf * h).sum(1)
        buf.mul_(0.5).add_(1.0)         # the scratch buffer is reused in place
        h.sigmoid_()                    # and the saved tanh output overwritten
        loss = g.sum() + (buf * h).sum()
        loss.backward()
    return loss.detach(), x.grad, w.grad


@program
def python_numbers_before_tensors(d):
    # the number is the op's first argument (`-7 // b` is floor_divide(-7, b); DiffGrad's
    # torch.div(1.0, 1.0 + exp(-diff))): computed on the device in eager's promoted dtype
    b = torch.tensor([2, -3, 4, 7]).to(d)
    x = (torch.rand(4) + 0.5).to(d)
    h = torch.randn(4).half().to(d)
    m = torch.tensor([True, False, True, True]).to(d)
    return (-7 // b, 7.5 // b, 7.5 // x, torch.div(1.0, 1.0 + torch.exp(-x)), torch.sub(1, b),
            torch.sub(1.0, b, alpha=2), torch.add(1.0, h), torch.mul(2, m), torch.div(7, b),
            torch.div(7, b, rounding_mode="floor"), torch.floor_divide(3.0, h))


@program
def affine_matrices_written_in_place(d):
    # kornia's get_affine_matrix2d: a batched matrix product, then its translation column
    # written in place (`transform[..., 2] += translations`); also a bias-free Linear's 3-D
    # output and a copying reshape, each written through a slice outside autograd
    angle = torch.rand(4).to(d) * 3.0
    cos, sin = angle.cos(), angle.sin()
    rot = torch.stack([torch.stack([cos, -sin, torch.zeros_like(cos)], -1),
                       torch.stack([sin, cos, torch.zeros_like(cos)], -1),
                       torch.stack([torch.zeros_like(cos)] * 2 + [torch.ones_like(cos)], -1)], 1)
    scale = torch.diag_embed(torch.rand(4, 3).to(d) + 0.5)
    shift = torch.randn(4, 2).to(d)
    with torch.no_grad():
        transform = rot @ scale
        transform[..., :2, 2] += shift
        lin = nn.Linear(3, 5, bias=False).to(d)
        y = lin(torch.randn(2, 4, 3).to(d))
        y[:, 1] += 1.0
        r = torch.randn(2, 4, 3).to(d).transpose(1, 2).reshape(2, 12)
        r[:, 3:5] *= 2.0
    return transform, y, r


@program
def contrastive_loss_masks_its_diagonal(d):
    # SimCLR / InfoNCE as pytorch-metric-learning writes it: the similarity matrix's diagonal
    # filled in place (was an eager fallback per call: PyTorch writes it through as_strided)
    enc = nn.Linear(6, 4).to(d)
    opt = torch.optim.SGD(enc.parameters(), lr=0.1)
    a, b = torch.randn(5, 6).to(d), torch.randn(5, 6).to(d)
    losses = []
    for _ in range(2):
        z = F.normalize(enc(torch.cat([a, b])), dim=1)
        sim = z @ z.t() / 0.5
        sim.fill_diagonal_(-1e9)
        target = torch.cat([torch.arange(5, 10), torch.arange(0, 5)]).to(d)
        loss = F.cross_entropy(sim, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    tall = torch.zeros(7, 3).to(d).fill_diagonal_(2.0, wrap=True)
    cube = torch.zeros(3, 3, 3).to(d).fill_diagonal_(1.0)
    return torch.stack(losses), enc.weight, tall, cube


@program
def reparameterized_gamma_beta_dirichlet(d):
    # rsample of Gamma / Beta / Dirichlet latents (pyro, Dirichlet VAEs): sampled and
    # differentiated on the device (were eager fallbacks: _sample_dirichlet, _dirichlet_grad,
    # _standard_gamma_grad).  The device draws its own numbers, so only what does not depend on
    # them is compared: a Dirichlet sample sums to one (its sum's gradient is zero), and the
    # log-densities of fixed points
    conc = torch.tensor([1.5, 2.0, 0.7]).to(d).requires_grad_()
    x = torch.tensor([0.2, 0.5, 0.3]).to(d)
    z = torch.distributions.Dirichlet(conc).rsample((4,))
    b = torch.distributions.Beta(conc, conc * 2).rsample()
    g = torch.distributions.Gamma(conc, 2.0).rsample()
    lp = torch.distributions.Dirichlet(conc).log_prob(x) + torch.distributions.Beta(conc, 2.0).log_prob(x).sum()
    (z.sum() + (b * 0).sum() + (g * 0).sum() + lp).backward()
    return z.sum(-1), lp, conc.grad, (b > 0).all() & (b < 1).all(), (g > 0).all()


@program
def duplicate_edges_removed(d):
    # graph code deduplicates its edge list: torch.unique(edge_index, dim=1) (was an eager
    # fallback; now one size read), then counts degrees over the unique edges
    src = torch.tensor([0, 1, 1, 2, 0, 3, 1, 2, 0])
    dst = torch.tensor([1, 2, 2, 0, 1, 1, 2, 3, 1])
    edge_index = torch.stack([src, dst]).to(d)
    unique, inverse, counts = torch.unique(edge_index, dim=1, return_inverse=True, return_counts=True)
    degree = torch.zeros(4, dtype=torch.long).to(d).index_add_(0, unique[1], torch.ones_like(unique[1]))
    rows = torch.unique(torch.tensor([[1.0, 2.0], [0.5, 1.0], [1.0, 2.0]]).to(d), dim=0)
    return unique, inverse, counts, degree, rows


@program
def bool_and_complex_python_scalars(d):
    # masks built with Python bools (a padding mask, a causal mask, flags), complex rotary
    # embeddings in the style of Llama's reference code (`freqs_cis`, `* 1j`): all on the device
    ids = torch.tensor([[5, 3, 0, 0], [7, 0, 0, 0]]).to(d)
    pad = (ids == 0).masked_fill(ids == 7, True)
    keep = ~pad & True
    causal = torch.ones(4, 4, dtype=torch.bool).to(d).triu(1) | False
    flags = torch.zeros(2, dtype=torch.bool).to(d).fill_(True) ^ (ids[:, 0] == True)
    scores = torch.randn(2, 4, 4).to(d).masked_fill(causal, float("-inf")).masked_fill(pad[:, None], True)
    counts = keep.long() + True
    # transformers' NoRepeatNGramLogitsProcessor: banned tokens marked in a bool mask
    banned = torch.zeros(2, 8, dtype=torch.bool).to(d).scatter_(1, ids.clamp(max=7), True)
    x = torch.randn(2, 4, 8).to(d)
    freqs = torch.outer(torch.arange(4.0), 1.0 / 10000 ** (torch.arange(0, 8, 2.0) / 8)).to(d)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    xc = torch.view_as_complex(x.reshape(2, 4, 4, 2))
    rotated = torch.view_as_real(xc * freqs_cis * 1j / (1 + 1j)).flatten(2)
    return pad, keep, causal, flags, scores.softmax(-1), counts, banned, rotated, (x * True).sum()


@program
def channels_last_cnn_training(d):
    # the channels-last recipe for CNNs: layouts as eager reports them (code branches on
    # `is_contiguous(memory_format=...)`), values, gradients
    cl = torch.channels_last
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1),
                      nn.ConvTranspose2d(4, 2, 2, stride=2)).to(d).to(memory_format=cl)
    x = torch.randn(2, 3, 10, 10).to(d).to(memory_format=cl)
    y = m(x)
    y.square().mean().backward()
    plain = nn.functional.conv2d(torch.randn(1, 2, 5, 5).to(d), torch.randn(3, 2, 3, 3).to(d).to(memory_format=cl))
    return (y, y.stride(), y.is_contiguous(memory_format=cl), m[0].weight.grad, m[0].weight.grad.stride(),
            m[3].weight.grad.stride(), plain.stride())


@program
def ctc_loss_with_host_lengths(d):
    # speech recipes keep the length tensors a DataLoader collated on the host
    lin = nn.Linear(6, 5).to(d)
    feats = torch.randn(8, 2, 6).to(d)
    targets = torch.tensor([[1, 2, 2], [3, 4, 0]]).to(d)
    il, tl = torch.tensor([8, 7]), torch.tensor([3, 2])
    out = []
    for reduction in ("mean", "sum", "none"):
        loss = nn.CTCLoss(reduction=reduction)(lin(feats).log_softmax(2), targets, il, tl)
        loss.sum().backward()
        out += [loss, lin.weight.grad.clone()]
    return out


@program
def tensors_built_from_scalar_tensors(d):
    # metrics gathered per step as 0-dim tensors, then stacked the quick way
    x = torch.randn(4, 3).to(d)
    losses = [x[i].square().mean() for i in range(4)]
    accs = [(x[i] > 0).float().mean() for i in range(4)]
    return (torch.tensor(losses), torch.as_tensor([losses[0], accs[1]]), torch.tensor([[losses[2]], [3.0]]),
            torch.tensor(losses, device=d), torch.stack(losses))



@program
def flop_counter_around_a_training_step(d):
    # FlopCounterMode (a TorchDispatchMode) over a step with in-place, scatter and factory ops;
    # the in-place ops after it must not remember anything from under the mode
    from torch.utils.flop_counter import FlopCounterMode
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4)).to(d)
    x = torch.randn(6, 8).to(d)
    index = torch.tensor([0, 1, 1, 2, 0, 2], device=d)
    with FlopCounterMode(display=False) as counter:
        h = m(x)
        pooled = h.new_zeros(3, 4).index_add_(0, index, h)
        deg = torch.zeros(3, device=d).scatter_add_(0, index, torch.ones(6, device=d))
        loss = (pooled / deg.clamp_(min=1).unsqueeze(1)).pow(2).mean()
        loss.backward()
    after = x.clone().mul_(2).add_(1).clamp_(max=1.5)
    return loss, m[0].weight.grad, counter.get_total_flops(), after


@program
def selective_activation_checkpointing(d):
    # torchtitan's pattern: keep matmul outputs, recompute the rest in backward
    import functools

    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) \
            else CheckpointPolicy.PREFER_RECOMPUTE
    block = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).to(d)
    x = torch.randn(4, 8).to(d).requires_grad_()
    y = checkpoint(block, x, use_reentrant=False,
                   context_fn=functools.partial(create_selective_checkpoint_contexts, policy))
    y.pow(2).sum().backward()
    return y, x.grad, block[0].weight.grad, block[2].weight.grad


@program
def an_op_logging_nan_checking_dispatch_mode(d):
    # the debugging mode users write: log each op, check each result for NaNs
    from torch.utils._python_dispatch import TorchDispatchMode

    class NanCheck(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.nan_found = 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.ops += 1
            for t in (out if isinstance(out, (list, tuple)) else [out]):
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.isnan().any():
                    self.nan_found = True
            return out
    x = torch.tensor([1.0, 4.0, -1.0]).to(d)
    with NanCheck() as mode:
        y = x.sqrt().mul_(2)
        z = torch.arange(3, device=d) + y.nan_to_num()
    return y, z, mode.nan_found, mode.ops > 0


@program
def torch_func_functionalize(d):
    def f(a):
        b = a.clone()
        b.add_(1)
        a.mul_(2)   # a mutated input: functionalize applies it to the input too
        return b.view(2, 2) * 3
    x = torch.arange(4.0).to(d)
    return torch.func.functionalize(f)(x), x



@program
def distributed_checkpoint_save_and_load(d):
    # torch.distributed.checkpoint without a process group (torchtitan's checkpoints), also for
    # CPU tensors in a process that imported ltc_async (the accelerator is then `ltc`, whose
    # stream it stages host copies on)
    import tempfile

    import torch.distributed.checkpoint as dcp
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(d)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4).to(d)).sum().backward()
    opt.step()
    folder = tempfile.mkdtemp()
    dcp.save({"model": model.state_dict(), "extra": torch.arange(5).to(d)}, checkpoint_id=folder)
    fresh = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(d)
    state = {"model": fresh.state_dict(), "extra": torch.zeros(5, dtype=torch.long).to(d)}
    dcp.load(state, checkpoint_id=folder)
    fresh.load_state_dict(state["model"])
    torch.accelerator.synchronize()   # device-generic code: waits for ltc's queues
    return fresh[0].weight, fresh[2].bias, state["extra"], fresh(torch.ones(2, 4).to(d))


@program
def torch_export_of_a_module(d):
    m = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.GELU()).to(d)
    program = torch.export.export(m, (torch.randn(2, 4).to(d),))
    return program.module()(torch.randn(2, 4).to(d)), m(torch.ones(1, 4).to(d))



@program
def inference_mode_views_and_generate(d):
    # pipelines' pattern: inputs made first, generate() inside torch.inference_mode(); views of
    # tensors made before the block (a slice, a transposed weight) are taken inside it
    import transformers
    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=64,
                                   pad_token_id=0, eos_token_id=2)
    model = transformers.LlamaForCausalLM(cfg).eval().to(d)
    ids = torch.tensor([[5, 17, 33, 42]]).to(d)
    with torch.inference_mode():
        tokens = model.generate(ids, max_new_tokens=4, do_sample=False)
        last = ids[:, -1] + 1
        projected = model.lm_head.weight.t()[:3].sum(0)
    return tokens, last, projected


def _flat(v: Any) -> list:
    if isinstance(v, (list, tuple)):
        return [x for e in v for x in _flat(e)]
    return [v]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_everyday_feature_matches_eager(name):
    fn = PROGRAMS[name]
    torch.manual_seed(0)
    want = _flat(fn("cpu"))
    torch.manual_seed(0)
    ltc.metrics.reset()
    got = _flat(fn("ltc:0"))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), f"output {i}: {type(g).__name__}"
            h = g.detach().cpu()
            assert (h.dtype, h.shape) == (w.dtype, w.shape), f"output {i}: {h.dtype} {tuple(h.shape)}"
            if w.is_floating_point() or w.is_complex():
                torch.testing.assert_close(h, w.detach(), atol=1e-3 if "scaler" in name else 1e-4,
                                           rtol=1e-3 if "scaler" in name else 1e-4, equal_nan=True,
                                           msg=lambda m: f"output {i}: {m}")
            else:
                assert torch.equal(h, w), f"output {i}: {h} != {w}"
        elif isinstance(w, float):
            assert math.isclose(g, w, rel_tol=1e-5), f"output {i}: {g} != {w}"
        else:
            assert g == w, f"output {i}: {g} != {w}"
    fallbacks = {n.split("::", 1)[1] for n in ltc.metrics.counter_names()
                 if n.startswith("EagerFallback::") and ltc.metrics.counter_value(n)}
    assert fallbacks <= ALLOWED_FALLBACKS.get(name, set()), f"eager fallbacks: {sorted(fallbacks)}"
