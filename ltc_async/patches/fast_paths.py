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
"""
from __future__ import annotations

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


def patch() -> None:
    """Install the dense path for `ltc` inputs (once, from `registration`)."""
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
