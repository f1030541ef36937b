"""Where an `ltc` tensor meets one that is not lazy: writes into host tensors, below autograd.

Design note.  Functionalization (a dispatch key every user-facing `ltc` tensor carries) runs each
in-place or `out=` op as its functional twin and writes the result back into the functional
target.  When the written tensor is *not* functional -- a CPU tensor written from an `ltc` one:
`cpu.copy_(ltc)`, `load_state_dict` of an `ltc` checkpoint into a CPU model, DDP's C++ reducer
copying a broadcast back into host memory, `cpu.add_(ltc)` -- PyTorch's generated kernels stop
with an INTERNAL ASSERT ("mutating a non-functional tensor with a functional tensor is not
allowed"; its codegen exempts only XLA, and only for `copy_`).  That is one class of problem, so
it is caught at one place: a Python kernel in front of the Functionalize kernel of every aten op
that writes a tensor argument (`torch.library.get_kernel` keeps the original to call):

* every written tensor functional (all in-place ops on `ltc` tensors): the original kernel,
  unchanged (one Python frame and a type test per written argument); for `self.op_(...)` with
  only `ltc` arguments, only on the first call per signature: later calls take the original's
  steps without its meta check and dispatcher round (below, "in-place ops on `ltc` tensors");
* a host tensor indexed by `ltc` indices (`host[ltc_idx]`, `index.Tensor`, the one read op
  eager lets mix devices this way): read on the host, the result a host tensor;
* a host tensor written from `ltc` inputs: what eager does for the same mix of CPU and CUDA
  tensors.  `copy_` reads its source and copies on the host (any dtype, broadcasting, views,
  `non_blocking`: an explicit read, like `.cpu()`); `ltc` index tensors of a host `self` are
  read to the host (eager moves indices to `self`'s device); anything else raises eager's
  "Expected all tensors to be on the same device, but found at least two devices, ltc:0 and
  cpu!" before anything is written, so both tensors stay as they were.

Wrapped numbers (`x.add_(1)`: a Tensor slot holding a Python number) reach Python kernels as
Python numbers, and `call_boxed` will not take a number for a Tensor.  Such a call goes to the
overload taking a Scalar there (`add_.Scalar`: what a wrapped number means), or, where there is
none (`copy_(7)`), passes the number as a 0-dim host *stand-in* that the op path turns back into
the same number (`as_number`, used by `trace.py`), so the traced node is unchanged.  The
kernels are registered from schemas and qualified names at import (no OpOverload objects).

`set_` with a functional `ltc` target and a host source raises the same device error
(functionalization would say "not a FunctionalTensor. Please file an issue").  `t.set_(t)` (what
`parametrize.register_parametrization` does to a weight when the parametrization has no
`right_inverse`) is the no-op it is in eager: functionalization would freeze `t`'s storage,
and every later in-place update of the weight (an optimizer step) would fail.

Thread safety: the kernels keep no state but `stand_ins`, keyed by `id` of tensors alive for
the duration of the call that made them (added before, removed after, single dict operations
under the GIL), so a tracing thread only ever finds its own stand-ins; `_siblings` is a cache
of values computed from its key alone (a racing miss computes the same value twice).
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..base import counters
from ..executor import graph_executor as gx
from ..ir.schema import aten_schemas, op_info
from ..tensor.dispatch import dispatch
from ..tensor.lazy_tensor import inner_of, unwrap, wrap
from ..tensor.lazy_tensor import tensors_in as _tensors
from ..tensor.shapes import signature
from ..tensor.trace import stand_ins
from ..tensor.writeback import update
from . import inplace, meta_checks

_is_functional = torch._is_functional_tensor
_Tensor = torch.Tensor
aten = torch.ops.aten

# -- wrapped numbers ------------------------------------------------------------------------------

# the dtype eager gives a wrapped number of each Python type (`scalar_to_tensor`)
_WRAPPED_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
_PU1 = torch._C.DispatchKey.PrivateUse1   # in the dispatch key set of every call on ltc tensors

def _number_tensor(v: Any, register: bool, made: list) -> Any:
    dtype = _WRAPPED_DTYPE.get(type(v))
    if dtype is None:
        return v
    if dtype is torch.int64 and not -(1 << 63) <= v < (1 << 63):
        dtype = torch.uint64   # eager's wrapped number for ints up to 2**64 - 1 (else it raises)
    t = torch.tensor(v, dtype=dtype)
    if register:
        stand_ins[id(t)] = v
        made.append(t)
    return t


# `aten::name.overload` -> its original Functionalize kernel (`register`); the schemas of the ops
_originals: dict[str, Any] = {}
_schemas: dict[str, Any] = {}
_siblings: dict[tuple, Any] = {}   # (name, Tensor slots holding numbers) -> Scalar twin's | None


def _qualname(schema: Any) -> str:
    return schema.name + ("." + schema.overload_name if schema.overload_name else "")


def _scalar_sibling(name: str, numbers: tuple) -> str | None:
    """The overload of `name` that takes Scalars where it takes the Tensors at `numbers`
    (`add_.Scalar` for `add_.Tensor`), everything else alike; None if there is none."""
    key = (name, numbers)
    if key not in _siblings:
        found = None
        mine = _schemas[name].arguments
        base = name.split(".")[0]
        for cand, schema in _schemas.items():
            theirs = schema.arguments
            if cand == name or schema.name != base or len(theirs) != len(mine):
                continue
            if all(a.name == b.name and (isinstance(b.type, torch._C.NumberType) if i in numbers
                                          else str(a.type) == str(b.type))
                   for i, (a, b) in enumerate(zip(mine, theirs))):
                found = cand
                break
        _siblings[key] = found
    return _siblings[key]


def _numbers_in_tensor_slots(args: tuple, kwargs: dict, slots: tuple) -> tuple:
    return tuple(i for i, name in slots
                 if (i < len(args) and type(args[i]) in _WRAPPED_DTYPE)
                 or (i >= len(args) and type(kwargs.get(name)) in _WRAPPED_DTYPE))


def _call(op: str, ks: Any, args: tuple, kwargs: dict, slots: tuple, lazy: bool = False) -> Any:
    """The original Functionalize kernel of `op` (a qualified name).  A number in a Tensor slot (which
    `call_boxed` refuses) goes to the overload taking a Scalar there (`add_.Scalar`: what eager's
    wrapped numbers mean); without one, it is passed as a 0-dim host tensor of its wrapped
    dtype, a stand-in for calls on `ltc` tensors.  `lazy`: it writes ltc tensors, so its meta
    check is cached (`meta_checks.py`)."""
    numbers = _numbers_in_tensor_slots(args, kwargs, slots)
    target = op if not numbers else (_scalar_sibling(op, numbers) or op)
    if lazy:
        meta_checks.ensure(target)
        state = meta_checks.state
        before, state.on = getattr(state, "on", False), True
        try:
            return _call_original(op, target, numbers, ks, args, kwargs, slots)
        finally:
            state.on = before
    return _call_original(op, target, numbers, ks, args, kwargs, slots)


def _call_original(op: str, target: str, numbers: tuple, ks: Any, args: tuple, kwargs: dict,
                   slots: tuple) -> Any:
    if not numbers or target != op:
        return _originals[target].call_boxed(ks, *args, **kwargs)
    register = ks.has(_PU1)
    made: list[torch.Tensor] = []
    try:
        for i, name in slots:
            if i < len(args):
                args = args[:i] + (_number_tensor(args[i], register, made),) + args[i + 1:]
            elif name in kwargs:
                kwargs = {**kwargs, name: _number_tensor(kwargs[name], register, made)}
        return _originals[op].call_boxed(ks, *args, **kwargs)
    finally:
        for t in made:
            stand_ins.pop(id(t), None)


# -- the seam -------------------------------------------------------------------------------------

def _lazy(t: torch.Tensor) -> bool:
    return _is_functional(t) and t.device.type == "ltc"


def _host(t: torch.Tensor) -> bool:
    """A written tensor functionalization cannot write: not functional, not an `ltc` tensor
    below functionalization (the engine's own)."""
    return not _is_functional(t) and t.device.type != "ltc"


def _read(values: list, device: Any = None) -> list:
    """`values` with every `ltc` tensor replaced by its value on the backing device (or on
    `device`): one explicit read, like `.cpu()`, for all of them (one graph cut, one wait)."""
    lazy = [i for i, v in enumerate(values) if isinstance(v, _Tensor) and _lazy(v)]
    if not lazy:
        return values
    counters.counter("TensorToHost", len(lazy))
    counters.round_trip("read", "copy to a host tensor")
    read = gx.read([unwrap(values[i]) for i in lazy])
    out = list(values)
    for i, v in zip(lazy, read):
        out[i] = v if device is None else v.to(device)
    return out


def _mismatch(lazy: torch.Tensor, host: torch.Tensor, name: str, written_host: bool = True) -> RuntimeError:
    why = (f": a {host.device} tensor cannot be written from {lazy.device.type} tensors in place; read "
           f"them first, e.g. with .cpu(), or copy with {host.device.type}_tensor.copy_(ltc_tensor)"
           if written_host else "")
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{lazy.device} and {host.device}! (when checking arguments for {name}{why})")


_COPIES = {aten.copy_.default, aten._foreach_copy_.default}
_SETS = {"aten::set_.source_Tensor", "aten::set_.source_Tensor_storage_offset"}


def _seam(op: Any, info: Any, args: tuple, kwargs: dict) -> Any:
    """A host tensor written from `ltc` inputs: eager's answer for the same CPU/CUDA mix."""
    full = info.bind(args, kwargs)
    written = set(info.written)
    host = next(t for i in info.written for t in _tensors(full[i]) if _host(t))
    lazy = [(i, t) for i, v in enumerate(full) if i not in written for t in _tensors(v) if _lazy(t)]
    if op in _COPIES:
        src = full[1]
        with torch.no_grad():
            value = _read([src])[0] if isinstance(src, _Tensor) else _read(list(src))
            op(full[0], value, *full[2:])
        return full[0] if op._schema.returns else None
    if op is aten.resize_as_.default:   # reads the template's shape only
        return aten.resize_.default(full[0], list(full[1].shape), memory_format=full[2])
    if all(i in info.index_lists for i, _ in lazy):
        # eager moves index tensors to `self`'s device (`make_info` in TensorAdvancedIndexing)
        for i in {i for i, _ in lazy}:
            full[i] = _read(list(full[i]), host.device)
        a, k = info.split(full)
        return op(*a, **k)
    raise _mismatch(lazy[0][1], host, info.name)


def _overload(name: str) -> Any:
    base, _, overload = name[len("aten::"):].partition(".")
    return getattr(getattr(aten, base), overload or "default")


def _kernel(schema: Any) -> Callable[..., Any]:
    name = _qualname(schema)
    written = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write)
    slots = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                  if isinstance(a.type, torch._C.TensorType)
                  and not (a.alias_info is not None and a.alias_info.is_write))
    sets = name in _SETS
    # an `out=` overload writing one kwarg-only tensor (`add.out`): eager refuses an `out` that
    # partially overlaps an input, which functionalization (reading inputs first) would not
    kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}
    out_arg = written[0][1] if len(written) == 1 and written[0][1] in kwarg_only else None
    op: list = []   # the OpOverload, made on the first seam call (not at import: 1200 of them)
    # `self.op_(...)` returning `self`, nothing else written: the fast path below may take it
    writes_self = written == ((0, "self"),) and len(schema.returns) == 1 and \
        schema.returns[0].alias_info is not None and out_arg is None

    def kernel(ks: Any, *args: Any, **kwargs: Any) -> Any:
        for i, arg in written:
            v = args[i] if i < len(args) else kwargs.get(arg)
            if isinstance(v, _Tensor):
                if _host(v):
                    break
            elif isinstance(v, (list, tuple)) and any(_host(t) for t in v if isinstance(t, _Tensor)):
                break
        else:
            if sets and isinstance(args[1], _Tensor) and _host(args[1]):
                # `ltc.set_(cpu)`: eager refuses a storage of another device; functionalization
                # would say "not a FunctionalTensor. Please file an issue"
                raise _mismatch(args[0], args[1], name.split("::")[-1], written_host=False)
            if sets and len(args) == 2 and args[1] is args[0]:
                return args[0]   # `t.set_(t)` is a no-op; functionalization would freeze `t`
            lazy = _writes_lazy(args, kwargs)
            if lazy and out_arg is not None:
                if not op:
                    op.append(_overload(name))
                _check_out_overlap(op[0], out_arg, args, kwargs)
            if lazy and writes_self:
                return _write_self(name, ks, args, kwargs, slots)
            return _call(name, ks, args, kwargs, slots, lazy=lazy)
        if not op:
            op.append(_overload(name))
        info = op_info(op[0])
        if not any(_lazy(t) for i, v in enumerate(info.bind(args, kwargs)) for t in _tensors(v)):
            return _call(name, ks, args, kwargs, slots)   # not ours: PyTorch's own answer
        return _seam(op[0], info, args, kwargs)
    return kernel


