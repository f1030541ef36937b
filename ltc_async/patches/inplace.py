"""In-place ops that PyTorch's functionalization would get wrong on ltc tensors.

Design note.  Functionalization turns `v.op_()` into the functional `op` plus bookkeeping in the
`FunctionalTensorWrapper`, and our dispatcher only ever sees the functional op.  Three kinds of
in-place call need a look before that, at the Python entry points (the in-place Tensor methods,
their `torch.*_` twins, augmented assignment, `__setitem__`); each check costs a few attribute
reads on ltc tensors and one type test on others.

1. **Writes whose result type cannot be cast back** (`int_t.mul_(1.5)`): functionalization casts
   the functional result into the target silently; eager raises "result type Float can't be cast
   to the desired output type Long".  When the target is integral/bool or an argument is
   complex, the functional op's result dtype is computed on `meta` and checked first.
2. **Writes through views whose elements alias each other** (`x.expand(2, 4)`, an overlapping
   `as_strided` or `unfold`), **through any `expand` or `unfold` view**, **or reading an
   argument that shares the target's storage** (`x[1:].copy_(x[:-1])`): functionalization
   writes the view's new value back through the inverse of each view, and those of `expand`
   (base + summed change: sums the aliases, loses precision, makes NaN from inf, fails on
   bool) and `unfold` (windows summed into zeros: drops uncovered elements) are no scatter;
   eager writes aliases in turn to the same memory or rejects the op ("more than one element
   of the written-to tensor refers to a single memory location"), and reads aliased inputs
   while it writes.  These run on the host with eager's own aliasing: the view chains of the target and
   of the aliased arguments are replayed as real views on one host copy of the base
   (functionalization's `ViewMeta`s switched to reapply views), the op runs there (eager's values,
   eager's errors, at the user's line) and the base takes the result by a copy, so every other
   view sees it.  Writes through an `as_strided` view of a view, which functionalization refuses
   (that inverse is not compositional), take the same path.  Autograd cannot follow them: an
   aliasing view then raises, an aliased argument keeps the functional semantics.
3. **In-place view ops** (`t_`, `unsqueeze_`, ...): functionalization appends the view to the
   tensor's view chain *before* running it (it checks on `meta` first only for XLA and Lazy
   devices), so a failing `y.t_()` left every later read of `y` replaying it.  The same call
   on a probe raises eager's error first: a CPU tensor of `y`'s shape without memory (expanded)
   for the ops that check dims, a `meta` tensor with `y`'s geometry in its base's storage for
   `as_strided_` (storage bounds).  On tensors that require grad they raise: autograd regenerates the grad_fn of views
   taken earlier by replaying them on the base's new layout (`b = a[0]; a.t_()` made `b`'s
   gradient flow to `a`'s first column), and whether such views exist cannot be told.

Threads: the checks keep no state but per-signature caches (plain dicts, values depend only on
their keys); the patches are installed once, at import.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..ir.schema import type_name
from ..tensor.shapes import signature
from .dispatch_modes import clone_saved_before_write

_F = torch._C._functionalization
_is_functional = torch._is_functional_tensor
_AUGMENTED = ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
              "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__")
_VIEW_OPS = ("t_", "transpose_", "swapdims_", "swapaxes_", "squeeze_", "unsqueeze_", "as_strided_")
_META = torch.device("meta")
_copy = torch.Tensor.copy_  # before `patch()` wraps it


# -- 1. result types ----------------------------------------------------------------------------

def _may_widen(self: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    if not (self.dtype.is_floating_point or self.dtype.is_complex):
        return True
    return any(isinstance(v, complex) or (isinstance(v, torch.Tensor) and v.dtype.is_complex)
               for v in (*args, *kwargs.values()))


def _meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=_META)
    return v


# (name, signature of self and the arguments) -> the functional twin's result dtype, or None
# (no twin, or it raised: the op will raise its own error).  What the dtype depends on is in the
# key (`shapes.signature`): tensors' dtypes, shapes and strides (meta errors), numbers' types
# (and ints' values), other arguments as they are.  Read and written by every tracing thread without a lock: single
# dict operations are atomic under the GIL, and a racing insert stores the same value twice.
_result_dtypes: dict[tuple, Any] = {}
_RESULT_DTYPES_MAX = 4096


def _result_dtype(functional: Callable[..., Any], self: torch.Tensor, args: tuple, kwargs: dict) -> Any:
    try:
        out = functional(_meta(self), *map(_meta, args), **{k: _meta(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - the op itself will raise its own error
        return None
    return out.dtype if isinstance(out, torch.Tensor) else None


def check_result_type(name: str, self: torch.Tensor, args: tuple, kwargs: dict) -> None:
    """Raise eager's error if the functional twin of in-place `name` gives a dtype that cannot
    be cast to `self`'s."""
    if name.startswith("__i"):  # augmented assignment: `__iadd__` -> `__add__`
        name = "__" + name[3:]
    elif name.endswith("_"):
        name = name[:-1]
    else:
        return
    try:
        key: Any = (name, signature(self), *[signature(a) for a in args],
                    *[(k, signature(v)) for k, v in kwargs.items()])
        dtype = _result_dtypes.get(key, _MISSING)
    except TypeError:  # an unhashable argument: no caching
        key, dtype = None, _MISSING
    if dtype is _MISSING:
        functional = getattr(torch.Tensor, name, None)
        dtype = None if functional is None else _result_dtype(functional, self, args, kwargs)
        if key is not None:
            if len(_result_dtypes) >= _RESULT_DTYPES_MAX:
                _result_dtypes.clear()
            _result_dtypes[key] = dtype
    if dtype is not None and not torch.can_cast(dtype, self.dtype):
        raise RuntimeError(f"result type {type_name(dtype)} can't be cast to the desired output "
                           f"type {type_name(self.dtype)}")


