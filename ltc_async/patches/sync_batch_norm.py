"""`nn.SyncBatchNorm` on `ltc` devices: its five CUDA-only kernels as ordinary ops.

SyncBatchNorm's autograd function computes per-process statistics (`batch_norm_stats`),
all-gathers them, combines them weighted by each process's count
(`batch_norm_gather_stats_with_counts`, which also updates the running stats in place, although
its schema does not say so), normalizes (`batch_norm_elemt`), and in backward reduces and
all-reduces the gradient sums (`batch_norm_backward_reduce`, `batch_norm_backward_elemt`).
PyTorch has them for CUDA only (eager CPU refuses SyncBatchNorm); on `ltc` they reached the
eager fallback and failed with a dispatcher error.  Here each is a Functionalize kernel that,
for `ltc` tensors, computes the same values from ordinary ops on the functional tensors --
so the hidden running-stat update is an ordinary in-place write, reaching views and aliases --
with the CUDA kernels' formulas (statistics in float32 for half-precision inputs, the unbiased
variance for the running variance).  Other tensors take functionalization's fallback.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

_libs: list = []


def _ltc(*values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "ltc" for v in values)


def _reduced(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _per_channel(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _stats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    xf = _acc(x)
    mean = xf.mean(_reduced(x))
    var = xf.var(_reduced(x), correction=0)
    return mean, (var + eps).rsqrt()


def _gather_stats(x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor, running_mean: Any,
                  running_var: Any, momentum: float, eps: float,
                  counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = counts.to(mean.dtype)[:, None]
    n = c.sum()
    avg = (mean * c).sum(0) / n
    squares = ((invstd.pow(-2) - eps) * c + (mean - avg).square() * c).sum(0)
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_((avg * momentum).to(running_mean.dtype))
    if running_var is not None:
        running_var.mul_(1 - momentum).add_((squares / (n - 1) * momentum).to(running_var.dtype))
    return avg, (squares / n + eps).rsqrt()


def _elemt(x: torch.Tensor, weight: Any, bias: Any, mean: torch.Tensor, invstd: torch.Tensor,
           eps: float) -> torch.Tensor:
    shape = _per_channel(x)
    out = (_acc(x) - mean.view(shape)) * invstd.view(shape)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    return out.to(x.dtype)


def _backward_reduce(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                     weight: Any, input_g: bool, weight_g: bool, bias_g: bool) -> tuple:
    shape = _per_channel(x)
    dyf = _acc(dy)
    sum_dy = dyf.sum(_reduced(x))
    sum_dy_xmu = (dyf * (_acc(x) - mean.view(shape))).sum(_reduced(x))
    grad_weight, grad_bias = sum_dy_xmu * invstd, sum_dy
    if weight is not None:
        grad_weight, grad_bias = grad_weight.to(weight.dtype), grad_bias.to(weight.dtype)
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def _backward_elemt(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                    weight: Any, sum_dy: torch.Tensor, sum_dy_xmu: torch.Tensor,
                    count: torch.Tensor) -> torch.Tensor:
    shape = _per_channel(x)
    n = count.to(mean.dtype).sum()
    scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
    grad = (_acc(dy) - (sum_dy / n).view(shape)
            - (_acc(x) - mean.view(shape)) * (invstd.square() * sum_dy_xmu / n).view(shape))
    return (grad * scale.view(shape)).to(dy.dtype)


_KERNELS: dict[str, Callable[..., Any]] = {
    "batch_norm_stats": _stats,
    "batch_norm_gather_stats_with_counts": _gather_stats,
    "batch_norm_elemt": _elemt,
    "batch_norm_backward_reduce": _backward_reduce,
    "batch_norm_backward_elemt": _backward_elemt,
}


def _kernel(name: str, compute: Callable[..., Any]) -> Callable[..., Any]:
    fallback = torch.library.get_kernel(f"aten::{name}", "Functionalize")

    def kernel(ks: Any, *args: Any) -> Any:
        if _ltc(*args):
            return compute(*args)
        return fallback.call_boxed(ks, *args)
    return kernel


def register() -> None:
    if _libs:
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "Overriding a previously registered kernel": meant
        for name, compute in _KERNELS.items():
            lib.m.impl(name, "Functionalize", _kernel(name, compute), True)
    _libs.append(lib)
