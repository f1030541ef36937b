"""The meta check functionalization runs before each in-place op, cached per signature.

Before turning `x.clamp_(0, 1)` into `clamp`, PyTorch's functionalization kernel runs the
in-place op once on meta copies of its arguments, to raise the errors the functional op would
not (a result that cannot be cast back, a broadcast that would grow `x`).  For about 700 aten
ops that meta kernel is a Python reference implementation (`torch._refs`, type promotion and
broadcasting in Python): measured on a 64x64 tensor, `clamp_` cost 2.9 ms, `pow_`, `neg_`,
`sqrt_`, `addcmul_`, `index_add_` 0.3-0.8 ms each, against ~20 us for their functional forms --
real programs (PyG's `deg.pow_(-0.5)`, optimizers without foreach, in-place activations) paid it
at every call.

A refused call raises what eager raises for it, type and message: the meta kernels word some
errors otherwise ("output with shape torch.Size([3, 4]) doesn't match the broadcast shape
(2, 3, 4)"), so the first refusal per signature also runs the op by eager on host stand-ins
(zeros, up to 64 MB: valid indices, no values these checks read) and keeps eager's exception
where it has the same type, or is eager's "not implemented for" a dtype.

The verdict only depends on what a meta run can see (shapes, strides, dtypes, number types:
`shapes.signature`), so while the op path runs a functionalization kernel on `ltc` tensors
(`seam.py` sets `state.on`), the Meta kernel of the op it calls is replaced by one that looks the
verdict up: the first call per signature runs the original meta kernel and remembers whether
it passed or the exception it raised; later calls raise the same error or return the written
arguments unchanged (functionalization discards the meta run's result).  Everywhere else
(meta tensors, FakeTensor, torch.compile) the original meta kernel runs as before.  Kernels are
replaced on first use, per op; ops whose meta run reads more than a signature shows (storage
sizes: `set_`, `resize_`, `as_strided_`) are left alone.

Thread safety: the flag is per thread; `_verdicts` and `_replaced` are plain dicts of values
computed from their keys alone (a racing miss computes the same verdict twice); registering a
kernel takes `_lock`.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any

import torch

from ..tensor.shapes import signature, zeros_laid_out

state = threading.local()   # `on`: functionalization kernels called now run cached checks
_verdicts: dict[tuple, Any] = {}
_VERDICTS_MAX = 1 << 14
_replaced: dict[str, Any] = {}        # op name -> returns of its schema as argument indices, or None
_lock = threading.Lock()
_lib: Any = None
_PASSED = object()
_KeySet = torch._C.DispatchKeySet
_META_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
UNCACHED = ("aten::set_", "aten::resize", "aten::as_strided", "aten::_resize")


def ensure(name: str) -> None:
    """Replace the Meta kernel of `name` (a qualified overload name) by the cached one, once."""
    if name in _replaced:
        return
    with _lock:
        if name in _replaced:
            return
        _replaced[name] = _install(name)


def _returns(schema: Any) -> tuple[int, ...] | None:
    """For each return of a mutable schema, the index of the written argument it is; None if a
    return is not an argument (a fresh tensor: nothing to hand back from a cache)."""
    out = []
    for r in schema.returns:
        if r.alias_info is None:
            return None
        at = [i for i, a in enumerate(schema.arguments)
              if a.alias_info is not None and a.alias_info.before_set == r.alias_info.before_set]
        if len(at) != 1:
            return None
        out.append(at[0])
    return tuple(out)


def _install(name: str) -> Any:
    global _lib
    if name.startswith(UNCACHED):
        return None
    op, _, overload = name.partition(".")
    try:
        schema = torch._C._get_schema(op, overload)
    except RuntimeError:
        return None
    returns = _returns(schema)
    if returns is None or not torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
        return None
    original = torch.library.get_kernel(name, "Meta")
    arg_names = [a.name for a in schema.arguments]

    packet = getattr(torch.ops.aten, op[len("aten::"):])
    python_meta = getattr(packet, overload or "default").py_kernels.get(torch._C.DispatchKey.Meta)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if not args or type(args[0]) is not _KeySet:
            # Under a user's TorchDispatchMode (FlopCounterMode) PyTorch calls Python kernels
            # through its trampoline, without the key set: run the original meta kernel as
            # that path would (a Python one directly: through `original` it would come back
            # here), uncached
            if python_meta is not None:
                return python_meta(*args, **kwargs)
            return original.call_boxed(_META_KEYS, *args, **kwargs)
        ks, args = args[0], args[1:]
        if not getattr(state, "on", False):
            return original.call_boxed(ks, *args, **kwargs)
        try:
            key: Any = (name, *[signature(a) for a in args], *[(k, signature(v)) for k, v in kwargs.items()])
            verdict = _verdicts.get(key)
        except TypeError:   # an unhashable argument: not cached
            return original.call_boxed(ks, *args, **kwargs)
        if verdict is None:
            if kwargs.get("generator") is not None:   # the reference kernels refuse one ("not
                kwargs = {**kwargs, "generator": None}   # supported in refs"); shapes ignore it
            try:
                original.call_boxed(ks, *args, **kwargs)
                verdict = _PASSED
            except Exception as e:  # noqa: BLE001 - remembered and raised again below
                verdict = _in_eagers_words(name, args, kwargs, e)
            if len(_verdicts) >= _VERDICTS_MAX:
                _verdicts.clear()
            _verdicts[key] = verdict
        if verdict is not _PASSED:
            raise verdict.with_traceback(None)
        given = list(args) + [kwargs.get(n) for n in arg_names[len(args):]]
        outs = tuple(given[i] for i in returns)
        return outs[0] if len(outs) == 1 else (outs or None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "Overriding a previously registered kernel": meant
        if _lib is None:
            _lib = torch.library.Library("aten", "IMPL")
        _lib.m.impl(name[len("aten::"):], "Meta", kernel, True)
    return returns


_STAND_IN_BYTES = 64 << 20


def _in_eagers_words(name: str, args: tuple, kwargs: dict, refused: Exception) -> Exception:
    """`refused` (the meta kernel's error), or eager's error for the same call on host stand-ins
    when eager refuses it with the same exception type."""
    op_name, _, overload = name[len("aten::"):].partition(".")
    try:
        op = getattr(getattr(torch.ops.aten, op_name), overload or "default")
    except AttributeError:
        return refused
    budget = [_STAND_IN_BYTES]

    def host(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.device.type == "meta":
            budget[0] -= v.numel() * v.element_size()
            if budget[0] < 0:
                raise MemoryError
            return zeros_laid_out(v.shape, v.stride(), v.dtype, "cpu", v.storage_offset())
        if isinstance(v, (list, tuple)):
            return type(v)(host(e) for e in v)
        return v

    try:
        op(*[host(a) for a in args], **{k: host(v) for k, v in kwargs.items()})
    except MemoryError:
        return refused
    except Exception as eager:  # noqa: BLE001 - eager's words, if it refuses the call alike
        # (or says its kernel has no case for the dtype: `normal_` of an integer tensor)
        return eager if type(eager) is type(refused) or type(eager) is NotImplementedError else refused
    return refused
