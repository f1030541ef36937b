"""The benchmarks' shared workloads: the MLP and its training step, the elementwise chain, and
the real-workload suite's model cases (`tests/models/test_models.py`, imported as the module
`tests.models.test_models`: run the benchmarks from the repository root)."""
from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from benchmarks.engines import Engine


def mlp(widths: list[int]) -> nn.Sequential:
    """Linear layers of these widths with a ReLU between each two."""
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def sgd(params: Any, lr: float = 0.01) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


class MLPStep:
    """bench_lazy's training step on one engine: `mlp(widths)` (seed 0) on the engine's device,
    one fixed batch of `batch` inputs and class targets, cross entropy, `sgd`; the model as the
    engine runs it (`Engine.compile`).  `trace()` is zero_grad, forward, backward, `opt.step()`;
    calling the step also cuts it (`mark_step`).  Both return the loss."""

    def __init__(self, widths: list[int], batch: int, eng: Engine):
        torch.manual_seed(0)
        model = mlp(widths)
        x = torch.randn(batch, widths[0])
        t = torch.randint(0, widths[-1], (batch,))
        self.model = model.to(eng.device)
        self.forward = eng.compile(self.model)
        self.opt = sgd(self.model.parameters())
        self.loss_fn = nn.CrossEntropyLoss()
        self.x, self.t = x.to(eng.device), t.to(eng.device)
        self.mark_step = eng.mark_step
        eng.sync()

    def trace(self) -> torch.Tensor:
        self.opt.zero_grad()
        loss = self.loss_fn(self.forward(self.x), self.t)
        loss.backward()
        self.opt.step()
        return loss

    def __call__(self) -> torch.Tensor:
        loss = self.trace()
        self.mark_step()
        return loss


def chain(x: torch.Tensor, y: torch.Tensor, n_ops: int) -> tuple[torch.Tensor, float, float]:
    """The trace workload: `n_ops` elementwise ops, alternately `y * 1.0001` and `y + x`.
    Returns the result, the loop's wall seconds and its CPU seconds on this thread."""
    w, c = time.perf_counter(), time.thread_time()
    for _ in range(n_ops // 2):
        y = y * 1.0001
        y = y + x
    return y, time.perf_counter() - w, time.thread_time() - c


def suite_cases(names: list[str] | None = None) -> list[Any]:
    """The real-workload suite's cases (`Case`: build, batch, loss, optimizer, accumulate),
    those named or all, in the suite's order.  Needs pytest and transformers (the test extra)."""
    from tests.models import test_models
    return [c for c in test_models.CASES if not names or c.name in names]


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}
