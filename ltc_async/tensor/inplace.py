"""In-place writes through views whose elements alias each other: eager's semantics, on the host.

Design note.  Functionalization turns `v.op_()` on a view `v` into `op` on `v`'s value plus a
scatter of the result back into the base through the inverse of each view in `v`'s chain.  That
is exact when the elements of `v` are distinct elements of the base.  When several elements of
`v` alias one element (`x.expand(2, 4)`, an overlapping `as_strided` or `unfold`), eager writes
them in turn to the same memory (or rejects the op: "more than one element of the written-to
tensor refers to a single memory location"), while the inverses give other values (`expand`'s
sums the changes of all aliases).  Such writes therefore run here instead:

1. the written tensor's view chain is replayed as real views on a host copy of its base
   (functionalization's own `ViewMeta`s, switched to reapply views), so the aliasing is eager's;
2. the op runs there eagerly: eager's values, eager's errors, raised at the user's line;
3. the base takes the host result (a copy, so every other view of it sees the write).

Writes through an `as_strided` view of a view, which functionalization refuses (its inverse is
not compositional), take the same path.

Detection is by strides (`aliasing`), cheap enough to run on every in-place call on an ltc view;
the patched entry points are the in-place Tensor methods, their `torch.*_` twins, augmented
assignment and `__setitem__`.  Autograd through such writes is not supported: it raises.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

_F = torch._C._functionalization
_is_functional = torch._is_functional_tensor
_AUGMENTED = ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
              "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__")


def aliasing(t: torch.Tensor) -> bool:
    """May two elements of the view `t` share memory?  (Exact for zero strides, conservative
    for the rest: dims sorted by stride must each step past everything the smaller ones reach.)"""
    overlap = torch._debug_has_internal_overlap(t)
    if overlap != 2:  # 0: no, 1: yes (a zero stride), 2: too hard for PyTorch's quick check
        return overlap == 1
    reach = 0
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _needs_host(t: Any) -> bool:
    return (type(t) is torch.Tensor and _is_functional(t) and t._is_view() and t.device.type == "ltc"
            and aliasing(t))


def _to_host(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.device.type == "ltc":
        return v.detach().cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_host(e) for e in v)
    return v


def _any_requires_grad(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.requires_grad
    if isinstance(v, (list, tuple)):
        return any(_any_requires_grad(e) for e in v)
    return False


def write_on_host(view: torch.Tensor, write: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """`write(view, *args, **kwargs)` with eager's aliasing (see the module docstring)."""
    if torch.is_grad_enabled() and (view.requires_grad or _any_requires_grad(args)
                                    or _any_requires_grad(list(kwargs.values()))):
        raise RuntimeError("ltc_async: an in-place write through a view whose elements share memory "
                           "(expand, overlapping as_strided/unfold) cannot be recorded for autograd on "
                           "ltc devices; write through .clone() or under torch.no_grad()")
    base = view._base
    host_base = base.detach().cpu()  # eager's layout (see special._to_copy)
    chain = [_as_view(m) for m in _F.get_view_meta_sequence(view)]
    host_view = _F.apply_view_meta_sequence(host_base, chain)
    write(host_view, *_to_host(args), **{k: _to_host(v) for k, v in kwargs.items()})
    with torch.no_grad():
        base.copy_(host_base)


def _as_view(meta: Any) -> Any:
    """The same `ViewMeta` with reapply_views on (its state's 2nd field): it then makes a
    real view where functionalization made a `_copy`."""
    state = meta.as_tuple()
    return type(meta)((state[0], True) + state[2:])


def _checked(original: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _needs_host(self):
            write_on_host(self, original, args, kwargs)
            return self
        try:
            return original(self, *args, **kwargs)
        except RuntimeError as e:
            # functionalization refuses writes through `as_strided` views of views (their
            # inverse is not compositional); the base is still intact, so run it on the host
            if "as_strided() is non-compositional" not in str(e) or not _is_functional(self):
                raise
            write_on_host(self, original, args, kwargs)
            return self
    method.__name__ = original.__name__
    method.__doc__ = original.__doc__
    return method


def _inplace_names() -> list[str]:
    """Tensor methods that write their `self` in place (by the aten schema), views excluded."""
    names = []
    for name in dir(torch.Tensor):
        if not name.endswith("_") or name.startswith("_"):
            continue
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or not hasattr(packet, "overloads"):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            args = op._schema.arguments
            if (torch.Tag.inplace_view not in op.tags and args and args[0].alias_info is not None
                    and args[0].alias_info.is_write):
                names.append(name)
                break
    return names


def patch() -> None:
    for name in _inplace_names():
        setattr(torch.Tensor, name, _checked(getattr(torch.Tensor, name)))
        if callable(getattr(torch, name, None)):
            setattr(torch, name, _checked(getattr(torch, name)))
    for name in _AUGMENTED + ("__setitem__",):
        setattr(torch.Tensor, name, _checked(getattr(torch.Tensor, name)))
