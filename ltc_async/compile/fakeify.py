"""Dynamo fake-ifies `ltc` tensors the way it fake-ifies XLA's and LTC's own lazy tensors.

An `ltc` tensor, as users hold it, is a functional wrapper (`FunctionalTensorWrapper`) around
an `LtcTensor`.  PyTorch's `MetaTensorDescriber` describes any functional tensor on a device
other than `xla` / `lazy` as "functional": its fake copy is a new functional wrapper whose
autograd metadata is copied with `torch._mirror_autograd_meta_to`, and that copy gives a leaf
that requires grad (a module's parameter) a grad_fn, so `meta_utils.assert_metadata_eq` fails
(`is_leaf True != False`) and `torch.compile` of a module with parameters on `ltc` raised.

XLA and LTC tensors are functional wrappers too, and PyTorch special-cases their device types
(`meta_utils.py`: `t.device.type not in ("xla", "lazy")`): they are described as plain dense
tensors of their device, fake-ified as a `FakeTensor` on that device with the same
`requires_grad` / leaf-ness, and views are rebuilt from their fake base.  `ltc` gets the same
treatment: the describer asks `torch._is_functional_tensor(t)` (its only use in
`meta_utils`), and `install()` gives `meta_utils` a `torch` whose answer is False for `ltc`
tensors.  (Rewriting the description after the fact is not enough: the describer raises
"Cannot safely fakify a view" for a functional view before returning -- a static KV cache's
layers are views of one buffer.)

Second, `FakeTensorMode.avoid_device_init`: a fake trace may materialize real tensors on a
device it believes is available, and a registered PrivateUse1 backend counts as available.
`torch.tensor([], device="ltc:0")` inside a compiled region (transformers' `DynamicCache`
does this) then built a real lazy tensor in the middle of the fake trace, which failed at the
next op mixing it with fake tensors.  With `avoid_device_init` true, as on a machine without
CUDA, `torch.tensor` builds on the CPU and moves the fake, and device moves are not
constant-folded: `install()` makes it true whenever `ltc_async` is imported.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import meta_utils
from torch._subclasses.fake_tensor import FakeTensorMode

_installed = False


class _TorchForDescriber:
    """`torch`, as `meta_utils` sees it: `ltc` tensors are not functional tensors there."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def _is_functional_tensor(t: Any) -> bool:
        return t.device.type != "ltc" and torch._is_functional_tensor(t)


def install() -> None:
    """Describe `ltc` functional tensors as dense tensors of their device (idempotent)."""
    global _installed
    if _installed:
        return
    meta_utils.torch = _TorchForDescriber()   # type: ignore[assignment]
    FakeTensorMode.avoid_device_init = property(lambda self: True)  # type: ignore[method-assign]
    _installed = True
