"""Third-party libraries as their users write them, eager CPU vs `ltc:0` (issue 18).

Each program runs on the same data on both devices; results are compared at the end, eager
fallbacks are counted (0 in every case) and the host round trips per step are printed (`-s`)
and bounded: what remains is the library's own reading of values (an adaptive ODE solver's step
control, pyro's argument validation, `.item()` of a loss) and one size read per
data-dependent op (`ltc.metrics.host_round_trips()`).
"""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

import ltc_async as ltc

# against eager CPU; wider where ltc:0 is backed by a GPU (CUDA's kernels round differently,
# training grows it: test_models.against_cpu)
_TOLERANCE = dict(rtol=2e-3, atol=2e-3) if "cuda" in os.environ.get("LTC_ASYNC_DEVICES", "") \
    else dict(rtol=1e-4, atol=1e-5)

DEV = "ltc:0"


def report(name: str) -> dict:
    fallbacks = ltc.metrics.counter_value("EagerFallback")
    trips = ltc.metrics.host_round_trips()
    print(f"\n  {name:28s} fallbacks {fallbacks}  host round trips per step {sum(trips.values()):.1f} "
          f"{dict(sorted(trips.items()))}")
    assert fallbacks == 0
    return trips


def train_like_eager(model: torch.nn.Module, make_opt, loss_of, steps: int = 3) -> None:
    """Train copies of `model` on the CPU and on `ltc:0` (`loss_of(model, device)` gives a
    step's loss) and compare the losses and the final parameters; counters are reset before
    the lazy run."""
    def train(device):
        m = copy.deepcopy(model).to(device)
        opt = make_opt(m.parameters())
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_of(m, device)
            loss.backward()
            opt.step()
            if device != "cpu":
                ltc.mark_step()
            losses.append(float(loss))
        return losses, [p.detach().cpu() for p in m.parameters()]
    eager = train("cpu")
    ltc.metrics.reset()
    lazy = train(DEV)
    torch.testing.assert_close(lazy, eager, **_TOLERANCE)


# -- torchdiffeq -----------------------------------------------------------------------------------

torchdiffeq = pytest.importorskip("torchdiffeq")


class ODEFunc(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(y)


@pytest.mark.parametrize("solver", ["odeint-rk4", "odeint_adjoint-dopri5"])
def test_torchdiffeq_neural_ode_trains_like_eager(solver):
    torch.manual_seed(0)
    func = ODEFunc()
    y0 = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    adjoint = solver.startswith("odeint_adjoint")
    solve = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint
    kw = dict(rtol=1e-3, atol=1e-4) if adjoint else dict(method="rk4", options=dict(step_size=0.1))

    t = torch.linspace(0, 1, 5)
    train_like_eager(func, lambda ps: torch.optim.SGD(ps, lr=0.05),
                     lambda f, device: solve(f, y0.to(device), t.to(device), **kw).pow(2).mean())
    trips = report(f"torchdiffeq {solver}")
    if not adjoint:   # fixed steps: no size reads; the reads are the solver comparing `t` values and the loss
        assert set(trips) <= {"read::_local_scalar_dense", "read::_to_copy"}
        if "cuda" not in os.environ.get("LTC_ASYNC_DEVICES", ""):
            # the solver's comparisons of its time grid with `t` are computed on the host
            # (`tensor/host_compute.py`): what is left is the loss read every step
            assert trips["read::_local_scalar_dense"] <= 1.0


# -- torch_geometric ---------------------------------------------------------------------------------

def _graph():
    g = torch.Generator().manual_seed(0)
    n = 40
    return (torch.randn(n, 8, generator=g), torch.randint(0, n, (2, 160), generator=g),
            torch.randint(0, 3, (n,), generator=g), torch.rand(n, generator=g) < 0.5)


@pytest.mark.parametrize("conv", ["GCNConv", "GATConv"])
def test_torch_geometric_node_classification_like_eager(conv):
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    Conv = getattr(pyg_nn, conv)
    x, edge_index, y, train_mask = _graph()
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([Conv(8, 16), Conv(16, 3)])

    data = {"cpu": (x, edge_index, y, train_mask),
            DEV: tuple(v.to(DEV) for v in (x, edge_index, y, train_mask))}

    def loss_of(m, device):
        xs, ei, ys, mask = data[device]
        out = m[1](m[0](xs, ei).relu(), ei)
        return torch.nn.functional.cross_entropy(out[mask], ys[mask])   # a boolean train mask
    train_like_eager(layers, lambda ps: torch.optim.Adam(ps, lr=0.01), loss_of)
    trips = report(f"torch_geometric {conv}")
    assert set(trips) <= {"size::nonzero", "read::_local_scalar_dense", "read::_to_copy"}
    assert trips.get("size::nonzero", 0) <= 3     # the mask's count (PyG's self loops add some)


# -- torchmetrics ------------------------------------------------------------------------------------

def test_torchmetrics_accuracy_and_f1_like_eager():
    torchmetrics = pytest.importorskip("torchmetrics")
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randint(0, 5, (64,), generator=g), torch.randint(0, 5, (64,), generator=g))
               for _ in range(3)]

    def run(device):
        acc = torchmetrics.classification.MulticlassAccuracy(5).to(device)
        f1 = torchmetrics.classification.MulticlassF1Score(5, average="macro").to(device)
        for p, t in batches:
            acc.update(p.to(device), t.to(device))
            f1.update(p.to(device), t.to(device))
            if device != "cpu":
                ltc.mark_step()
        return acc.compute().cpu(), f1.compute().cpu()
    eager = run("cpu")
    ltc.metrics.reset()
    lazy = run(DEV)
    torch.testing.assert_close(lazy, eager)
    report("torchmetrics Accuracy, F1")