_MISSING = object()


# -- 2. writes through aliasing views -----------------------------------------------------------

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


def _storage(t: torch.Tensor) -> int:
    """Identity of the functional storage all aliases of a tensor share (views, `detach()`)."""
    return t.untyped_storage()._cdata


def _alias_of(v: Any, self: torch.Tensor, storage: int) -> bool:
    return v is not self and _lazy(v) and _storage(v) == storage


# views whose functional inverse is not a scatter: `expand`'s adds the summed change to the base
# (precision lost, inf - inf = NaN, bool fails), `unfold`'s sums windows into zeros (elements
# no window covers are lost)
_NOT_SCATTERED = (_F.expand_ViewMeta, _F.unfold_ViewMeta)
_AS_STRIDED = (_F.as_strided_ViewMeta, _F.as_strided__ViewMeta)


# views that keep every element of their input, each once: a tensor made only of these holds
# its storage's whole base value
_WHOLE_VIEWS = tuple(getattr(_F, n) for n in (
    "detach_ViewMeta", "alias_ViewMeta", "lift_fresh_ViewMeta", "t_ViewMeta", "t__ViewMeta",
    "transpose_int_ViewMeta", "transpose__ViewMeta", "permute_ViewMeta", "view_ViewMeta",
    "_reshape_alias_ViewMeta", "_unsafe_view_ViewMeta", "squeeze_ViewMeta", "squeeze_dim_ViewMeta",
    "squeeze_dims_ViewMeta", "squeeze__ViewMeta", "squeeze__dim_ViewMeta", "squeeze__dims_ViewMeta",
    "unsqueeze_ViewMeta", "unsqueeze__ViewMeta"))


# `_unsafe_view` (what a 3-D `matmul`, a bias-free `Linear` on 3-D input or a copying
# `reshape` return) keeps its size as a reference into memory freed when the op returned: its
# `as_tuple()` reads garbage or crashes the process (PyTorch 2.13).  It is always the first view
# of a temporary base no Python code holds, so every alias of that storage shares the entry and
# no replay ever starts before it: its state is never needed, and is not read.
_UNREADABLE = (_F._unsafe_view_ViewMeta,)


def _chain(t: torch.Tensor) -> list[tuple[type, tuple | None]]:
    """`t`'s view chain as plain (ViewMeta type, state) pairs, read at once: the ViewMeta
    objects PyTorch hands out point into the tensor, and a later sync of it can free them."""
    return [(type(m), None if type(m) in _UNREADABLE else m.as_tuple())
            for m in _F.get_view_meta_sequence(t)]


def base_of(t: torch.Tensor, aliases: list) -> tuple[torch.Tensor, list] | None:
    """A tensor from which `t` and its `aliases` are views, with its own view chain: autograd's
    base of `t`, `t` or one of the aliases.  It must hold its storage's whole base value (its
    chain only permutes or aliases), or at least take writes exactly (no `expand`/`unfold` in
    its chain, no aliasing elements), and its chain must begin theirs.  None if none does (a
    `detach()` of a view can alias its storage without leading back to its base)."""
    for c in (t._base, t, *aliases):  # the base first: its chain begins more of the others'
        if c is None:
            continue
        chain = _chain(c)
        if _takes_writes(c, chain) and all(_chain(v)[:len(chain)] == chain for v in (t, *aliases)):
            return c, chain
    return None


