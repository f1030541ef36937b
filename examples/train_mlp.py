"""Train a small classifier on scikit-learn's bundled digits data set on a lazy `ltc` device.

    python examples/train_mlp.py [--epochs 8] [--device ltc:0]

The first steps are checked against the same model trained eagerly on the CPU; the run ends
with the metrics summary (compiles, cache hits, execution time).
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
from sklearn.datasets import load_digits
from tqdm import tqdm

import ltc_async as ltc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="ltc:0")
    ap.add_argument("--check-steps", type=int, default=5, help="steps compared against eager")
    args = ap.parse_args()

    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(x))
    x, y = x[perm], y[perm]
    n_test = 297
    x_train, y_train, x_test, y_test = x[n_test:], y[n_test:], x[:n_test], y[:n_test]

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    reference = copy.deepcopy(model)              # trained eagerly for the first steps
    model = model.to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    n_batches = len(x_train) // args.batch
    total = args.epochs * n_batches
    step = 0
    losses = []
    t0 = time.perf_counter()
    bar = tqdm(total=total, unit="step", desc="training on " + args.device)
    for epoch in range(args.epochs):
        for b in range(n_batches):
            xb = x_train[b * args.batch:(b + 1) * args.batch]
            yb = y_train[b * args.batch:(b + 1) * args.batch]
            opt.zero_grad()
            loss = loss_fn(model(xb.to(args.device)), yb.to(args.device))
            loss.backward()
            opt.step()
            ltc.mark_step()                          # returns while the device runs the step
            losses.append(loss)
            if step < args.check_steps:
                ref_opt.zero_grad()
                ref_loss = loss_fn(reference(xb), yb)
                ref_loss.backward()
                ref_opt.step()
                torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-4, atol=1e-5)
            step += 1
            bar.update(1)
            if step % 10 == 0:   # a loss from 10 steps ago: that step has run, nothing waits
                bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-10].item():.4f}")
    bar.close()
    ltc.wait_device_ops()
    elapsed = time.perf_counter() - t0
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.device == torch.device(args.device)
    print(f"checked the first {args.check_steps} steps against eager: losses match")

    with torch.no_grad():
        pred = model(x_test.to(args.device)).argmax(dim=1).cpu()
    acc = (pred == y_test).float().mean().item()
    print(f"{total} steps in {elapsed:.2f}s ({elapsed / total * 1e3:.2f} ms/step), "
          f"final loss {losses[-1].item():.4f}, test accuracy {acc:.3f}")
    print("\n== ltc_async metrics ==")
    for name in ("UncachedCompile", "CachedCompile", "MarkStep", "EagerFallback"):
        print(f"{name:16s} {ltc.metrics.counter_value(name) or 0}")
    count, total_s, _ = ltc.metrics.metric_data("ExecuteTime")
    print(f"ExecuteTime      {count} executions, {total_s * 1e3:.1f} ms in total")
    count, total_s, _ = ltc.metrics.metric_data("CompileTime")
    print(f"CompileTime      {count} compiles, {total_s * 1e3:.1f} ms in total")
    if acc < 0.9:
        raise SystemExit(f"accuracy {acc:.3f} is too low: training is broken")


if __name__ == "__main__":
    main()
