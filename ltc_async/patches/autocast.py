"""`torch.autocast("ltc", dtype=torch.bfloat16)`: CPU's autocast policy on lazy devices.

PyTorch registers autocast kernels for CPU, CUDA and a few others, but none for the
`AutocastPrivateUse1` dispatch key our device uses, so with autocast on every op failed.  Here:
a fallthrough for all ops (nothing to do for most), and for the ops of CPU's policy (the lists
in PyTorch's autocast documentation) a kernel that casts the eligible inputs, floating-point
tensors on the lazy device other than float64 (as ATen's `is_eligible`), then calls the op below
autocast:

* lower precision: matmuls, convolutions, linear, attention, run in the autocast dtype;
* float32: losses, reductions and linear algebra that need the range, run in float32;
* promote: `cat`, `stack`, `index_copy` run in the widest floating type of their inputs.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

_KEY = torch._C.DispatchKey.AutocastPrivateUse1

LOWER_PRECISION = (
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "addbmm",
    "linear", "_convolution", "matmul", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "prelu", "scaled_dot_product_attention", "_native_multi_head_attention")
FLOAT32 = (
    "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "quantile",
    "nanquantile", "stft", "cdist", "trace", "view_as_complex", "cholesky", "cholesky_inverse",
    "cholesky_solve", "inverse", "lu_solve", "orgqr", "ormqr", "pinverse", "max_pool3d",
    "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "reflection_pad1d", "reflection_pad2d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "mse_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "poisson_nll_loss",
    "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss", "margin_ranking_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "ctc_loss", "kl_div",
    "multilabel_margin_loss", "binary_cross_entropy_with_logits", "geqrf", "_lu_with_info", "qr",
    "svd", "triangular_solve", "fractional_max_pool2d", "fractional_max_pool3d",
    "adaptive_max_pool3d", "multilabel_margin_loss_forward", "linalg_qr", "linalg_cholesky_ex",
    "linalg_svd", "linalg_eig", "linalg_eigh", "linalg_lstsq", "linalg_inv_ex")
PROMOTE = ("stack", "cat", "index_copy")

_libs: list = []


def _eligible(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.device.type == "ltc" and t.is_floating_point()
            and t.dtype is not torch.float64)


def _cast_to(dtype: torch.dtype, args: Any) -> Any:
    return tree_map(lambda t: t.to(dtype) if _eligible(t) and t.dtype != dtype else t, args)


def _widest(args: Any) -> torch.dtype | None:
    found: list[torch.dtype] = []
    tree_map(lambda t: found.append(t.dtype) if _eligible(t) else None, args)
    widest = None
    for d in found:
        widest = d if widest is None else torch.promote_types(widest, d)
    return widest


def _kernel(op: Any, policy: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
            if policy == "lower":
                dtype = torch.get_autocast_dtype("ltc")
            elif policy == "float32":
                dtype = torch.float32
            else:
                dtype = _widest((args, kwargs))
            if dtype is not None:
                args, kwargs = _cast_to(dtype, (args, kwargs))
            return op(*args, **kwargs)
    return kernel


def register() -> None:
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    ops = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER_PRECISION, "lower"), (FLOAT32, "float32"), (PROMOTE, "promote")):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                qual = name if overload == "default" else f"{name}.{overload}"
                try:
                    ops.impl(qual, _kernel(op, policy), "AutocastPrivateUse1")
                except RuntimeError:   # an overload that cannot take a Python kernel here
                    continue
    _libs.extend((lib, ops))
