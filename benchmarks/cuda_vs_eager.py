"""A CUDA-backed ltc device against eager CUDA, for training (a GPU check, not a benchmark).

Eager CUDA's backward cannot run in a process that imported ltc_async (README, Known
limitations), so the model tests compare a CUDA-backed `ltc:0` with eager *CPU*; BatchNorm CNNs
amplify CUDA's last-bit differences over training steps, so a mismatch there does not tell
whether ltc or CUDA moved the weights.  This trains the suite's tiny ResNet / MobileNetV2 (same
configs, batches and optimizer as `tests/models/test_models.py`) once per engine, each in its
own process, and compares the weights:

    python -m benchmarks.cuda_vs_eager --all            # eager-cpu, eager-cuda, ltc (on cuda:0)

`--engine NAME --out FILE` trains one (`ltc` imports ltc_async with LTC_ASYNC_DEVICES=cuda:0);
`--compare A B` prints the largest weight differences between two saved runs.  TF32 is off
everywhere: float32 convolutions in float32.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch

STEPS = 4


def build(case: str) -> torch.nn.Module:
    import transformers
    if case == "resnet":
        cfg = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5)
        return transformers.ResNetForImageClassification(cfg)
    cfg = transformers.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=5,
                                         classifier_dropout_prob=0.0)
    return transformers.MobileNetV2ForImageClassification(cfg)


def train(case: str, engine: str) -> dict:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if engine == "ltc":
        os.environ.setdefault("LTC_ASYNC_DEVICES", "cuda:0")
        import ltc_async as ltc
        device = "ltc:0"
    else:
        ltc, device = None, {"eager-cpu": "cpu", "eager-cuda": "cuda"}[engine]
    g = torch.Generator().manual_seed(1234)
    torch.manual_seed(0)
    model = build(case).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    for _ in range(STEPS):
        batch = {"pixel_values": torch.randn(8, 3, 32, 32, generator=g),
                 "labels": torch.randint(0, 5, (8,), generator=g)}
        opt.zero_grad()
        model(**{k: v.to(device) for k, v in batch.items()}).loss.backward()
        opt.step()
        if ltc is not None:
            ltc.mark_step()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def compare(a: dict, b: dict) -> tuple[float, str]:
    worst, name = 0.0, ""
    for k, v in a.items():
        if v.is_floating_point():
            d = (v - b[k]).abs().max().item() if v.numel() else 0.0
            if d > worst:
                worst, name = d, k
    return worst, name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="mobilenet_v2", choices=["mobilenet_v2", "resnet"])
    p.add_argument("--engine", choices=["eager-cpu", "eager-cuda", "ltc"])
    p.add_argument("--out")
    p.add_argument("--compare", nargs=2)
    p.add_argument("--all", action="store_true")
    args = p.parse_args()
    if args.engine:
        torch.save(train(args.case, args.engine), args.out)
        return 0
    if args.compare:
        a, b = (torch.load(f, weights_only=True) for f in args.compare)
        worst, name = compare(a, b)
        print(f"largest weight difference {worst:.3g} ({name})")
        return 0
    folder = tempfile.mkdtemp()
    runs = {}
    for engine in ("eager-cpu", "eager-cuda", "ltc"):
        out = os.path.join(folder, engine + ".pt")
        r = subprocess.run([sys.executable, "-m", "benchmarks.cuda_vs_eager", "--case", args.case,
                            "--engine", engine, "--out", out], capture_output=True, text=True)
        if r.returncode:
            print(f"{engine}: failed\n{r.stderr[-2000:]}")
            continue
        runs[engine] = torch.load(out, weights_only=True)
    for a, b in (("eager-cuda", "eager-cpu"), ("ltc", "eager-cuda"), ("ltc", "eager-cpu")):
        if a in runs and b in runs:
            worst, name = compare(runs[a], runs[b])
            print(f"{args.case}: {a} vs {b}: largest weight difference {worst:.3g} ({name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