# -- in-place ops on `ltc` tensors, after their first call per signature -----------------------
#
# Functionalization's kernel for `x.op_(...)` runs the op on meta copies of the arguments (a
# check; `meta_checks.py` caches its verdict), calls the functional `op` on the unwrapped
# arguments through the dispatcher, and makes `x` take the result (`replace_`, `commit_update`,
# `sync`).  Once a signature (`shapes.signature` of every argument: what the meta check can see)
# has passed that path, later calls with the same signature skip the check and the dispatcher:
# the functional op goes straight into the op path (`dispatch`), and `x` takes the result by the
# same three calls (`writeback.update`).  The node traced, the wrapper's state and autograd's (recorded above this
# key, by the same C++ kernels as before) are what the full path gives.  Taken only when every
# tensor argument is an `ltc` tensor, no Python dispatch mode is active (a mode must see the
# functional op) and the op has a functional twin with the same arguments; anything else, and
# every first call, takes functionalization's own kernel.
#
# Thread safety: `_verified` and `_twins` are plain dicts of values computed from their keys alone
# (a racing miss runs the full path twice and stores the same entry).

_verified: dict[tuple, Any] = {}   # signature -> the functional twin to call
_VERIFIED_MAX = 1 << 14
_twins: dict[str, Any] = {}        # in-place overload name -> its functional twin, or None
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _functional_twin(name: str) -> Any:
    """`aten::pow.Tensor_Scalar` for `aten::pow_.Scalar`: the functional overload of an in-place
    one, with the same argument names and types and one fresh tensor returned; None if none."""
    twin = _twins.get(name, False)
    if twin is not False:
        return twin
    twin = None
    mine = _schemas[name]
    if name.startswith(meta_checks.UNCACHED):   # writes that read storage sizes: the full path
        _twins[name] = None
        return None
    base = mine.name[:-1]
    for schema in aten_schemas():
        if schema.name != base or len(schema.arguments) != len(mine.arguments) or schema.is_mutable:
            continue
        if len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor" or \
                schema.returns[0].alias_info is not None:   # `t` for `t_`: a view, not a twin
            continue
        if all(a.name == b.name and str(a.type) == str(b.type) and a.kwarg_only == b.kwarg_only
               for a, b in zip(schema.arguments, mine.arguments)):
            twin = _overload(_qualname(schema))
            break
    _twins[name] = twin
    return twin


