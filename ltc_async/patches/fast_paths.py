"""Module fast paths built on nested tensors, on `ltc` devices: the same math, dense.

`nn.TransformerEncoder` in eval with a `src_key_padding_mask` takes PyTorch's "sparsity fast
path" (enabled for PrivateUse1 devices): it packs the valid tokens into a nested tensor
(`torch._nested_tensor_from_mask`), runs the layers on it and unpacks with
`to_padded_tensor(0.0)`.  Nested tensors have no lazy form, so on `ltc` the same result is
computed densely, on the device: the layers run on the padded batch with the padding mask
(attention then ignores padded keys exactly as the packed batch has none; everything else is
per token), and padded positions are set to the 0.0 that `to_padded_tensor` gives them, before
the final norm as in eager.  Whether the fast path applies stays PyTorch's decision: the
packing call raises a private signal for `ltc` inputs, which the patched `forward` catches
(nothing has been computed by then but PyTorch's checks).

Every other way to a nested tensor on `ltc` -- `torch.nested.nested_tensor(..., device="ltc")`,
nested tensors of `ltc` tensors, a jagged one moved with `.to("ltc")` -- raises one clear
error at the user's call.  Unguarded, the strided layout built a `NestedTensorImpl` over a lazy
tensor that has no memory (a segmentation fault at its first op, or an INTERNAL ASSERT), and the
jagged one (a Python subclass over a values tensor) ran simple ops but aborted the process in
others.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules import transformer


class _Dense(RuntimeError):
    """Raised by the nested-tensor packing for `ltc` inputs: `nn.TransformerEncoder` runs the
    dense equivalent; anyone else calling the packing gets a clear error."""

    def __init__(self) -> None:
        super().__init__("nested tensors have no lazy form: torch._nested_tensor_from_mask is not "
                         "supported on ltc devices (nn.TransformerEncoder computes its fast path densely)")


def _dense_encoder(self: torch.nn.TransformerEncoder, src: torch.Tensor, mask: Any,
                   src_key_padding_mask: Any, is_causal: Any) -> torch.Tensor:
    """What the sparsity fast path returns, computed on the padded batch."""
    padding = F._canonical_mask(mask=src_key_padding_mask, mask_name="src_key_padding_mask",
                                other_type=F._none_or_dtype(mask), other_name="mask",
                                target_type=src.dtype)
    mask = F._canonical_mask(mask=mask, mask_name="mask", other_type=None, other_name="",
                             target_type=src.dtype, check_other=False)
    first = self.layers[0]
    is_causal = transformer._detect_is_causal_mask(
        mask, is_causal, transformer._get_seq_len(src, first.self_attn.batch_first))
    output = src
    for mod in self.layers:
        output = mod(output, src_mask=mask, is_causal=is_causal, src_key_padding_mask=padding)
    # the fast path packs the tokens where `padding.logical_not()`; to_padded_tensor(0.0)
    output = output.masked_fill(padding.ne(0).unsqueeze(-1), 0.0)
    if self.norm is not None:
        output = self.norm(output)
    return output


def _refuse(what: str) -> RuntimeError:
    return RuntimeError(
        f"ltc_async: nested tensors have no lazy form: {what} on an ltc device is not supported; "
        f"pad the sequences (torch.nn.utils.rnn.pad_sequence, or torch.nested.to_padded_tensor "
        f"on the host) and keep a mask")


def _on_ltc(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        values = getattr(v, "_values", None) if v.is_nested else None   # a jagged tensor's data
        return v.device.type == "ltc" or (isinstance(values, torch.Tensor) and values.device.type == "ltc")
    if isinstance(v, (list, tuple)):
        return any(_on_ltc(e) for e in v)
    if isinstance(v, (str, torch.device)):
        return torch.device(v).type == "ltc"
    return False


def _guard_constructor(module: Any, name: str) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _on_ltc(args) or _on_ltc(tuple(kwargs.values())):
            raise _refuse(f"torch.nested.{name}")
        return original(*args, **kwargs)
    setattr(module, name, guarded)


def _guard_jagged_dispatch() -> None:
    """A jagged nested tensor runs its ops in `NestedTensor.__torch_dispatch__`: refuse those on
    `ltc` values or moving them to `ltc` (`.to("ltc")`, `_to_copy(device=ltc)`)."""
    from torch.nested._internal.nested_tensor import NestedTensor
    original = NestedTensor.__torch_dispatch__.__func__

    def __torch_dispatch__(cls: Any, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if _on_ltc(args) or (kwargs and _on_ltc(tuple(kwargs.values()))):
            raise _refuse(f"{func} on a nested tensor")
        return original(cls, func, types, args, kwargs)
    NestedTensor.__torch_dispatch__ = classmethod(__torch_dispatch__)


def patch() -> None:
    """Install the dense path for `ltc` inputs (once, from `registration`), and the guards."""
    for name in ("nested_tensor", "as_nested_tensor", "nested_tensor_from_jagged", "narrow",
                 "masked_select"):
        if hasattr(torch.nested, name):
            _guard_constructor(torch.nested, name)
    _guard_jagged_dispatch()
    pack = torch._nested_tensor_from_mask
    forward = torch.nn.TransformerEncoder.forward

    def _nested_tensor_from_mask(t: torch.Tensor, mask: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if t.device.type == "ltc":
            raise _Dense
        return pack(t, mask, *args, **kwargs)

    def encoder_forward(self: torch.nn.TransformerEncoder, src: torch.Tensor, mask: Any = None,
                        src_key_padding_mask: Any = None, is_causal: Any = None) -> torch.Tensor:
        try:
            return forward(self, src, mask, src_key_padding_mask, is_causal)
        except _Dense:
            return _dense_encoder(self, src, mask, src_key_padding_mask, is_causal)
    encoder_forward.__doc__ = forward.__doc__
    torch._nested_tensor_from_mask = _nested_tensor_from_mask
    torch.nn.TransformerEncoder.forward = encoder_forward
