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
`requires_grad` / leaf-ness, and views are rebuilt from their fake base.  `install()` wraps
`describe_tensor` so `ltc` gets that same treatment.

Second, `FakeTensorMode.avoid_device_init`: a fake trace may materialize real tensors on a
device it believes is available, and a registered PrivateUse1 backend counts as available.
`torch.tensor([], device="ltc:0")` inside a compiled region (transformers' `DynamicCache`
does this) then built a real lazy tensor in the middle of the fake trace, which failed at the
next op mixing it with fake tensors.  With `avoid_device_init` true, as on a machine without
CUDA, `torch.tensor` builds on the CPU and moves the fake, and device moves are not
constant-folded: `install()` makes it true whenever `ltc_async` is imported.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from torch._subclasses import meta_utils
from torch._subclasses.fake_tensor import FakeTensorMode

_installed = False


def install() -> None:
    """Describe `ltc` functional tensors as dense tensors of their device (idempotent)."""
    global _installed
    if _installed:
        return
    original = meta_utils.MetaTensorDescriber.describe_tensor

    def describe_tensor(self: Any, t: Any, *, recurse: bool = True, trace: bool = False) -> Any:
        desc = original(self, t, recurse=recurse, trace=trace)
        if desc.is_functional and desc.device.type == "ltc":
            desc = dataclasses.replace(desc, is_functional=False, unwrapped=None,
                                       autograd_meta_from=None)
        return desc

    meta_utils.MetaTensorDescriber.describe_tensor = describe_tensor
    FakeTensorMode.avoid_device_init = property(lambda self: True)  # type: ignore[method-assign]
    _installed = True