def _inner_arguments(args: tuple, kwargs: dict) -> tuple[list, dict] | None:
    out: list[Any] = []
    for v in args:
        if isinstance(v, _Tensor):
            v = inner_of(v)
            if v is None:
                return None
        elif type(v) is list or type(v) is tuple:
            lst = []
            for e in v:
                if isinstance(e, _Tensor):
                    e = inner_of(e)
                    if e is None:
                        return None
                lst.append(e)
            v = lst
        out.append(v)
    inner_kwargs = {}
    for k, v in kwargs.items():
        if isinstance(v, _Tensor):
            v = inner_of(v)
            if v is None:
                return None
        elif type(v) is list or type(v) is tuple:
            return None
        inner_kwargs[k] = v
    return out, inner_kwargs


def _write_self(name: str, ks: Any, args: tuple, kwargs: dict, slots: tuple) -> Any:
    """`self.op_(...)` on an `ltc` tensor: the full path on a signature's first call, the fast
    path after (see above)."""
    try:
        key: Any = (name, *[signature(a) for a in args], *[(k, signature(v)) for k, v in kwargs.items()])
        functional = _verified.get(key)
    except Exception:  # noqa: BLE001 - an unhashable argument, a tensor subclass without a
        # shape (`UninitializedParameter`): the full path every time, which says what it means
        return _call(name, ks, args, kwargs, slots, lazy=True)
    if functional is not None and not _dispatch_modes():
        inner = _inner_arguments(args, kwargs)
        if inner is not None:
            self = args[0]
            update(self, dispatch(functional, tuple(inner[0]), inner[1] or None))
            return self
    result = _call(name, ks, args, kwargs, slots, lazy=True)
    if functional is None:
        # a number in a Tensor slot goes to the overload taking a Scalar there (`_call`)
        numbers = _numbers_in_tensor_slots(args, kwargs, slots)
        target = name if not numbers else _scalar_sibling(name, numbers)
        twin = _functional_twin(target) if target is not None else None
        if twin is not None:
            if len(_verified) >= _VERIFIED_MAX:
                _verified.clear()
            _verified[key] = twin
    return result


