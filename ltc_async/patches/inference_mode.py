"""`torch.inference_mode()` in a process that uses `ltc` devices runs as `torch.no_grad()`.

PyTorch's functionalization, which every `ltc` tensor goes through, cannot make a view of a
normal tensor inside inference mode: the view's functional wrapper is created as an inference
tensor and refuses its base's version counter ("Cannot set version_counter for inference
tensor").  `generate()` under `torch.inference_mode()` failed at its first `ids[:, -1]`, and so
did any slice, `view` or `t()` of a tensor made before the block.  PyTorch's own fix for
torch.compile (pytorch/pytorch#181106) leaves inference mode around functionalization, with grad
off; here the whole block does: once the lazy devices exist, `inference_mode(True)` enters
`no_grad` instead.  Results are the same; tensors created inside are not inference tensors
(`is_inference()` is False, and autograd may use them later, as it may no_grad's).  A process
that has not used an `ltc` device keeps PyTorch's inference mode.
"""
from __future__ import annotations

from typing import Any

import torch

from ..executor import arena

_patched = False


def patch() -> None:
    global _patched
    if _patched:
        return
    cls = torch.autograd.grad_mode.inference_mode
    original = cls.__enter__

    def __enter__(self: Any) -> None:
        if self.mode and arena.started():
            self._inference_mode_context = torch.no_grad()   # `__exit__` leaves it as it leaves
            self._inference_mode_context.__enter__()         # PyTorch's guard
            return
        original(self)
    cls.__enter__ = __enter__
    _patched = True
