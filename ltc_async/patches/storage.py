"""`ltc` tensors have no host storage: `copy.deepcopy` and `torch.save` take PyTorch's own
device path for them.

An `ltc` tensor is a functional wrapper whose "storage" is functionalization's bookkeeping, not
memory the host can read.  PyTorch's `Tensor.__deepcopy__` and `Tensor.__reduce_ex__` already
handle device tensors without storage (XLA's, and PrivateUse1 backends': deepcopy clones on the
device; saving copies to the CPU and rebuilds on the device when loading, or on the CPU with
`map_location="cpu"`), but they ask `torch._C._has_storage`, which says True for the wrapper,
and then read the storage's bytes (a segfault for deepcopy, "invalid python storage" for save).
Answering False for `ltc` tensors sends them down the intended path.
"""
from __future__ import annotations

from typing import Any

import torch


def patch_has_storage() -> None:
    original = torch._C._has_storage

    def _has_storage(t: Any) -> bool:
        if isinstance(t, torch.Tensor) and t.device.type == "ltc":
            return False
        return original(t)
    torch._C._has_storage = _has_storage