def _check_out_overlap(op: Any, out_arg: str, args: tuple, kwargs: dict) -> None:
    """`torch.add(z[1:], 1, out=z[:-1])`: eager's error for an `out` sharing memory with an
    input other than exactly (the check and its CPU stand-ins are `inplace.py`'s)."""
    out = kwargs.get(out_arg)
    rest = {k: v for k, v in kwargs.items() if k != out_arg}
    if not isinstance(out, _Tensor) or not inplace.aliased_argument(out, args, rest):
        return
    inplace.check_aliasing_like_eager(out, lambda o, *a, **k: op(*a, **k, **{out_arg: o}), args, rest)


def _writes_lazy(args: tuple, kwargs: dict) -> bool:
    """Does this in-place / out= call write an ltc tensor?  (Its first written argument tells:
    a call writes tensors of one device.)"""
    v = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return isinstance(v, _Tensor) and v.device.type == "ltc"


def _index_kernel(ks: Any, self: torch.Tensor, indices: list) -> Any:
    """`host[ltc_idx]`: eager moves index tensors to `self`'s device (`make_info`), so the result
    is a host tensor.  `ltc[ltc_idx]` (PyG's gathers, boolean masks) goes straight into the op
    path on the unwrapped tensors, as functionalization's fallback would send it, without that
    second trip through the dispatcher and Python (19 -> 14.5 us).  Every other call (a user
    dispatch mode, host index tensors) takes functionalization's fallback."""
    if _host(self):
        if any(isinstance(i, _Tensor) and _lazy(i) for i in indices):
            return aten.index.Tensor(self, _read(list(indices), self.device))
    elif not _dispatch_modes():
        inner = _inner_arguments((self, indices), {})
        if inner is not None:
            return wrap(dispatch(aten.index.Tensor, tuple(inner[0]), None))
    return _originals["aten::index.Tensor"].call_boxed(ks, self, indices)


