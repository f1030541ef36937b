"""`ltc` tensors have no host storage: `copy.deepcopy`, `torch.save` and `torch.load` go around it.

An `ltc` tensor is a functional wrapper whose "storage" is functionalization's bookkeeping, not
memory the host can read or allocate.  Three places in PyTorch assume otherwise:

* `Tensor.__deepcopy__` and `Tensor.__reduce_ex__` already handle device tensors without storage
  (XLA's, and PrivateUse1 backends': deepcopy clones on the device; saving copies to the CPU
  and rebuilds on the device when loading, or on the CPU with `map_location="cpu"`), but they
  ask `torch._C._has_storage`, which says True for the wrapper, and then read the storage's
  bytes (a segfault for deepcopy, "invalid python storage" for save).  Answering False for
  `ltc` tensors sends them down the intended path (`patch_has_storage`).
* `torch.load(f, map_location="ltc:0")` (a string, a device, a dict or a function naming an
  ltc device) restores each storage with `storage.to(device)`, which allocates a device storage
  through the PrivateUse1 allocator: there is none, and the process died of a segfault.  Here
  (`patch_load`) a storage bound for an ltc device stays on the host, remembered for the
  duration of the `torch.load` call; each tensor rebuilt over it (`torch._utils._rebuild_tensor`,
  what both the weights-only and the full unpickler call) is moved to its device.  Tensors that
  share a storage in the file share one on the device, as they would on CUDA: the first one
  that covers its whole storage is uploaded as it is, any other becomes an `as_strided` view of
  the storage's one upload (so a loaded slice writes through to its loaded base).  Files saved
  from ltc tensors (below) take the same path through `_rebuild_device_tensor_from_cpu_tensor`.
* `torch.save` of ltc tensors that share a storage (a tensor and its views, `x.detach()`)
  wrote one host copy per tensor, and loading gave tensors that no longer alias.  Within a
  `torch.save` call (`patch_save`), each ltc storage is copied to the host once and every tensor
  over it pickles as a host view of that copy with its eager geometry (its view chain replayed
  on the base's layout), so the file holds one storage, as eager's does.
* `torch.UntypedStorage(n, device="ltc:0")` (and `storage.to("ltc:0")` outside `torch.load`)
  would reach the same missing allocator: it raises instead, naming what to do.
* `storage.data_ptr()` of an ltc tensor raised ("invalid python storage"); libraries read it to
  find tensors sharing memory (safetensors' `save_file`, transformers' `save_pretrained` and its
  tied weights).  It answers an address that identifies the storage (`patch_storage_ptr`):
  equal for a tensor, its views and its detached aliases, distinct otherwise, as eager's are.
  (`Tensor.data_ptr()` stays 0: see README, "Known limitations".)
* TorchScript archives (`patch_jit`): `torch.jit.load(f, map_location="ltc:0")` made parameters
  of shape `[0]` (its C++ loader sets device storages), and a scripted module cannot move to ltc
  afterwards (`ScriptModule` parameters are swapped only between compatible tensor types, as on
  XLA); `torch.jit.save` of a module holding ltc tensors failed inside the archive writer.  Both
  raise at the call, naming what works: load on the CPU (a scripted module runs there), or
  rebuild the eager module on `ltc` and load its `state_dict`.

Thread safety: the storages bound for a device are kept per thread (`_loading`, `_saving`), for
the one `torch.load` or `torch.save` call running on that thread; nothing is shared between
threads.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from . import inplace

_LTC = "ltc"


def patch_has_storage() -> None:
    original = torch._C._has_storage

    def _has_storage(t: Any) -> bool:
        if isinstance(t, torch.Tensor) and t.device.type == _LTC:
            return False
        return original(t)
    torch._C._has_storage = _has_storage


def patch_storage_ptr() -> None:
    original = torch.UntypedStorage.data_ptr

    @functools.wraps(original)
    def data_ptr(self: Any) -> int:
        if self.device.type == _LTC:
            return self._cdata   # the storage's own address: one per storage, shared by its views
        return original(self)
    torch.UntypedStorage.data_ptr = data_ptr


class _Loading(threading.local):
    """The `torch.load` call running on this thread: the host storages bound for an ltc device
    (by storage identity: the storage itself, kept alive, and the device), and the one upload of
    each storage that more than one tensor shares (by storage identity and dtype)."""

    def __init__(self) -> None:
        self.depth = 0
        self.bound: dict[int, tuple[Any, torch.device]] = {}
        self.uploads: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def clear(self) -> None:
        self.bound.clear()
        self.uploads.clear()


_loading = _Loading()


def _refuse(device: torch.device) -> None:
    raise RuntimeError(
        f"ltc_async: {device} has no storages of its own (an ltc tensor is a lazy value, its "
        "storage is not memory the host can allocate or read); make the data on the host and "
        f"move tensors with tensor.to('{device}'), or load checkpoints with "
        f"torch.load(f, map_location='{device}')")


def _scoped(fn: Any, scope: Any) -> Any:
    """`fn` (torch.load or torch.save) with `scope` open for the duration of the outermost call."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        scope.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            scope.depth -= 1
            if scope.depth == 0:
                scope.clear()
    return call


