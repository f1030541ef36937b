"""torch.distributed collectives on views: writes reach the base, as in eager.

Design note.  `c10d::allreduce_` and its friends write their tensor arguments and have no
functional form.  PyTorch's functionalization fallback hands them the unwrapped values and keeps
what they wrote in those values only: a collective on a *view* (`dist.all_reduce(t[2:4])`, a
slice of a flattened gradient bucket) left the view's base unchanged, and every later read of
the base or of another view lost the result.  Eager writes the base's memory.

This module registers a Functionalize kernel for each mutating c10d op that does what
functionalization does for an ordinary in-place op: sync and unwrap the functional tensors, run
the op below functionalization (for `ltc` values that is `host.mutating_host_op`: the
collective runs on host copies and the written lazy tensors take the results), then replace
each written wrapper's value and commit the update, so the base and all its views see it.
"""
from __future__ import annotations

from typing import Any

import torch

from ..ir.schema import op_info

_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
_lib: torch.library.Library | None = None


def _unwrap(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and torch._is_functional_tensor(v):
        torch._sync(v)
        return torch._from_functional_tensor(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(e) for e in v)
    return v


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for e in v for t in _tensors(e)]
    return []


def _kernel(op: torch._ops.OpOverload) -> Any:
    info = op_info(op)
    written = info.written     # c10d ops write their first argument without saying so
    names = info.arg_names

    def functionalized(*args: Any, **kwargs: Any) -> Any:
        inner_args = [_unwrap(a) for a in args]
        inner_kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            out = op(*inner_args, **inner_kwargs)
        # the written wrappers take their (rebound) inner values; the update reaches the base
        by_inner: dict[int, torch.Tensor] = {}
        for i in written:
            if i < len(args):
                outer, inner = args[i], inner_args[i]
            elif names[i] in kwargs:
                outer, inner = kwargs[names[i]], inner_kwargs[names[i]]
            else:
                continue
            for w, v in zip(_tensors(outer), _tensors(inner)):
                if w is not v and torch._is_functional_tensor(w):
                    torch._functionalize_replace(w, v)
                    torch._functionalize_commit_update(w)
                    torch._functionalize_sync(w)
                    by_inner[id(v)] = w

        def back(o: Any) -> Any:    # outputs aliasing written inputs are those inputs
            if isinstance(o, torch.Tensor):
                w = by_inner.get(id(o))
                return w if w is not None else (torch._to_functional_tensor(o) if o.device.type == "ltc" else o)
            if isinstance(o, list):
                return [back(e) for e in o]
            if isinstance(o, tuple):
                return tuple(back(e) for e in o)
            return o
        return back(out)
    return functionalized


def register() -> None:
    """Install the kernels (once; at `import ltc_async`)."""
    global _lib
    if _lib is not None:
        return
    try:
        import torch.distributed  # noqa: F401 - registers the c10d ops
    except ImportError:
        return
    lib = torch.library.Library("c10d", "IMPL")
    for qualname in torch._C._dispatch_get_all_op_names():
        ns, _, name = qualname.partition("::")
        if ns != "c10d" or not name.endswith("_"):
            continue
        packet = getattr(torch.ops.c10d, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op_info(op).written:
                lib.impl(op, _kernel(op), "Functionalize")
    _lib = lib
