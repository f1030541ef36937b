"""Tools built on PyTorch's dispatch modes, over `ltc` tensors.

An `ltc` tensor is a functional wrapper (see `tensor/lazy_tensor.py`), so a TorchDispatchMode
(`FlopCounterMode`, selective activation checkpointing, a user's op logger) runs below
functionalization and sees its functional ops: `view_copy` for `view`, `add` for `add_`,
`detach_copy` for `detach`.  Most tools only count or record ops and work unchanged (the kernels
the modes call back into are made to work there: `meta_checks.py`, `registration.py`).  Two
tools assume eager's op names or a tensor that is not functional yet:

* selective activation checkpointing (`torch.utils.checkpoint` with `context_fn=
  create_selective_checkpoint_contexts(...)`) records every op of the forward and expects the
  same ops when it recomputes, except those in `SAC_IGNORED_OPS`: `detach`, because
  checkpointing itself inserts a different number of them in the two runs.  Below
  functionalization those are `detach_copy`, which is ignored alike here.
* `torch.func.functionalize(f)` wraps its inputs in functional wrappers, which PyTorch refuses
  for a tensor that already is one (an INTERNAL ASSERT).  An `ltc` program is functionalized
  already, so over `ltc` inputs it calls `f` itself: the same values, mutations of inputs
  applied to them as functionalize applies them.  (Code that imported `functionalize` before
  `ltc_async` keeps PyTorch's.)
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch._functorch.eager_transforms as eager_transforms
import torch.func
import torch.utils.checkpoint as checkpoint
from torch.utils._pytree import tree_leaves

_patched = False


def patch() -> None:
    global _patched
    if _patched:
        return
    checkpoint.SAC_IGNORED_OPS.add(torch.ops.aten.detach_copy.default)
    original = eager_transforms.functionalize

    @functools.wraps(original)
    def functionalize(func: Callable, *, remove: str = "mutations") -> Callable:
        transformed = original(func, remove=remove)

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            if any(isinstance(t, torch.Tensor) and t.device.type == "ltc" for t in tree_leaves((args, kwargs))):
                return func(*args, **kwargs)
            return transformed(*args, **kwargs)
        return call

    eager_transforms.functionalize = functionalize
    torch.func.functionalize = functionalize
    _patched = True
