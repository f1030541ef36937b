"""Writing a new value into a user's `ltc` tensor: the one functional write-back rule.

Design note.  A user's `ltc` tensor is a functional wrapper around an immutable `LtcTensor`;
"writing" it means making it name a new lazy value, seen through every alias, with its autograd
version counter bumped, as functionalization's own in-place kernels do.  Every writer that works
below functionalization goes through `write`: the fused `_foreach_*_` decompositions, the input
mutations of a `torch.compile` graph (`compile/capture.py`), queued collectives
(`patches/collectives.py`), and `module.to("ltc")` making parameters own their storage
(`patches/modules.py`).

The rule, per target:

* a plain `LtcTensor` (no wrapper: the compile path's own arguments) is rebound to the value;
* a wrapper that is a *view no other tensor shares* (its storage's use count is 1, plus the
  probe) and whose new value has its layout takes a fresh storage holding that value
  (functionalization's `set_`, which bumps the version): it is then a base, whose later reads
  and writes replay no view chain, at generation 0, where views taken from it start up to date
  (a view of a storage that has seen an update is out of date when made, and functionalization
  replays it on its first use: a `weight.t()` per `Linear` per token of inference, if the
  parameters had taken their values as updates).  Every `nn.Parameter` is such a view (it
  detaches its data), so without this an optimizer step would cost one view replay per
  parameter.  A *parameter* (a leaf requiring grad) that is a base no other tensor shares --
  after its first step -- takes a fresh storage the same way by `t.data = value`, which keeps its
  autograd identity (`set_` would detach it from the `AccumulateGrad` nodes of a live autograd
  graph, and `swap_tensors`, which `module.cpu()` uses to keep parameter objects, would then
  refuse it): without it, every optimizer step left each parameter's storage updated, and every
  view of it -- each `weight.t()` of each forward and backward -- was replayed on first use
  (torchdiffeq's neural ODE: 238 of its 1989 ops a step);
* every other wrapper takes the value as an update of its storage (`replace` + `commit_update`)
  and is synced, so every alias sees it;
* version counters are bumped where `set_` did not, unless the caller's dispatcher path bumps
  them already (`bump=False`: ops whose schema marks the write, seen by ADInplaceOrView).

The use count is read on the writing thread: another thread taking a view of the same tensor at
that moment races with the write itself, as it would in eager code.  No locks: the written
tensors belong to the calling thread's program.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .lazy_tensor import LtcTensor

__all__ = ["write", "update", "own_storage"]

_is_functional = torch._is_functional_tensor
_is_base = torch._is_functional_tensor_base
_from_functional = torch._from_functional_tensor
_wrap = torch._to_functional_tensor
_fsync = torch._functionalize_sync
_replace = torch._functionalize_replace
_commit = torch._functionalize_commit_update
_increment_version = torch._C._increment_version   # takes a list of tensors
_use_count = torch._C._storage_Use_Count
_set = torch.ops.aten.set_.source_Tensor


def _unshared_view(t: torch.Tensor) -> bool:
    return not _is_base(t) and _use_count(t.untyped_storage()._cdata) == 2


def _unshared_base(t: torch.Tensor) -> bool:
    return _is_base(t) and _use_count(t.untyped_storage()._cdata) == 2


def write(targets: Sequence[Any], values: Sequence[LtcTensor], bump: bool = True,
          layouts: Sequence[Any] | None = None) -> None:
    """Each target takes the lazy value `values[i]` (see the module note).  `layouts[i]`, when
    given, is the target's current inner meta (the caller has it already); otherwise the
    wrapper's shape and strides are compared with the value's."""
    to_bump = []
    for k, (t, v) in enumerate(zip(targets, values)):
        if type(t) is LtcTensor:
            t._ctx.rebind(t, v._v)
            to_bump.append(t)
            continue
        m = v._m
        same_layout = (layouts[k] == m if layouts is not None else
                       t.dtype == m.dtype and tuple(t.shape) == m.shape and t.stride() == m.stride)
        if same_layout and _unshared_view(t):
            _set(t, _wrap(v))   # a fresh storage holding `v`, at generation 0: nothing to update
            continue
        if same_layout and t.requires_grad and t.is_leaf and _unshared_base(t):
            # a parameter no view shares: a fresh storage too, by `.data`, which keeps the
            # tensor's autograd identity (its AccumulateGrad, hooks, `.grad`); optimizer states,
            # whose views nobody takes, keep the cheaper update (`.data` costs ~5 us more)
            t.data = _wrap(v)
            to_bump.append(t)
            continue
        to_bump.append(t)
        update(t, v)
    if bump and to_bump:
        _increment_version(to_bump)


def update(t: torch.Tensor, v: LtcTensor) -> None:
    """The wrapper `t` takes `v` as an update of its storage, seen through every alias: what
    functionalization's in-place kernels do after the functional op (its version counter is
    the caller's; `patches/seam.py` calls this for repeated in-place calls)."""
    _replace(t, v)
    _commit(t)
    _fsync(t)


def own_storage(t: torch.Tensor) -> None:
    """Make the `ltc` view `t` a base of its own storage if no other tensor shares it (its value
    and version counter unchanged): what `module.to("ltc:N")` does for every parameter."""
    if not _is_functional(t) or t.device.type != "ltc" or not _unshared_view(t):
        return
    _fsync(t)
    inner = _from_functional(t)
    if type(inner) is not LtcTensor:
        return
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(t):
        write([t], [inner], bump=False, layouts=[inner._m])
