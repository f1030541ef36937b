"""Ops whose output size depends on values stay on the device (issue 18): nonzero, torch.where(c),
boolean indexing and masked writes, masked_select, bincount, unique, unique_consecutive,
repeat_interleave.

Each program runs eagerly on the CPU and on `ltc:0` from the same data; values (and gradients)
must match, with no eager fallback and at most one size read per data-dependent op.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ltc_async as ltc

DEV = "ltc:0"


def run_both(fn, *inputs):
    """(eager result, lazy result as CPU tensors, fallbacks, size reads) of `fn(*inputs)`."""
    ref = fn(*inputs)
    ltc.metrics.reset()
    out = fn(*[i.to(DEV) if isinstance(i, torch.Tensor) else i for i in inputs])
    outs = out if isinstance(out, (tuple, list)) else (out,)
    got = [o.cpu() for o in outs]
    return ref, got, ltc.metrics.counter_value("EagerFallback"), ltc.metrics.counter_value("SizeRead") or 0


def assert_like_eager(fn, *inputs, reads: int):
    ref, got, fallbacks, size_reads = run_both(fn, *inputs)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(got) == len(refs)
    for g, r in zip(got, refs):
        assert g.dtype == r.dtype and g.shape == r.shape
        torch.testing.assert_close(g, r)
    assert fallbacks == 0
    assert size_reads == reads


def with_grad(fn):
    def run(a, *rest):
        a = a.detach().requires_grad_(True)
        out = fn(a, *rest)
        (out.float() ** 2).sum().backward()
        return out.detach(), a.grad
    return run


X = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
MASK = X > 0.2
IDS = torch.randint(0, 9, (40,), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_nonzero_where_argwhere(dtype):
    x = (X * 4).to(dtype) * MASK
    assert_like_eager(torch.nonzero, x, reads=1)
    assert_like_eager(lambda a: torch.where(a != 0), x, reads=1)
    assert_like_eager(torch.argwhere, x, reads=1)
    assert_like_eager(lambda a: torch.nonzero(a, as_tuple=True), x, reads=1)


def test_nonzero_of_nothing_and_of_a_scalar():
    assert_like_eager(torch.nonzero, torch.zeros(3, 4), reads=1)
    assert_like_eager(torch.nonzero, torch.tensor(2.0), reads=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_boolean_indexing_forward_and_backward(dtype):
    x = X.to(dtype)
    # the backward's index_put uses the same mask: its count is not read again
    assert_like_eager(with_grad(lambda a, m: a[m] * 2), x, MASK, reads=1)
    assert_like_eager(with_grad(lambda a, m: a[m[:, 0]] + 1), x, MASK, reads=1)      # rows
    assert_like_eager(with_grad(lambda a, m: torch.masked_select(a, m)), x, MASK, reads=1)   # backward: masked_scatter
    assert_like_eager(lambda a, m: torch.masked_select(a, m[0]), x, MASK, reads=1)   # broadcast mask


def test_masked_writes():
    def fill(a, m):
        a = a.clone()
        a[m] = -1.5              # one value: a select on the device, no read
        return a

    def scatter(a, m):
        a = a.clone()
        a[m] = torch.arange(int(m.sum()), dtype=a.dtype, device=a.device)
        return a
    assert_like_eager(fill, X, MASK, reads=0)
    ref, got, fallbacks, _ = run_both(scatter, X, MASK)
    torch.testing.assert_close(got[0], ref)
    assert fallbacks == 0


def test_bincount_unique_repeat_interleave():
    assert_like_eager(torch.bincount, IDS, reads=1)
    assert_like_eager(lambda i, w: torch.bincount(i, w, minlength=12), IDS, torch.rand(40), reads=1)
    assert_like_eager(lambda i: torch.unique(i), IDS, reads=1)
    assert_like_eager(lambda i: torch.unique(i.view(5, 8), return_inverse=True, return_counts=True),
                      IDS, reads=1)
    assert_like_eager(lambda i: torch.unique_consecutive(i.sort().values), IDS, reads=1)
    assert_like_eager(lambda i: torch.unique_consecutive(i.view(5, 8), return_inverse=True, return_counts=True),
                      IDS, reads=1)
    assert_like_eager(lambda r: torch.repeat_interleave(r), torch.tensor([2, 0, 3]), reads=1)
    assert_like_eager(with_grad(lambda a, r: torch.repeat_interleave(a, r, dim=0)), X,
                      torch.tensor([1, 0, 2, 3, 1, 2]), reads=1)   # backward: index_add, no read


class Top2MoE(torch.nn.Module):
    """A top-2 mixture of experts as written in the wild: topk routing, `torch.where(mask)` per
    expert, gather the expert's tokens, `index_add_` the weighted outputs back."""

    def __init__(self, d: int = 16, experts: int = 4) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(d, experts, bias=False)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 32), torch.nn.GELU(), torch.nn.Linear(32, d))
            for _ in range(experts))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.gate(h).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, expert(h[token]) * weights[token, slot, None])
        return out


