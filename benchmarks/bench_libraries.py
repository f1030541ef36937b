"""Programs with data-dependent ops and third-party libraries: step time eager vs ltc_async,
eager fallbacks and host round trips per step, side by side (issue 18).

    python -m benchmarks.bench_libraries [--rounds 5] [--steps 10] [--only moe,gcn,...]

Each case is a training step (or a metric update) built once per device from the same seed and
data; rounds of eager and ltc_async interleave; the figure is the median ms per step over
`steps` back-to-back steps and one wait (pipelined throughput: ltc's steps overlap unless a host
round trip stops them).  For ltc_async also: eager fallbacks and host round trips per step, and
why (`ltc.metrics.host_round_trips()`), counted over a separate run of `steps` steps, and how
many graph executions per step ran on the top tier (Inductor, `TierUpRun`; tiering is on by
default: the warm-up runs past the tier-up threshold, waits for the background builds and runs
past their trials, so the timed steps are the steady state).
"""
from __future__ import annotations

import argparse
import warnings

import torch

import ltc_async as ltc
from benchmarks.engines import settle_tiers
from benchmarks.harness import Runner, log, md_header, md_row, time_steps

DEV = "ltc:0"


def _mark(device: str) -> None:
    if device != "cpu":
        ltc.mark_step()


def moe(device: str):
    from tests.test_data_dependent import Top2MoE
    torch.manual_seed(0)
    model = Top2MoE().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, 16, generator=g).to(device), torch.randn(64, 16, generator=g).to(device)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        _mark(device)
    return step


def _pyg(conv_name: str):
    def make(device: str):
        conv = getattr(__import__("torch_geometric.nn", fromlist=[conv_name]), conv_name)
        g = torch.Generator().manual_seed(0)
        n = 200
        x, ei = torch.randn(n, 16, generator=g), torch.randint(0, n, (2, 800), generator=g)
        y, mask = torch.randint(0, 4, (n,), generator=g), torch.rand(n, generator=g) < 0.5
        x, ei, y, mask = (v.to(device) for v in (x, ei, y, mask))
        torch.manual_seed(0)
        layers = torch.nn.ModuleList([conv(16, 32), conv(32, 4)]).to(device)
        opt = torch.optim.Adam(layers.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad()
            out = layers[1](layers[0](x, ei).relu(), ei)
            torch.nn.functional.cross_entropy(out[mask], y[mask]).backward()
            opt.step()
            _mark(device)
        return step
    return make


def ctc(device: str):
    g = torch.Generator().manual_seed(4)
    T, B, C, S = 50, 8, 20, 12
    feats = torch.randn(T, B, 32, generator=g).to(device)
    targets = torch.randint(1, C, (B, S), generator=g).to(device)
    in_lens = torch.full((B,), T).to(device)
    tg_lens = torch.randint(4, S + 1, (B,), generator=g).to(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, C)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CTCLoss(zero_infinity=True)

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(feats).log_softmax(-1), targets, in_lens, tg_lens).backward()
        opt.step()
        _mark(device)
    return step


def wav2vec2(device: str):
    import transformers
    transformers.logging.set_verbosity_error()
    cfg = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.Wav2Vec2ForCTC(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(7)
    audio = torch.randn(4, 8000, generator=g).to(device)
    labels = torch.randint(1, 32, (4, 20), generator=g)
    labels[1, 12:] = labels[3, 15:] = -100
    labels = labels.to(device)

    def step() -> None:
        opt.zero_grad()
        model(audio, labels=labels).loss.backward()
        opt.step()
        _mark(device)
    return step


def neural_ode(device: str):
    from torchdiffeq import odeint

    from tests.models.test_libraries import ODEFunc
    torch.manual_seed(0)
    f = ODEFunc().to(device)
    opt = torch.optim.SGD(f.parameters(), lr=0.01)
    y0 = torch.randn(64, 4, generator=torch.Generator().manual_seed(1)).to(device)
    t = torch.linspace(0, 1, 5).to(device)

    def step() -> None:
        opt.zero_grad()
        odeint(f, y0, t, method="rk4", options=dict(step_size=0.1)).pow(2).mean().backward()
        opt.step()
        _mark(device)
    return step


def metrics_update(device: str):
    import torchmetrics
    acc = torchmetrics.classification.MulticlassAccuracy(10).to(device)
    g = torch.Generator().manual_seed(5)
    p, t = torch.randint(0, 10, (512,), generator=g).to(device), torch.randint(0, 10, (512,), generator=g).to(device)

    def step() -> None:
        acc.update(p, t)
        _mark(device)
    return step


CASES = {"moe": moe, "gcn": _pyg("GCNConv"), "gat": _pyg("GATConv"), "ctc": ctc, "wav2vec2": wav2vec2,
         "neural_ode": neural_ode, "torchmetrics": metrics_update}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--only", default=",".join(CASES))
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for name in args.only.split(","):
        make = CASES[name]
        steps = {dev: make(dev) for dev in ("cpu", DEV)}
        for dev, step in steps.items():   # warm-up (compiles)
            for _ in range(3):
                step()
        settle_tiers(steps[DEV], 3)       # and tiering's background builds and trials
        ltc.wait_device_ops()
        ltc.metrics.reset()
        for _ in range(args.steps):
            steps[DEV]()
        ltc.wait_device_ops()
        fallbacks = ltc.metrics.counter_value("EagerFallback")
        top = (ltc.metrics.counter_value("TierUpRun") or 0) / args.steps
        trips = ltc.metrics.host_round_trips()
        res = Runner(name, "ms/step", False, counter=lambda n: None).run(
            ["cpu", DEV], lambda dev: (None, lambda: time_steps(steps[dev], args.steps,
                                                                  ltc.wait_device_ops) * 1e3),
            args.rounds)
        eager, lazy = res["cpu"].median, res[DEV].median
        why = ", ".join(f"{k} {v:g}" for k, v in sorted(trips.items(), key=lambda kv: -kv[1]))
        rows.append(md_row([name, f"{eager:.2f}", f"{lazy:.2f}", f"{lazy / eager:.2f}x", fallbacks,
                            f"{sum(trips.values()):g}", why, f"{top:g}"]))
        log(rows[-1])
    print(md_header(["program", "eager ms/step", "ltc ms/step", "ltc / eager", "fallbacks",
                     "round trips / step", "why", "top-tier runs / step"], "lrrrrrlr"))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
