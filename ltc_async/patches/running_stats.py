"""Batch norm's running statistics written through their views and aliases.

`native_batch_norm` (where `F.batch_norm` lands for `ltc` tensors) updates `running_mean` and
`running_var` in place in training, although its schema does not say so; functionalization,
which only sees the schema, passes the inner tensors down, and the op path could only re-point
those inner tensors at the new values (`tensor/special.py`).  That missed every other tensor
sharing their memory: running stats that are views (`rm[0]` of a stacked buffer) and buffers
aliased by `load_state_dict(..., assign=True)` from another module's state_dict -- eager
updates all of them.  So with `ltc` running stats in training, the Functionalize kernel of
`native_batch_norm` calls `_native_batch_norm_legit` instead: the same computation and outputs,
with a schema that says it writes the running stats, so functionalization writes them as it
writes any in-place op's argument, through their views and aliases.  Every other call takes
functionalization's fallback, as before.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

_legit = torch.ops.aten._native_batch_norm_legit.default
_is_functional = torch._is_functional_tensor
_libs: list = []


def _ltc_functional(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "ltc" and _is_functional(t)


def register() -> None:
    if _libs:
        return
    fallback = torch.library.get_kernel("aten::native_batch_norm", "Functionalize")

    def kernel(ks: Any, input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
               training: bool, momentum: float, eps: float) -> Any:
        if training and _ltc_functional(running_mean) and _ltc_functional(running_var) and all(
                t is None or _ltc_functional(t) for t in (input, weight, bias)):   # a mix: eager's error
            return _legit(input, weight, bias, running_mean, running_var, training, momentum, eps)
        return fallback.call_boxed(ks, input, weight, bias, running_mean, running_var, training, momentum, eps)

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "Overriding a previously registered kernel": meant
        lib.m.impl("native_batch_norm", "Functionalize", kernel, True)
    _libs.append(lib)