def _like(fn: Any, original: Any) -> Any:
    """`fn` under `original`'s name in `torch._utils`: files pickle rebuild functions by name,
    and the weights-only unpickler allows them by name."""
    fn.__name__ = fn.__qualname__ = original.__name__
    fn.__module__ = original.__module__
    return fn


def patch_load() -> None:
    """`torch.load(..., map_location=<an ltc device>)`, and a clear error where an ltc storage
    would be allocated (see the module note)."""
    import torch._utils
    import torch.serialization
    import torch.storage

    to = torch.storage._to

    def _to(self: Any, device: Any, non_blocking: bool = False) -> Any:
        device = torch.device(device)
        if device.type != _LTC:
            return to(self, device, non_blocking)
        if _loading.depth == 0:
            _refuse(device)
        host = self if self.device.type == "cpu" else to(self, torch.device("cpu"), False)
        _loading.bound[host._cdata] = (host, device)
        return host
    torch.storage._to = _to

    rebuild = torch._utils._rebuild_tensor

    def _rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any) -> torch.Tensor:
        t = rebuild(storage, storage_offset, size, stride)
        if _loading.depth == 0:
            return t
        untyped = storage._untyped_storage
        found = _loading.bound.get(untyped._cdata)
        if found is None:
            return t
        return _to_device(t, untyped, found[1])
    torch._utils._rebuild_tensor = _like(_rebuild_tensor, rebuild)

    from_cpu = torch._utils._rebuild_device_tensor_from_cpu_tensor

    def _rebuild_device_tensor_from_cpu_tensor(data: torch.Tensor, dtype: torch.dtype, device: Any,
                                               requires_grad: bool) -> torch.Tensor:
        mapping = torch.serialization._serialization_tls.map_location
        if callable(mapping) and not isinstance(mapping, (dict, str, torch.device)):
            # `map_location=lambda storage, loc: storage` (PyTorch refuses callables here):
            # where the callable sends this tensor's host storage is where the tensor goes
            moved = mapping(data.untyped_storage(), str(device))
            target = torch.device(device) if moved is None else moved.device
            if target.type != _LTC:
                t = data.to(dtype).to(target)
                t.requires_grad = requires_grad
                return t
        else:
            target = torch.device(torch._utils._get_restore_location(device))
        if target.type != _LTC or _loading.depth == 0:
            return from_cpu(data, dtype, device, requires_grad)
        data = data.to(dtype)
        if data.device.type == _LTC:    # its storage was bound for the device: moved already
            t = data if data.device == target else data.to(target)
        else:
            t = _to_device(data, data.untyped_storage(), target)
        t.requires_grad = requires_grad
        return t
    torch._utils._rebuild_device_tensor_from_cpu_tensor = _like(_rebuild_device_tensor_from_cpu_tensor, from_cpu)
    from torch import _weights_only_unpickler
    _weights_only_unpickler._get_allowed_globals.cache_clear()   # it holds the functions

    torch.load = torch.serialization.load = _scoped(torch.load, _loading)

    new = torch._C.StorageBase.__new__

    def _new(cls: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == _LTC:
            _refuse(torch.device(device))
        return new(cls, *args, **kwargs)
    torch.UntypedStorage.__new__ = _new   # type: ignore[method-assign]


def _to_device(t: torch.Tensor, untyped: Any, device: torch.device) -> torch.Tensor:
    """The host tensor `t`, rebuilt over a storage bound for `device`, on that device; tensors
    over one storage share one upload of it (see the module note)."""
    key = (untyped._cdata, t.dtype)
    flat = _loading.uploads.get(key)
    if flat is None:
        whole = untyped.nbytes() // t.element_size()
        if t.storage_offset() == 0 and t.numel() == whole and _dense(t):
            out = t.to(device)     # the storage's one upload: the tensor itself, its layout kept
            _loading.uploads[key] = out
            return out
        flat = torch.empty(0, dtype=t.dtype).set_(untyped, 0, (whole,), (1,)).to(device)
        _loading.uploads[key] = flat
    return flat.as_strided(t.size(), t.stride(), t.storage_offset())


class _Saving(threading.local):
    """The `torch.save` call running on this thread: the host copy of each ltc storage saved so
    far (by storage identity and dtype), with the layout of the base it was copied from."""

    def __init__(self) -> None:
        self.depth = 0
        self.copies: dict[tuple[int, torch.dtype], tuple[tuple, tuple, torch.Tensor]] = {}

    def clear(self) -> None:
        self.copies.clear()


_saving = _Saving()


def patch_save() -> None:
    """`torch.save` keeps the sharing of ltc tensors' storages (see the module note)."""
    import torch.serialization

    reduce = torch.Tensor._reduce_ex_internal

    def _reduce_ex_internal(self: torch.Tensor, proto: int) -> Any:
        if _saving.depth == 0 or self.device.type != _LTC or type(self) is not torch.Tensor \
                and not isinstance(self, torch.nn.Parameter):
            return reduce(self, proto)
        host = _host_view(self)
        if host is None:
            return reduce(self, proto)
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (host, self.dtype, str(self.device), self.requires_grad))
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal   # type: ignore[method-assign]
    torch.save = torch.serialization.save = _scoped(torch.save, _saving)