def train(model: torch.nn.Module, batches, device: str) -> list[float]:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        if device != "cpu":
            ltc.mark_step()
        losses.append(loss)
    return [float(v) for v in losses]


def test_mixture_of_experts_trains_like_eager_on_the_device():
    torch.manual_seed(0)
    model = Top2MoE()
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)) for _ in range(4)]
    eager = train(__import__("copy").deepcopy(model), batches, "cpu")
    ltc.metrics.reset()
    lazy = train(model, batches, DEV)
    torch.testing.assert_close(lazy, eager, rtol=1e-4, atol=1e-5)
    assert ltc.metrics.counter_value("EagerFallback") == 0
    # one size read per step: the first expert's count, read with the routing choice it is
    # computed from; the other experts' counts are computed from it on the host
    # (`host_compute.py`); the backward's index ops reuse them
    assert ltc.metrics.counter_value("SizeRead") == 4
    assert ltc.metrics.counter_value("SizeReadOnHost") == 3 * 4


def test_per_class_masks_of_one_label_tensor_read_once_per_step():
    # a per-class loss, as class-balanced and metric code writes it: every class's mask is an
    # integer function of the labels, so one read sizes them all; a mask of float values (the
    # confident predictions) cannot be computed on the host and is read
    def step(logits, labels, device):
        loss = logits.new_zeros(())
        for c in range(5):
            picked = labels == c
            loss = loss + F.cross_entropy(logits[picked], labels[picked], reduction="sum")
        confident = logits.softmax(-1).amax(-1) > 0.3
        return loss, logits[confident].sum(), torch.where((labels % 2 == 1) & (labels != 3))[0]

    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(40, 5, generator=g), torch.randint(0, 5, (40,), generator=g)) for _ in range(3)]
    ltc.metrics.reset()
    for logits, labels in data:
        x = logits.to(DEV).requires_grad_()
        got = step(x, labels.to(DEV), DEV)
        got[0].backward()
        want_x = logits.clone().requires_grad_()
        want = step(want_x, labels, "cpu")
        want[0].backward()
        for a, b in zip(got, want):
            torch.testing.assert_close(a.detach().cpu(), b.detach())
        torch.testing.assert_close(x.grad.cpu(), want_x.grad)
        ltc.mark_step()
    # per step: the first class's count (with the labels), the float mask's count; the other
    # four classes and the odd-labels mask on the host
    assert ltc.metrics.counter_value("SizeRead") == 2 * 3
    assert ltc.metrics.counter_value("SizeReadOnHost") == 5 * 3


def gcn_step(x, edge_index, y, train_mask, w1, w2):
    """A two-layer GCN in plain PyTorch, as torch_geometric writes it: degree normalisation with
    `scatter_add`, messages gathered by index and summed with `index_add`, the loss on the
    training nodes picked by a boolean mask."""
    src, dst = edge_index
    n = x.shape[0]
    deg = torch.zeros(n, device=x.device).scatter_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
    norm = (deg[src] * deg[dst]).clamp(min=1).rsqrt()

    def conv(h, w):
        h = h @ w
        return torch.zeros_like(h).index_add_(0, dst, h[src] * norm[:, None])
    h = conv(x, w1).relu()
    logits = conv(h, w2)
    return torch.nn.functional.cross_entropy(logits[train_mask], y[train_mask])


