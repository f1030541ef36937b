"""`module.to("ltc:N")` keeps parameter objects, tied weights tied, and lazy modules
uninitialized, as on CUDA.

`nn.Module._apply` converts each module's parameters separately.  On CUDA the converted data is
swapped into the *same* `Parameter` object (`param.data = ...`), so a parameter shared by two
modules (GPT-2's token embedding and its output layer) stays one object.  An `ltc` tensor is a
functional wrapper, which PyTorch does not consider "shallow-copy compatible" with a CPU
tensor, so `_apply` builds a new `Parameter` per module and the tie silently breaks: the two
copies then get different gradients.

The fix is general: around the outermost `_apply`, note which (module, name) slots hold the
same `Parameter` (or buffer) object, and afterwards point every slot of such a group at the one
converted object.  Nothing changes where conversion already kept the objects shared.

The same incompatibility would give every parameter a new object, and an optimizer built before
`model.to("ltc:0")` (PyTorch advises against it, but it works on CUDA) would go on updating the
old host tensors while the model never trains.  So each `Parameter` the conversion replaced
across the host/ltc boundary is swapped back into its original object
(`torch.utils.swap_tensors`, what PyTorch's own `swap_module_params_on_conversion` does for
devices it cannot shallow-copy into): the object keeps its identity and its Python attributes,
and takes the converted tensor.  Where a swap is impossible (a weak reference to the parameter,
its data held by another tensor) the new object stays, as before.

Converted parameters also get a storage of their own.  `nn.Parameter` detaches its data, and
`detach` is a view for functionalization: every parameter would be a view of the temporary
`.to()` result, so each write to it (every optimizer step) would queue an update of that
storage and each later read regenerate the parameter by replaying `detach_copy`, one Python
dispatch per parameter and write.  A parameter no other tensor shares (its storage's use count
is 1, plus the probe) is pointed at a fresh storage holding its value instead
(functionalization's own `set_`, no dispatch to ltc, its version counter kept): a base, whose
writes and reads replay nothing.  (The in-place foreach kernels in `decompositions.py` do the
same for what an optimizer writes; doing it here, before the first step, keeps the first
steps' graphs those of the steady state.)
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from ..tensor.writeback import own_storage

_state = threading.local()


def _shared_slots(root: torch.nn.Module, recurse: bool) -> list[list[tuple[torch.nn.Module, str, str]]]:
    """Groups of (module, table, name) slots that hold the same tensor object."""
    groups: dict[int, list[tuple[torch.nn.Module, str, str]]] = {}
    for mod in (root.modules() if recurse else (root,)):
        for table in ("_parameters", "_buffers"):
            for name, t in getattr(mod, table).items():
                if t is not None:
                    groups.setdefault(id(t), []).append((mod, table, name))
    return [g for g in groups.values() if len(g) > 1]


def _retie(groups: list[list[tuple[torch.nn.Module, str, str]]]) -> None:
    for slots in groups:
        mod, table, name = slots[0]
        keep = getattr(mod, table)[name]
        if keep is None or keep.device.type != "ltc":
            continue
        for mod, table, name in slots[1:]:
            getattr(mod, table)[name] = keep


def _own_storages(root: torch.nn.Module, recurse: bool) -> None:
    for mod in (root.modules() if recurse else (root,)):
        for p in mod._parameters.values():
            if p is not None and not isinstance(p, torch.nn.parameter.UninitializedTensorMixin):
                own_storage(p)


def _parameter_slots(root: torch.nn.Module, recurse: bool) -> list[tuple[torch.nn.Module, str, Any]]:
    return [(mod, name, p) for mod in (root.modules() if recurse else (root,))
            for name, p in mod._parameters.items()
            if type(p) is torch.nn.Parameter and not isinstance(p, torch.nn.parameter.UninitializedTensorMixin)]


def _keep_objects(slots: list[tuple[torch.nn.Module, str, Any]]) -> None:
    """Swap each converted parameter back into the object it replaced (see the module note)."""
    swapped: dict[int, torch.nn.Parameter] = {}   # id(new) -> the old object now holding it
    for mod, name, old in slots:
        new = mod._parameters.get(name)
        if new is None or new is old or type(new) is not torch.nn.Parameter:
            continue
        if id(new) in swapped:                     # a tied slot: already swapped
            mod._parameters[name] = swapped[id(new)]
            continue
        if (old.device.type == "ltc") == (new.device.type == "ltc"):
            continue                               # not across the host/ltc boundary
        attrs = dict(old.__dict__)
        try:
            torch.utils.swap_tensors(old, new)
        except RuntimeError:
            continue                               # weakly referenced or shared: keep the new one
        old.__dict__.update(attrs)                 # the user's attributes stay with the object
        swapped[id(new)] = old
        mod._parameters[name] = old


def _uninitialized_slots(root: torch.nn.Module, recurse: bool) -> list[tuple[torch.nn.Module, str, str, Any]]:
    """The (module, table, name, placeholder) slots of lazy modules' uninitialized tensors."""
    found = []
    for mod in (root.modules() if recurse else (root,)):
        for table in ("_parameters", "_buffers"):
            for name, t in getattr(mod, table).items():
                if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
                    found.append((mod, table, name, t))
    return found


def _keep_uninitialized(slots: list[tuple[torch.nn.Module, str, str, Any]]) -> None:
    """`LazyLinear(2).to("ltc:0")`: CUDA swaps the moved data into the same placeholder object,
    which stays uninitialized until the first forward; here `_apply` made a plain `Parameter`
    of it (the case above), which the module would take for initialized weights of shape (0,).
    Put an uninitialized placeholder with the moved tensor's device and dtype back."""
    for mod, table, name, old in slots:
        new = getattr(mod, table)[name]
        if new is None or new is old or isinstance(new, torch.nn.parameter.UninitializedTensorMixin):
            continue
        if isinstance(old, torch.nn.UninitializedParameter):
            getattr(mod, table)[name] = torch.nn.UninitializedParameter(old.requires_grad, new.device, new.dtype)
        else:
            getattr(mod, table)[name] = torch.nn.UninitializedBuffer(old.requires_grad, new.device, new.dtype)


def patch_module_apply() -> None:
    original = torch.nn.Module._apply

    def _apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        if getattr(_state, "active", False):       # an inner module: the outermost call re-ties
            return original(self, fn, recurse)
        groups = _shared_slots(self, recurse)
        lazy = _uninitialized_slots(self, recurse)
        params = _parameter_slots(self, recurse)
        _state.active = True
        try:
            out = original(self, fn, recurse)
        finally:
            _state.active = False
        if groups:
            _retie(groups)
        if lazy:
            _keep_uninitialized(lazy)
        _keep_objects(params)
        _own_storages(self, recurse)
        return out

    torch.nn.Module._apply = _apply