def _host_view(t: torch.Tensor) -> torch.Tensor | None:
    """`t` as a view of the one host copy of its storage, with eager's geometry; None where
    that geometry cannot be told (`t` is then copied alone)."""
    found = inplace.base_of(t, [])
    if found is None:
        return None
    root, prefix = found
    if not _dense(root):
        return None
    key = (t.untyped_storage()._cdata, t.dtype)
    shape, stride = tuple(root.shape), tuple(root.stride())
    have = _saving.copies.get(key)
    if have is None:
        host = torch.empty_strided(shape, stride, dtype=root.dtype)
        host.copy_(root.detach().cpu())
        have = _saving.copies[key] = (shape, stride, host)
    elif have[:2] != (shape, stride):
        return None
    meta = torch.empty_strided(shape, stride, dtype=root.dtype, device="meta")
    view = inplace.replay_views(meta, t, len(prefix))
    return have[2].as_strided(view.shape, view.stride(), view.storage_offset()).detach()


def _dense(t: torch.Tensor) -> bool:
    """Does `t` cover a block of memory exactly once (any order of dims)?"""
    return bool(is_non_overlapping_and_dense_or_false(t))


def _names_ltc(location: Any) -> bool:
    if isinstance(location, dict):
        return any(_names_ltc(v) for v in location.values())
    try:
        return torch.device(location).type == _LTC
    except (TypeError, RuntimeError):
        return False


def patch_jit() -> None:
    """TorchScript archives and ltc tensors (see the module note)."""
    import torch.jit

    load, save = torch.jit.load, torch.jit.save

    @functools.wraps(load)
    def _jit_load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if map_location is not None and _names_ltc(map_location):
            raise RuntimeError(
                f"ltc_async: torch.jit.load cannot put a TorchScript module on {map_location} "
                "(its parameters would be made from device storages, which ltc devices do not "
                "have, and a scripted module cannot move to ltc afterwards); load it on the CPU, "
                "or build the eager module, move it with .to('ltc:N') and load a state_dict")
        return load(f, map_location, *args, **kwargs)

    @functools.wraps(save)
    def _jit_save(m: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        state = m.state_dict() if hasattr(m, "state_dict") else {}
        if any(isinstance(t, torch.Tensor) and t.device.type == _LTC for t in state.values()):
            raise RuntimeError(
                "ltc_async: torch.jit.save cannot write a module holding ltc tensors (the archive "
                "writer reads tensor storages, which ltc devices do not have); save its weights with "
                "torch.save(module.state_dict(), f), or script and save the module on the CPU")
        return save(m, f, *args, **kwargs)

    torch.jit.load = _jit_load
    torch.jit.save = _jit_save