def _takes_writes(c: torch.Tensor, chain: list) -> bool:
    """Can functionalization write `c` exactly?  Yes if its views only permute or alias; else
    only without `expand`/`unfold`, aliasing elements, or an `as_strided` past the first view
    (which functionalization refuses to write through)."""
    if all(kind in _WHOLE_VIEWS for kind, _ in chain):
        return True
    return not (any(kind in _NOT_SCATTERED for kind, _ in chain) or aliasing(c)
                or any(kind in _AS_STRIDED for kind, _ in chain[1:]))


def _flat(values: tuple | list) -> list:
    """Arguments with tensor lists (`index_put_`'s indices) spread out."""
    out: list = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v))
        else:
            out.append(v)
    return out


def _any_requires_grad(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.requires_grad
    if isinstance(v, (list, tuple)):
        return any(_any_requires_grad(e) for e in v)
    return False


def replay_views(base: torch.Tensor, v: torch.Tensor, skip: int) -> torch.Tensor:
    """`v`'s view chain past its root's first `skip` views, replayed on `base` (a host copy or
    a meta stand-in of the root): `v`'s eager geometry in the root's storage."""
    return _F.apply_view_meta_sequence(base, [_as_view(m) for m in _chain(v)[skip:]])


def _as_view(meta: tuple[type, tuple]) -> Any:
    """A `ViewMeta` from a `_chain` entry, with reapply_views on: it then makes a real view
    where functionalization made a `_copy`.  Its state is (has_symbolic_inputs, [out_index of
    a multi-output view,] reapply_views, inverse_return_mode, op args...)."""
    kind, state = meta
    if state is None:
        raise RuntimeError("ltc_async: this in-place write needs eager's memory aliasing through a "
                           f"{kind.__name__.removesuffix('_ViewMeta')} view, which cannot be replayed; "
                           "write through .clone()")
    state = list(state)
    mode = next(i for i, v in enumerate(state) if isinstance(v, _F.InverseReturnMode))
    state[mode - 1] = True
    return kind(tuple(state))


def _recorded(self: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Will autograd record this write?  (Then it cannot run on the host.)"""
    return torch.is_grad_enabled() and (self.requires_grad or _any_requires_grad(args)
                                        or _any_requires_grad(list(kwargs.values())))


def write_on_host(view: torch.Tensor, write: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """`write(view, *args, **kwargs)` with eager's aliasing (see the module docstring): `view`
    and the arguments sharing its storage become real views of one host copy of the base."""
    if _recorded(view, args, kwargs):
        raise RuntimeError("ltc_async: an in-place write through a view whose elements share memory "
                           "(expand, overlapping as_strided/unfold) "
                           "cannot be recorded for autograd on ltc devices; write through .clone() or "
                           "under torch.no_grad()")
    storage = _storage(view)
    aliases = [v for v in _flat((*args, *kwargs.values())) if _alias_of(v, view, storage)]
    found = base_of(view, aliases)
    if found is None:
        raise _no_base()
    root, prefix = found
    # an `as_strided` replayed past the root addresses the whole storage: the host copy must be
    # it, which only a root of whole views is (`x.as_strided_(...)` on a base is not)
    if not all(kind in _WHOLE_VIEWS for kind, _ in prefix) and any(
            kind in _AS_STRIDED for v in (view, *aliases) for kind, _ in _chain(v)[len(prefix):]):
        raise _no_base()
    host_root = root.detach().cpu()  # eager's layout (see special._to_copy): its storage order

    def host(v: Any) -> Any:
        if v is view or _alias_of(v, view, storage):
            return replay_views(host_root, v, len(prefix))
        if isinstance(v, torch.Tensor) and v.device.type == "ltc":
            return v.detach().cpu()
        if isinstance(v, (list, tuple)):
            return type(v)(host(e) for e in v)
        return v
    write(host(view), *host(args), **{k: host(v) for k, v in kwargs.items()})
    with torch.no_grad():
        _copy(root, host_root)  # torch's own copy_: the root takes writes (`_takes_writes`)


def check_aliasing_like_eager(view: torch.Tensor, write: Callable[..., Any], args: tuple,
                               kwargs: dict) -> None:
    """Raise what eager raises for a write reading an argument that overlaps its target ("some
    elements of the input tensor and the written-to tensor refer to a single memory
    location"), by running it on CPU stand-ins with the same aliasing (meta tensors do not
    check overlap).  For writes autograd records, which keep the functional semantics."""
    storage = _storage(view)
    found = base_of(view, [v for v in _flat((*args, *kwargs.values())) if _alias_of(v, view, storage)])
    if found is None:
        return
    root, prefix = found
    base = torch.empty_strided(root.shape, root.stride(), dtype=root.dtype).fill_(1)

    def stand_in(v: Any) -> Any:
        if v is view or _alias_of(v, view, storage):
            return replay_views(base, v, len(prefix))
        if isinstance(v, torch.Tensor) and v.device.type == "ltc":
            return torch.ones(v.shape, dtype=v.dtype)
        if isinstance(v, (list, tuple)):
            return type(v)(stand_in(e) for e in v)
        return v
    with torch.no_grad():
        write(stand_in(view), *stand_in(args), **{k: stand_in(v) for k, v in kwargs.items()})


def _no_base() -> RuntimeError:
    return RuntimeError("ltc_async: this in-place write needs eager's memory aliasing, but the written "
                        "tensor does not lead to a tensor holding its whole base on ltc devices (a "
                        "detach() of a view, or an as_strided_ of the base?); write through .clone(), or "
                        "through a view of the base")


# -- the entry points ---------------------------------------------------------------------------

def _lazy(t: Any) -> bool:
    return type(t) is torch.Tensor and _is_functional(t) and t.device.type == "ltc"


def aliased_argument(self: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Does another argument share memory with `self` (`x[1:].copy_(x[:-1])`, `x.add_(x.t())`)?
    Eager reads such inputs while it writes (or rejects a partial overlap); the functional op
    reads them before.  Views of one base whose memory ranges are disjoint (`chunk`s) are fine."""
    tensors = [v for v in _flat((*args, *kwargs.values())) if isinstance(v, torch.Tensor)]
    if not tensors:  # `x.add_(1)`: nothing to share memory with
        return False
    storage = _storage(self)
    others = [v for v in tensors if _alias_of(v, self, storage)]
    if not others:
        return False
    found = base_of(self, others)
    if found is None:
        return True  # cannot tell: the host path says why it cannot run
    root, prefix = found
    base = torch.empty_strided(root.shape, root.stride(), dtype=root.dtype, device=_META)
    span = _memory_range(self, base, len(prefix))
    return any(_meets(span, _memory_range(v, base, len(prefix))) for v in others)


def _memory_range(v: torch.Tensor, base: torch.Tensor, skip: int) -> tuple[int, int]:
    """First and last storage element of the view `v` (its chain past the base's `skip` views,
    replayed on a meta `base`)."""
    view = replay_views(base, v, skip)
    lo = hi = view.storage_offset()
    for size, stride in zip(view.shape, view.stride()):
        if size == 0:
            return (0, -1)
        (lo, hi) = (lo + stride * (size - 1), hi) if stride < 0 else (lo, hi + stride * (size - 1))
    return lo, hi


def _meets(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= a[1] and b[0] <= b[1] and a[0] <= b[1] and b[0] <= a[1]


def _write_needs_host(self: torch.Tensor) -> bool:
    """Would functionalization get a write through `self`'s view chain wrong?  Besides the
    views above, an `as_strided` past the first view: it refuses those, except an in-place
    `as_strided_`, whose write it silently drops."""
    kinds = [type(m) for m in _F.get_view_meta_sequence(self)]
    return bool(kinds) and (any(k in _NOT_SCATTERED for k in kinds) or aliasing(self)
                            or any(k in _AS_STRIDED for k in kinds[1:]))


def _checked_write(original: Callable[..., Any]) -> Callable[..., Any]:
    name = original.__name__

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _lazy(self):
            return original(self, *args, **kwargs)
        if torch._C._len_torch_dispatch_stack():   # a mode may need to see the write
            clone_saved_before_write(self)
        if _may_widen(self, args, kwargs):
            check_result_type(name, self, args, kwargs)
        if _write_needs_host(self):
            write_on_host(self, original, args, kwargs)
            return self
        if aliased_argument(self, args, kwargs):
            if not _recorded(self, args, kwargs):
                write_on_host(self, original, args, kwargs)
                return self
            check_aliasing_like_eager(self, original, args, kwargs)  # autograd: functional op
        try:
            return original(self, *args, **kwargs)
        except RuntimeError as e:
            # functionalization refuses writes through `as_strided` views of views; the base is
            # still intact, so the write runs on the host
            if "as_strided() is non-compositional" not in str(e):
                raise
            write_on_host(self, original, args, kwargs)
            return self
    method.__name__ = name
    method.__doc__ = original.__doc__
    return method


def _storage_probe(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s eager geometry in its base's storage (`as_strided_` checks its
    bounds against the whole storage, from `t`'s storage offset): `t`'s chain replayed on a
    meta copy of the base, or on a flat meta storage of the same size when the chain begins
    with an `as_strided` (which sees only the storage); `t`'s own layout when neither serves."""
    chain = _chain(t)
    if chain and chain[0][0] in _AS_STRIDED and None not in (state for _, state in chain):
        flat = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=_META)
        return replay_views(flat, t, 0)
    found = base_of(t, [])
    if found is None or not all(kind in _WHOLE_VIEWS for kind, _ in found[1]):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
    root, prefix = found
    base = torch.empty_strided(root.shape, root.stride(), dtype=root.dtype, device=_META)
    return replay_views(base, t, len(prefix))


def _checked_view(original: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _lazy(self):
            if torch.is_grad_enabled() and self.requires_grad:
                raise RuntimeError(
                    f"ltc_async: in-place view op {original.__name__} on a tensor that requires grad is "
                    f"not supported on ltc devices (autograd would replay its earlier views on the new "
                    f"layout: wrong gradients); use the out-of-place view, e.g. `y = y.t()`")
            if original.__name__ == "as_strided_":
                probe = _storage_probe(self)
            else:
                probe = torch.empty((), dtype=self.dtype).expand(self.shape)
            original(probe, *args, **kwargs)
        return original(self, *args, **kwargs)
    method.__name__ = original.__name__
    method.__doc__ = original.__doc__
    return method


def _write_names() -> list[str]:
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
    """Install the checks on torch's in-place entry points (once, from `registration`)."""
    for names, wrap in ((_write_names(), _checked_write), (_VIEW_OPS, _checked_view)):
        for name in names:
            setattr(torch.Tensor, name, wrap(getattr(torch.Tensor, name)))
            if callable(getattr(torch, name, None)):
                original = getattr(torch, name)
                setattr(torch, name, wrap(original))
                # TorchScript resolves `torch.relu_` (F.relu(inplace=True)) to its aten op by
                # the function's identity: the wrapper stands for the same op
                op = torch.jit._builtins._find_builtin(original)
                if op is not None:
                    torch.jit._builtins._register_builtin(getattr(torch, name), op)
    for name in _AUGMENTED + ("__setitem__",):
        setattr(torch.Tensor, name, _checked_write(getattr(torch.Tensor, name)))
    torch.Tensor.fill_diagonal_ = _diagonal_filled(torch.Tensor.fill_diagonal_)


def _diagonal_filled(original: Callable[..., Any]) -> Callable[..., Any]:
    """`t.fill_diagonal_(v, wrap)` on ltc: PyTorch writes it through `as_strided` views, which run
    eagerly here (a host round trip per call: contrastive losses mask their similarity matrix's
    diagonal every step).  The same elements written by indices made on the device: (i, ..., i)
    for an N-D tensor; for a 2-D one every (w + 1)-th element in row-major order, past the
    square part too with `wrap` (eager follows the strides there, so a non-contiguous tall
    tensor with `wrap` keeps eager's path)."""
    def fill_diagonal_(self: torch.Tensor, fill_value: Any, wrap: bool = False) -> torch.Tensor:
        shape = self.shape
        if not _lazy(self) or len(shape) < 2 or any(n != shape[0] for n in shape[2:]) \
                or (len(shape) > 2 and shape[1] != shape[0]):
            return original(self, fill_value, wrap)   # eager's errors for the other shapes
        if self.numel() == 0:
            return self
        if len(shape) > 2:
            i = torch.arange(shape[0], device=self.device)
            self[(i,) * len(shape)] = fill_value
            return self
        h, w = shape
        total = min(h, w)
        if wrap and h > w + 1:
            if not self.is_contiguous():
                return original(self, fill_value, wrap)
            total = -(-self.numel() // (w + 1))
        flat = torch.arange(total, device=self.device) * (w + 1)
        self[flat // w, flat % w] = fill_value
        return self
    fill_diagonal_.__doc__ = original.__doc__
    return fill_diagonal_
