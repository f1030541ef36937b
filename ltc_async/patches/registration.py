"""Registering the `ltc` device with PyTorch (PrivateUse1, renamed), in pure Python.

* `rename_privateuse1_backend("ltc")` + a device module (`torch.ltc`): device strings, `t.ltc()`,
  and `torch.manual_seed` reaching our per-device generators (`manual_seed_all`);
* a `torch.library` fallback on the PrivateUse1 key: ops with no tensor argument but
  `device="ltc:N"` (factories: `empty`, `empty_strided`, `arange`, ...) land there; everything
  else reaches `LtcTensor.__torch_dispatch__` through the Python key;
* results of user-level factory calls are wrapped for functionalization (see `lazy_tensor.py`);
* `print(t)` copies to the host once instead of tracing the printing code's indexing ops;
* in-place ops that functionalization would get wrong (result types that cannot be cast back,
  writes through views whose elements share memory, failing in-place view ops) are checked at
  their Python entry points (`inplace.py`);
* backward passes over ltc tensors run in the calling thread (see `_patch_autograd_engine`);
* the device guard (`_LtcDeviceGuard`) survives a Python error left pending by code that failed
  inside the autograd engine (an op, an unpack hook, a tensor hook), so that error is raised by
  `backward()` instead of aborting the process.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import Any

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from ..executor import arena
from ..executor import graph_executor as gx
from ..ir.schema import aten_schemas
from ..tensor import composites, decompositions
from ..tensor import dispatch as dispatch_module
from ..tensor.dispatch import dispatch
from ..tensor.lazy_tensor import LtcTensor, unwrap, wrap
from ..tensor.special import copy_into
from . import (
    autocast,
    collectives,
    data_parallel,
    default_dtype,
    dispatch_modes,
    fast_paths,
    fx_tracing,
    inference_mode,
    inplace,
    meta_kernels,
    modules,
    native,
    running_stats,
    seam,
    storage,
    sync_batch_norm,
)

_FUNCTIONALIZE = torch._C.DispatchKey.Functionalize
_PYTHON_SNAPSHOT = torch._C.DispatchKey.PythonTLSSnapshot   # excluded inside a mode's handler
_PYTHON = torch._C.DispatchKey.Python
_registered = False
_lib: Any = None
_libs: list = []


_current = threading.local()   # `torch.ltc.device(i)` / `set_device(i)`, per thread


class _DeviceGuard:
    """`with torch.ltc.device(i):` makes ltc:i the current lazy device of this thread (what
    `torch.utils.checkpoint` uses to stash and restore each device's RNG state)."""

    def __init__(self, device: Any) -> None:
        self.index = _index(device) if device is not None else None
        self.prev: int | None = None

    def __enter__(self) -> "_DeviceGuard":
        self.prev = _LtcDeviceModule.current_device()
        if self.index is not None and self.index >= 0:
            _current.index = self.index
        return self

    def __exit__(self, *exc: Any) -> None:
        _current.index = self.prev


class _Stream:
    """`torch.ltc.current_stream()`: a lazy device runs its work in order on one queue, its one
    stream.  Synchronizing it waits for that queue (`wait_device_ops`); waiting on another
    stream of the same device is already implied.  What device-generic code asks of a stream
    (PyTorch's distributed checkpoint stages host copies on the accelerator's stream)."""

    device_type = "ltc"

    def __init__(self, device: Any = None) -> None:
        self.device_index = _device_index(device)
        self.device = torch.device("ltc", self.device_index)

    def synchronize(self) -> None:
        _LtcDeviceModule.synchronize(self.device)

    def wait_stream(self, stream: Any) -> None:
        if isinstance(stream, _Stream) and stream.device_index != self.device_index:
            stream.synchronize()

    def query(self) -> bool:
        last = arena.get(self.device_index).last
        return last is None or last.done()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream) and other.device_index == self.device_index

    def __hash__(self) -> int:
        return hash(("ltc", self.device_index))

    def __repr__(self) -> str:
        return f"<ltc stream of {self.device}>"


