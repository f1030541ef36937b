"""A training loop with three classic slowdowns, and the diagnostics that find them.

    python examples/debug_slow_step.py            # the slow loop, diagnosed
    python examples/debug_slow_step.py --fixed    # the same loop with the three fixes

The slow loop

1. prints the loss with `loss.item()` every step: an implicit sync, the host waits for every
   step, so tracing and execution never overlap;
2. counts correct predictions with boolean indexing, `pred[keep]`: a data-dependent shape, so
   its size is read mid-step (a small graph of its own, then a sync);
3. walks a data set whose size is not a multiple of the batch: the last batch of each epoch is
   smaller, a graph of another shape: a recompile.

It runs under the three tools of README's "Debugging a slow step": `ltc.sync_guard("warn")`
points at (1) and (2), `ltc.debug.explain_recompiles(True)` explains (3), and
`ltc.debug.timeline()` shows where each step's time went; `ltc.metrics.report()` ends with the
findings.  `--fixed`: every 10 steps the loss of a step that ran 10 steps ago is read
explicitly (`.cpu()`: nothing waits), the count is a masked sum on the device, the last
partial batch is dropped.  What the tools still report then is the warm-up: the first step's
graph computes the optimizer's buffers and the accumulator that later steps read as inputs.
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

import ltc_async as ltc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixed", action="store_true", help="apply the three fixes")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--trace", default="", help="write the timeline here (Chrome trace JSON)")
    args = ap.parse_args()

    torch.manual_seed(0)
    n, batch, dev = 4000, 256, "ltc:0"                 # 4000 = 15 * 256 + 160: a short last batch
    data = torch.randn(n, 256)
    labels = (data[:, :4].sum(dim=1) > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 2)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    last = n - n % batch if args.fixed else n          # fix 3: drop the partial batch

    ltc.debug.explain_recompiles(True)
    ltc.sync_guard("warn")
    ltc.metrics.reset()
    seen: list[str] = []
    losses: list[torch.Tensor] = []
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, ltc.debug.timeline(args.trace or None) as tl:
        warnings.simplefilter("default")               # each warning once per line
        correct = torch.zeros((), device=dev)          # correct predictions, all epochs
        for epoch in range(args.epochs):
            for i in range(0, last, batch):
                x, y = data[i:i + batch].to(dev), labels[i:i + batch].to(dev)
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                pred = logits.argmax(dim=1)
                keep = y >= 0                              # every sample counts here
                if args.fixed:                             # fix 2: a masked sum, no shape change
                    correct = correct + ((pred == y) & keep).sum()
                else:
                    correct = correct + (pred[keep] == y[keep]).sum()
                ltc.mark_step()
                step = i // batch
                if args.fixed:                             # fix 1: read rarely, a finished step
                    losses.append(loss.detach())
                    if step % 10 == 0 and len(losses) > 10:  # ran 10 steps ago: no wait
                        seen.append(f"epoch {epoch} step {step} loss "
                                    f"{losses[-11].cpu().item():.4f} (10 steps ago)")
                else:
                    seen.append(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            ltc.mark_step()
        ltc.wait_device_ops()
    wall = time.perf_counter() - t0
    ltc.sync_guard("allow")
    ltc.debug.explain_recompiles(False)

    steps = ltc.metrics.counter_value("MarkStep")
    accuracy = correct.cpu().item() / (args.epochs * last)
    print(f"{'fixed' if args.fixed else 'slow'} loop: {steps} mark_steps in {wall:.2f}s, "
          f"training accuracy {accuracy:.3f}, {len(seen)} loss lines, last: {seen[-1]}")
    print(f"\n== warnings ({len(caught)}) ==")
    for w in caught:
        print(f"{w.category.__name__} at line {w.lineno}:\n  {w.message}")
    print("\n== timeline summary (first steps) ==")
    print("\n".join(tl.summary().splitlines()[:6] + tl.summary().splitlines()[-2:]))
    report = ltc.metrics.report()
    print("== metrics.report() findings ==")
    print(report[report.index("Findings"):])


if __name__ == "__main__":
    main()