def _written_schemas() -> list[Any]:
    """Schemas of the aten ops that write a tensor argument and have a Functionalize kernel of
    their own (read from strings only: no OpOverload objects at import)."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    found = []
    for schema in aten_schemas():
        if not schema.name.startswith("aten::") or not schema.is_mutable:
            continue
        if not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            continue
        try:
            if has_kernel(_qualname(schema), "Functionalize"):
                found.append(schema)
        except RuntimeError:  # a schema without a registered operator
            continue
    return found


_libs: list = []


def _patch_ctc_lengths() -> None:
    """`F.ctc_loss(ltc_log_probs, ltc_targets, cpu_lengths, cpu_lengths)`: eager CUDA reads
    length tensors on the host wherever they are (and moves the clamped target lengths to the
    device for `reduction="mean"`); PyTorch's composite `ctc_loss` divides by the host tensor
    there, which a lazy device refuses.  Host lengths are already host values: they are passed
    as the lists the `IntList` overload takes (no read, the same computation)."""
    original = F.ctc_loss

    @functools.wraps(original)
    def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any,
                 target_lengths: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(log_probs, _Tensor) and log_probs.device.type == "ltc":
            lengths = [v.tolist() if isinstance(v, _Tensor) and v.device.type == "cpu" and v.dim() == 1
                       and not v.is_floating_point() else v for v in (input_lengths, target_lengths)]
            if not any(isinstance(v, _Tensor) for v in lengths):   # the overload takes both as lists
                input_lengths, target_lengths = lengths
        return original(log_probs, targets, input_lengths, target_lengths, *args, **kwargs)
    F.ctc_loss = ctc_loss


def register() -> None:
    """Put the seam kernel in front of every written op's Functionalize kernel (once)."""
    _patch_ctc_lengths()
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "Overriding a previously registered kernel": meant
        schemas = _written_schemas()
        for schema in schemas:
            name = _qualname(schema)
            _schemas[name] = schema
            _originals[name] = torch.library.get_kernel(name, "Functionalize")
        for schema in schemas:
            lib.m.impl(_qualname(schema)[len("aten::"):], "Functionalize", _kernel(schema), True)
        _originals["aten::index.Tensor"] = torch.library.get_kernel("aten::index.Tensor", "Functionalize")
        lib.m.impl("index.Tensor", "Functionalize", _index_kernel, True)
    _libs.append(lib)