def test_gcn_with_a_boolean_train_mask_like_eager():
    g = torch.Generator().manual_seed(3)
    n, e = 30, 90
    x = torch.randn(n, 8, generator=g)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    train_mask = torch.rand(n, generator=g) < 0.5
    w = [torch.randn(8, 16, generator=g), torch.randn(16, 3, generator=g)]

    def grads(x, ei, y, m, w1, w2):
        w1, w2 = w1.detach().requires_grad_(), w2.detach().requires_grad_()
        loss = gcn_step(x, ei, y, m, w1, w2)
        loss.backward()
        return loss.detach(), w1.grad, w2.grad
    # logits[mask], y[mask] and the backward share one read of the mask's count
    assert_like_eager(grads, x, edge_index, y, train_mask, *w, reads=1)


def test_ctc_loss_training_on_the_device():
    """`nn.CTCLoss` with length tensors on the device, as speech models train (Wav2Vec2's CTC
    head): loss and gradients like eager, no fallback, one read of the lengths per step (the
    backward reuses it)."""
    g = torch.Generator().manual_seed(4)
    T, B, C, S = 20, 3, 7, 5
    feats = torch.randn(T, B, 10, generator=g)
    targets = torch.randint(1, C, (B, S), generator=g)
    in_lens = torch.tensor([20, 18, 15])
    tg_lens = torch.tensor([5, 3, 4])
    torch.manual_seed(0)
    head = torch.nn.Linear(10, C)

    def run(device):
        model = __import__("copy").deepcopy(head).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ctc = torch.nn.CTCLoss(zero_infinity=True)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            lp = model(feats.to(device)).log_softmax(-1)
            loss = ctc(lp, targets.to(device), in_lens.to(device), tg_lens.to(device))
            loss.backward()
            opt.step()
            if device != "cpu":
                ltc.mark_step()
            losses.append(loss)
        return [float(v) for v in losses], model.weight.detach().cpu()
    eager = run("cpu")
    ltc.metrics.reset()
    lazy = run(DEV)
    torch.testing.assert_close(lazy, eager, rtol=1e-4, atol=1e-5)
    assert ltc.metrics.counter_value("EagerFallback") == 0
    trips = ltc.metrics.host_round_trips()
    assert trips.pop("size::_ctc_loss.Tensor") == 1.0            # per step
    # the user's reads: float(loss), and the weights read at the end
    assert set(trips) == {"read::_local_scalar_dense", "read::_to_copy"}


def test_host_round_trips_say_why_per_step():
    ltc.metrics.reset()
    for _ in range(2):
        x = torch.randn(8, 4).to(DEV)                              # a new batch
        total = x[x > 0].sum()                                     # a size read
        torch.cumprod(x, 0, out=torch.empty(0, device=DEV))        # an out= resize on the device
        print_value = float(total)                                 # a user read
        assert print_value > 0
        ltc.mark_step()
    trips = ltc.metrics.host_round_trips()
    assert trips["size::nonzero"] == 1.0
    assert trips["read::_local_scalar_dense"] == 1.0
    assert ltc.metrics.host_round_trips(per_step=False)["size::nonzero"] == 2.0
    assert "Host round trips (per step, by why)" in ltc.metrics.report()


def test_a_mask_rebuilt_from_the_same_data_is_read_once():
    """A library that rebuilds a mask every step from fixed device data (PyG's self-loop mask of a
    fixed `edge_index`) pays its size read in the first step only; when the data changes (a new
    batch, an in-place update), the count is read again and the values stay eager's."""
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 3], [1, 1, 2, 0, 3, 0]])
    feats = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    ei, f = edge_index.to(DEV), feats.to(DEV)
    ltc.metrics.reset()
    for step in range(3):
        keep = ei[0] != ei[1]                                      # rebuilt every step
        got = f[keep] * (step + 1)
        want = feats[edge_index[0] != edge_index[1]] * (step + 1)
        torch.testing.assert_close(got.cpu(), want)
        ltc.mark_step()
    assert ltc.metrics.counter_value("SizeRead") == 1
    assert ltc.metrics.counter_value("SizeReadReused") == 2
    ei[1, 0] = 0                    # now edge 0 is a self loop: the data changed
    edge_index[1, 0] = 0
    torch.testing.assert_close(f[ei[0] != ei[1]].cpu(), feats[edge_index[0] != edge_index[1]])
    assert ltc.metrics.counter_value("SizeRead") == 2