# Any `pythonapi` function called while a Python error is pending raises that error (ctypes checks
# `PyErr_Occurred()` after each call) and otherwise returns 0: an infallible probe.
_raise_pending = ctypes.pythonapi.PyErr_Occurred
_PRIVATE_USE1 = torch._C._autograd.DeviceType.PrivateUse1


class _LtcDeviceGuard(torch._C._acc.DeviceGuard):
    """The device guard of the `ltc` device type.

    PyTorch's Python-backed PrivateUse1 guard (`torch._C._acc.DeviceGuard`) asks Python for the
    device type (`type_`) on every call, including `exchangeStream` from the autograd engine's
    stream guard, a `noexcept` destructor.  When a Python callback fails inside the engine (a
    saved-tensor unpack hook, a tensor hook), PyTorch leaves the Python error set while the C++
    exception unwinds; calling into Python then fails, and C++ terminates the process.  So this
    `type_` first takes a pending error inside a backward pass (the engine then ends with an
    error that carries none) and keeps it for the backward wrapper (`_raising_deferred`), which
    raises it where `backward()` was called.  Outside a backward pass a pending error is raised
    again, as before: PyTorch's own handling applies.

    Offered to PyTorch after the native piece's C++ guard (`patches/native`), which PyTorch then
    keeps: this one serves only where that is not built (or `LTC_ASYNC_NATIVE=0`)."""

    def type_(self) -> Any:
        try:
            _raise_pending()
        except BaseException as e:  # whatever the callback raised goes back to the caller
            if torch._C._current_graph_task_id() == -1:
                raise
            errors = dispatch_module.backward_errors
            if errors.first is None:
                errors.first = e
        return _PRIVATE_USE1


class _LtcDeviceModule:
    """`torch.ltc`: what PyTorch asks of a device backend module (device count and current
    device, RNG state, AMP dtypes for `torch.autocast("ltc")`, the `device(i)` guard that
    `torch.utils.checkpoint` uses)."""

    _initialized = True
    device = _DeviceGuard

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    @staticmethod
    def set_device(device: Any) -> None:
        _current.index = _index(device)

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return len(arena.contexts())

    Stream = _Stream

    @staticmethod
    def current_stream(device: Any = None) -> _Stream:
        return _Stream(device)

    default_stream = current_stream

    @staticmethod
    def stream(stream: Any) -> Any:
        """`with torch.ltc.stream(s):` -- one stream per device: nothing to switch."""
        return contextlib.nullcontext(stream)

    @staticmethod
    def current_device() -> int:
        return getattr(_current, "index", None) or 0

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        # Before the devices exist, contexts start from torch.initial_seed() anyway.
        for ctx in arena.started():
            ctx.manual_seed(seed)

    @staticmethod
    def manual_seed(seed: int) -> None:
        arena.get(None).manual_seed(seed)

    @staticmethod
    def initial_seed() -> int:
        return arena.get(None).seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        """The per-device generator state (seed, draws) as a uint8 tensor, like CUDA's."""
        seed, counter = arena.get(_device_index(device)).rng_state()
        seed &= (1 << 64) - 1
        signed = seed - (1 << 64) if seed >= 1 << 63 else seed  # int64 storage of a uint64 seed
        return torch.tensor([signed, counter], dtype=torch.int64).view(torch.uint8)

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        seed, counter = (int(v) for v in state.view(torch.int64).tolist())
        arena.get(_device_index(device)).set_rng_state(seed & ((1 << 64) - 1), counter)

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [_LtcDeviceModule.get_rng_state(c.index) for c in arena.contexts()]

    @staticmethod
    def set_rng_state_all(states: list[torch.Tensor]) -> None:
        for c, st in zip(arena.contexts(), states):
            _LtcDeviceModule.set_rng_state(st, c.index)

    @staticmethod
    def synchronize(device: Any = None) -> None:
        gx.wait_device_ops(arena.resolve(None if device is None else [device]))


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """`dst.copy_(src)` below functionalization (how `torch.tensor(data, device="ltc")` fills its
    result): point the lazy `dst` at `src`'s value, or write a lazy `src` into a host `dst`.
    Inside a dispatch handler (a `TorchDispatchMode`, a subclass such as a jagged nested
    tensor or `allow_mutation_on_saved_tensors`' mode) functionalization is skipped and the
    copy sees the user's functional tensors themselves (`aten._to_copy(t, device="ltc")`):
    the copy is of their inner values."""
    copy_into(_inner(src), _inner(dst))
    return dst