# -- pyro ------------------------------------------------------------------------------------------

def test_pyro_svi_fits_like_eager():
    """SVI with an AutoNormal guide.  The lazy device's random stream differs from the host's by
    contract, so the fits are compared, not the samples: both find the data's mean."""
    pyro = pytest.importorskip("pyro")
    dist = pytest.importorskip("pyro.distributions")
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal
    data = torch.randn(200, generator=torch.Generator().manual_seed(6)) + 3.0

    def fit(device):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        d = data.to(device)

        def model(d):
            mu = pyro.sample("mu", dist.Normal(torch.zeros((), device=device), 10.0))
            with pyro.plate("data", len(d)):
                pyro.sample("obs", dist.Normal(mu, 1.0), obs=d)
        guide = AutoNormal(model)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.1}), Trace_ELBO())
        for _ in range(150):
            svi.step(d)
            if device != "cpu":
                ltc.mark_step()
        return float(guide.median()["mu"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = fit("cpu")
        ltc.metrics.reset()
        lazy = fit(DEV)
    assert abs(lazy - data.mean().item()) < 0.15 and abs(eager - data.mean().item()) < 0.15
    report("pyro SVI AutoNormal")


# -- transformers Wav2Vec2ForCTC -------------------------------------------------------------------

def test_wav2vec2_ctc_fine_tuning_like_eager():
    """Speech recognition fine-tuning as the transformers docs write it: raw audio in, labels
    padded with -100, `Wav2Vec2ForCTC` computes `nn.functional.ctc_loss` over the label lengths
    it finds with a boolean mask (`labels >= 0`, `masked_select`).  Dropout and SpecAugment
    masking off (the device's random stream differs from the host's by contract)."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.Wav2Vec2Config(
        vocab_size=12, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
        ctc_loss_reduction="mean", pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.Wav2Vec2ForCTC(cfg)
    g = torch.Generator().manual_seed(7)
    audio = torch.randn(2, 1600, generator=g)
    labels = torch.randint(1, 12, (2, 9), generator=g)
    labels[0, 6:] = -100                       # the first utterance's transcript is shorter
    train_like_eager(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                     lambda m, device: m(audio.to(device), labels=labels.to(device)).loss)
    trips = report("transformers Wav2Vec2ForCTC")
    # per step: the label lengths (one size read for `masked_select`, one for the CTC lengths),
    # the library's own check `labels.max() >= vocab_size` and the test's `float(loss)`; the
    # parameters read once at the end by the comparison (`read::_to_copy`)
    assert trips.get("size::nonzero") == 1 and trips.get("size::_ctc_loss.Tensor") == 1, trips
    assert trips.get("read::_local_scalar_dense") == 2, trips
    assert set(trips) == {"size::nonzero", "size::_ctc_loss.Tensor", "read::_local_scalar_dense",
                          "read::_to_copy"}, trips
