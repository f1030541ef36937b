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
* `torch.autograd.graph.allow_mutation_on_saved_tensors()` clones a tensor saved for backward
  when its mode sees an in-place op on it; below functionalization it would see `mul` for
  `mul_`, clone nothing, and backward would read the mutated value (a wrong gradient, no
  error).  The in-place entry points (`inplace.py`) call `clone_saved_before_write` first,
  which does what the mode does for the written tensor.  Its aliasing key (`data_ptr`,
  `_version`) cannot tell `ltc` tensors apart (they have no data pointer), so every saved
  tensor at the written tensor's version is cloned: more clones than eager, the same values.
* `make_fx` in its real-tensor mode (and `torch.func.linearize`, built on it) records the ops
  of the tensors it was given; an `ltc` program's ops reach its mode on the inner tensors of
  those (below functionalization), which it does not know, so it baked every result into the
  graph as a constant: a wrong graph, no error.  Its mode now refuses `ltc` tensors with an
  error naming what works (`torch.compile(backend="ltc")`, `torch.export`, make_fx on host
  tensors).  Fake and symbolic tracing never reach it with `ltc` tensors.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch._functorch.eager_transforms as eager_transforms
import torch.func
import torch.utils.checkpoint as checkpoint
from torch.fx.experimental import proxy_tensor
from torch.utils._pytree import tree_leaves

from ..tensor.lazy_tensor import LtcTensor

_patched = False


def clone_saved_before_write(t: torch.Tensor) -> None:
    """Before an in-place write to the `ltc` tensor `t` under `allow_mutation_on_saved_tensors`,
    clone the saved tensors it may alias, as the context's mode does on eager tensors."""
    for mode in torch.utils._python_dispatch._get_current_dispatch_mode_stack():
        if not isinstance(mode, torch.autograd.graph._CloneArgBeforeMutateMode):
            continue
        ctx = mode.ctx
        for tid in tuple(ctx.sid_to_tid.get(torch.autograd.graph._get_sid(t), ())):
            handle = ctx.tid_to_weakhandle.get(tid)
            if handle is None or handle in ctx.cloned or handle not in ctx.original:
                continue
            ctx.cloned[handle] = ctx.original[handle].clone()
            del ctx.original[handle]


def _refuse_real_tracing_of_ltc() -> None:
    proxy_mode = proxy_tensor.ProxyTorchDispatchMode
    original = proxy_mode.__torch_dispatch__

    def __torch_dispatch__(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if LtcTensor in types:
            raise RuntimeError(
                "ltc_async: make_fx (and torch.func.linearize, which uses it) cannot trace ltc "
                "tensors: their ops reach it functionalized, on tensors it does not track, and the "
                "graph would hold constants.  Capture with torch.compile(fn, backend=\"ltc\") or "
                "torch.export, or trace on host tensors and run the graph on ltc ones")
        return original(self, func, types, args, kwargs)
    proxy_mode.__torch_dispatch__ = __torch_dispatch__


def patch() -> None:
    global _patched
    if _patched:
        return
    _refuse_real_tracing_of_ltc()
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