def _factory_ops() -> list[tuple[str, Any]]:
    """aten overloads that take no tensor, return tensors and accept a `device`."""
    found = []
    for schema in aten_schemas():
        if not schema.name.startswith("aten::") or schema.is_mutable:
            continue
        names = [a.name for a in schema.arguments]
        if "device" not in names or not schema.returns:
            continue
        if any("Tensor" in str(a.type) for a in schema.arguments):
            continue
        if not all(str(r.type) == "Tensor" for r in schema.returns):
            continue
        base = schema.name.split("::")[1]
        overload = schema.overload_name or "default"
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            found.append((base + ("." + schema.overload_name if schema.overload_name else ""), op))
    return found


def _factory_kernel(op: Any) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        # a factory takes no tensor: nothing to unwrap (`_privateuse1_fallback`), ~3 us less
        return _dispatch_wrapped(op, args, kwargs)
    return kernel


def _index(device: Any) -> int | None:
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index


def _device_index(device: Any) -> int:
    """A device argument of `torch.ltc` functions: None or "ltc" mean the current device."""
    index = None if device is None else _index(device)
    return _LtcDeviceModule.current_device() if index is None else index


def _wrap_result(out: Any) -> Any:
    if type(out) is LtcTensor:
        return wrap(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap_result(o) for o in out)
    return out


def _inner(v: Any) -> Any:
    """A user-facing (functional) ltc tensor as its inner `LtcTensor`; anything else as it is."""
    if isinstance(v, torch.Tensor) and type(v) is not LtcTensor and v.device.type == "ltc" \
            and torch._is_functional_tensor(v):
        return unwrap(v)
    if type(v) in (list, tuple):
        return type(v)(_inner(e) for e in v)
    return v


def _privateuse1_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    # Calls made below functionalization's key with the user's tensors reach this fallback with
    # the functional wrappers themselves: `torch.tensor([a, b])` of 0-dim ltc tensors reads each
    # with `_local_scalar_dense` that way (which looped back here until the recursion limit)
    return _dispatch_wrapped(op, tuple(_inner(a) for a in args), {k: _inner(v) for k, v in kwargs.items()})


def _dispatch_wrapped(op: Any, args: tuple, kwargs: dict) -> Any:
    """`op` on inner tensors, its result as the caller expects it: as it is for
    functionalization's redispatch (which wraps it itself), else wrapped."""
    out = dispatch(op, args, kwargs)
    return out if _below_functionalization() else _wrap_result(out)


def _below_functionalization() -> bool:
    """Is this call functionalization's redispatch (which wraps what it gets back)?  Its kernel
    excludes its key while it redispatches.  So does a TorchDispatchMode's handler (every key
    above Python, the Python key itself not: a user's `FlopCounterMode` calling
    `torch.zeros(..., device="ltc")`), whose result goes back to the user and must be wrapped;
    functionalization run from inside a mode (AOTAutograd's `FunctionalTensorMode`,
    `torch.func.functionalize`) includes its key, and `torch.tensor(data, device=...)`, which
    wraps what it builds itself, excludes the Python key too."""
    tls_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    if not tls_excluded(_FUNCTIONALIZE):
        return False
    if torch._C._dispatch_tls_is_dispatch_key_included(_FUNCTIONALIZE):
        return True
    return not (tls_excluded(_PYTHON_SNAPSHOT) and not tls_excluded(_PYTHON))


