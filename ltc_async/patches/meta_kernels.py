"""Meta kernels PyTorch lacks, for ops whose output shape does not depend on values.

Shape inference (`tensor/shapes.py`) runs each op on `meta` tensors; an op without a meta kernel
takes the eager fallback, a host round trip, although its output size is known from its inputs.
Registered here, once at import, for aten's `Meta` key (what a fake impl would say):

* `_ctc_loss_backward`: the gradient of `log_probs`, its shape and dtype (eager's CPU and CUDA
  kernels allocate it contiguous, like `log_probs`).
* `_sample_dirichlet`, `_dirichlet_grad`, `_standard_gamma_grad`: Dirichlet sampling and the
  reparameterized gradients of Gamma, Beta and Dirichlet samples (`rsample`, pyro's and VAEs'
  latent variables): elementwise, a contiguous result shaped and typed as their first input.
* `linalg_pinv.atol_rtol_tensor` (every `torch.linalg.pinv` call ends there): `(..., n, m)`
  for an `(..., m, n)` input, its dtype.
* `_standard_gamma` (Gamma, Beta and Dirichlet sampling) and `_transformer_encoder_layer_fwd`
  (`nn.TransformerEncoderLayer`'s fast path in eval, which PyTorch takes for PrivateUse1
  devices): PyTorch has their meta kernels from 2.13 (`torch.empty_like` of the first input);
  before it, they took the eager fallback (seen with torch 2.11, a GPU machine's).
"""
from __future__ import annotations

from typing import Any

import torch

_lib: torch.library.Library | None = None


def _ctc_loss_backward(grad: Any, log_probs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty(log_probs.shape, dtype=log_probs.dtype, device=log_probs.device)


def _like_first(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _empty_like(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty_like(x)


def _pinv(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if x.dim() < 2:
        raise RuntimeError("linalg.pinv(A): The input tensor A must have at least 2 dimensions.")
    return torch.empty((*x.shape[:-2], x.shape[-1], x.shape[-2]), dtype=x.dtype, device=x.device)


def register() -> None:
    """Install the kernels (once; at `import ltc_async`)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, kernel in (("_ctc_loss_backward", _ctc_loss_backward), ("_sample_dirichlet", _like_first),
                         ("_dirichlet_grad", _like_first), ("_standard_gamma_grad", _like_first),
                         ("linalg_pinv.atol_rtol_tensor", _pinv), ("_standard_gamma", _empty_like),
                         ("_transformer_encoder_layer_fwd", _empty_like)):
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
            lib.impl(op, kernel, "Meta")
    _lib = lib