def _patch_accelerator_synchronize() -> None:
    """`torch.accelerator.synchronize()` where ltc is the accelerator (no GPU): wait for the
    device queues, as `torch.ltc.synchronize` does (PyTorch's C++ path asks the Python device
    guard for streams it does not have and raises)."""
    import torch.accelerator as accelerator
    original = accelerator.synchronize

    @functools.wraps(original)
    def synchronize(device: Any = None, /) -> None:
        current = accelerator.current_accelerator()
        if current is not None and current.type == "ltc":
            _LtcDeviceModule.synchronize(device)
        else:
            original(device)
    accelerator.synchronize = synchronize


def _patch_printing() -> None:
    """`repr` of an ltc tensor: one host copy, then eager's formatting plus device/grad suffixes
    (functional wrappers would otherwise print as functorch wrappers)."""
    import torch._tensor_str as ts
    from torch._subclasses.fake_tensor import FakeTensor
    original = ts._str

    def _str(self: torch.Tensor, *, tensor_contents: Any = None) -> str:
        if self.device.type != "ltc" or isinstance(self, FakeTensor):  # fakes: torch.compile
            return original(self, tensor_contents=tensor_contents)
        # sync the tensor itself (not only the detached copy printed below): its graph runs
        # once, and the tensor then holds device data instead of staying pending
        gx.sync_multi([unwrap(self)])
        with torch.no_grad():
            text = original(self.detach().to("cpu"), tensor_contents=tensor_contents)
        suffix = f", device='{self.device}'"
        if self.grad_fn is not None:
            suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            suffix += ", requires_grad=True"
        return text[:-1] + suffix + ")"
    ts._str = _str


def _patch_autograd_engine() -> None:
    """Run backward passes over ltc tensors in the calling thread.

    The autograd engine gives each non-CPU device index a worker queue, sized by the device
    guard's device count, which a pure-Python PrivateUse1 guard fixes at 1: a backward on
    `ltc:1` would fail an internal assert.  With multithreading disabled for the call, the
    engine runs everything on the caller's CPU queue, which also spares a thread hop per
    backward (the work is only tracing anyway).
    """
    import torch.autograd as autograd
    original = autograd._engine_run_backward

    def _engine_run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        for t in t_outputs:
            if isinstance(t, torch.Tensor) and t.device.type == "ltc":
                # a program that reads every step: its forward runs while the backward is traced
                gx.before_backward(_devices_of(t_outputs))
                with autograd.set_multithreading_enabled(False):
                    return _raising_deferred(original, t_outputs, *args, **kwargs)
        try:
            return original(t_outputs, *args, **kwargs)
        except RuntimeError as e:
            if _CUDA_STREAMS_ASSERT in str(e):
                raise RuntimeError(_CUDA_BACKWARD_REFUSED) from e
            raise
    autograd._engine_run_backward = _engine_run_backward


def _devices_of(tensors: Any) -> list:
    """The lazy devices of the ltc tensors among `tensors` (functorch's wrappers and fake
    tensors on an ltc device have none)."""
    found: dict = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "ltc":
            try:
                found[unwrap(t)._ctx] = None
            except TypeError:
                pass
    return list(found)


# PyTorch's autograd engine asks `at::getAccelerator()` for the device type whose streams it
# synchronizes, and that answers PrivateUse1 as soon as a PrivateUse1 backend is registered --
# ltc_async's `ltc`, at import, for good.  A backward over eager CUDA tensors then finds no
# stream on its nodes and fails an internal assert (pytorch/pytorch#161129; seen on an H200
# with torch 2.11).  Nothing outside PyTorch's C++ can change that answer, so the assert is
# turned into an error that says what happened and what to do.
_CUDA_STREAMS_ASSERT = "opt_ready_stream && opt_parent_stream"
_CUDA_BACKWARD_REFUSED = (
    "PyTorch's autograd cannot run this backward over CUDA tensors in a process that imported "
    "ltc_async: registering the `ltc` device (a PrivateUse1 backend) makes PyTorch treat "
    "PrivateUse1, not CUDA, as the accelerator whose streams the engine synchronizes "
    "(pytorch/pytorch#161129). Train on `ltc:N` devices instead (they run on the GPU where one "
    "is present: ltc.backend_device('ltc:0') says which), or run the eager CUDA code in a "
    "process that does not import ltc_async.")


def _raising_deferred(run: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a backward pass; if it fails, raise the error the device guard took from the engine
    (see `_LtcDeviceGuard`), if any: the engine itself then fails with a bare SystemError
    ("returned NULL without setting an exception")."""
    errors = dispatch_module.backward_errors
    errors.first = None
    try:
        return run(*args, **kwargs)
    except Exception:
        first, errors.first = errors.first, None
        if first is None:
            raise
    raise first  # outside the handler: the SystemError is no part of the story


def register() -> None:
    global _registered, _lib
    if _registered:
        return
    native.load()   # C++ hooks with a pinned allocator, if built: before the Python ones
    _setup_privateuseone_for_python_backend(rename="ltc", backend_module=_LtcDeviceModule(),
                                            device_guard=_LtcDeviceGuard())
    _lib = torch.library.Library("_", "IMPL")
    _lib.fallback(_privateuse1_fallback, dispatch_key="PrivateUse1")
    # With the Python key excluded (torch.tensor(..., device=...)), PyTorch looks these up as
    # per-op Python kernels, not through the fallback.
    _ops_lib = torch.library.Library("aten", "IMPL")
    _ops_lib.impl("_copy_from", _copy_from, "PrivateUse1")
    _ops_lib.impl("_copy_from_and_resize", lambda src, dst: _copy_from(src, dst), "PrivateUse1")
    # Factory ops get explicit kernels: their generic composite kernels would build the
    # result as `empty` + an `out=` op (`eye.out`, `arange.out`), which must resize its output
    # in place -- something a lazy tensor below functionalization cannot do.
    for name, op in _factory_ops():
        _ops_lib.impl(name, _factory_kernel(op), "PrivateUse1")
    _libs.append(_ops_lib)
    _patch_printing()
    _patch_autograd_engine()
    _patch_accelerator_synchronize()
    modules.patch_module_apply()   # module.to('ltc:N') keeps tied weights tied
    autocast.register()            # torch.autocast('ltc'): CPU's policy
    storage.patch_has_storage()    # deepcopy / torch.save take PyTorch's device path
    storage.patch_storage_ptr()    # storage.data_ptr() tells storages apart (safetensors, save_pretrained)
    storage.patch_load()           # torch.load(map_location="ltc:0"); no ltc storages
    storage.patch_save()           # torch.save keeps views of one ltc storage sharing it
    storage.patch_jit()            # TorchScript archives and ltc tensors: clear errors
    inplace.patch()
    decompositions.register()      # _pack_padded_sequence: host batch sizes, above autograd
    composites.register()          # linear, matmul, attention: one node each where autograd records nothing
    collectives.register()         # dist collectives on views write through to the base
    seam.register()                # host tensors written from ltc ones: cpu.copy_(ltc), ...
    running_stats.register()       # batch norm's running stats written through views and aliases
    sync_batch_norm.register()     # nn.SyncBatchNorm's CUDA-only kernels as ordinary ops
    meta_kernels.register()        # shapes of ops PyTorch has no meta kernel for (_ctc_loss_backward)
    fast_paths.patch()             # nn.TransformerEncoder's nested-tensor fast path, dense
    fx_tracing.patch()             # FX tracing on the tier-up thread leaves torch.compile alone elsewhere
    default_dtype.patch()          # torch.set_default_dtype: per-signature caches start over
    dispatch_modes.patch()         # selective checkpointing, torch.func.functionalize over ltc tensors
    data_parallel.patch()          # torch.nn.DataParallel over ltc devices; CPU modules as before
    inference_mode.patch()         # torch.inference_mode() as no_grad once ltc devices exist (views)
    _registered = True
