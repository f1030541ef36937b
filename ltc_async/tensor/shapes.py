"""Shape inference (LTC's `shape_inference` + shape cache): output metas of an op at trace time.

Design note.  The op runs on `meta` tensors built from its inputs' metas, so a shape error
raises at the user's line, exactly as eager would raise it.  Results are cached by
(op, template, input metas): a repeated op costs one dict lookup.  An op with no meta kernel, or
whose output shape depends on values, gets the answer `FALLBACK`: it runs eagerly on the host.
For the `x_copy` ops functionalization produces, the strides are those of the view op `x`
(what eager would report).

Meta kernels check shapes, but not always dtypes: `mm` on meta takes `float16 @ float32`, which
every eager kernel rejects, and `argmax` a bool tensor.  So a signature whose tensor inputs mix
floating-point dtypes, or include a bool or integer tensor, is also run once by eager on the
backing device (`_run_like_eager`), on zero-filled stand-ins with the inputs' shapes and strides:
eager's error, at the user's line, instead of a failed execution later.  Meta kernels also type some outputs after CUDA: `native_layer_norm` and
`native_batch_norm` give float32 mean/rstd for bf16 inputs, where the CPU kernels keep bf16.  So
an op with several outputs over bf16/fp16 inputs is run by eager the same way and its outputs
take eager's dtypes: the metas are what the device will produce (a bf16 layer norm's backward
otherwise mixed dtypes eager never sees).  Other signatures (nearly all) never pay for it; these
once, as the result is cached with the shapes.

Threads: the cache is a plain dict read and filled without a lock by every tracing thread: a
racing miss runs the meta kernel twice and keeps one equal answer.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..executor import arena
from ..ir.node import TensorMeta
from ..ir.schema import GENERATOR, OpInfo
from .lazy_tensor import LtcTensor

FALLBACK = "fallback"                  # shape-cache value: run this signature eagerly


class Promoted:
    """Shape-cache value of a signature whose result dtype the default dtype decided (an integer
    tensor and a Python float): traced as the same op on inputs cast to `dtype` (`trace.py`)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


ONE = (None,)                          # the out_spec of one tensor output (compared by identity)
# (op, template, *input metas) -> (output metas, out_spec, node key) | FALLBACK | Promoted, where the node
# key `(op, template)` is made once and shared by the nodes of the signature (see `trace.py`)
cache: dict[tuple, Any] = {}
_CACHE_MAX = 1 << 16
_META = torch.device("meta")
_COPY = torch.ops.aten.copy.default


def remember(key: tuple, res: Any) -> None:
    if len(cache) >= _CACHE_MAX:  # programs with endless new shapes
        cache.clear()
    cache[key] = res


def signature(v: Any) -> Any:
    """An argument as the key of a per-signature cache of a meta run (the in-place foreach
    ops' argument checks, in-place result dtypes): what such a run can depend on -- a lazy
    tensor's meta, another tensor's type, device, shape, strides and dtype, list lengths,
    number types (and int values: `pow` rejects negative integer exponents of integer tensors);
    anything else as it is."""
    t = type(v)
    if t is LtcTensor:
        return v._m
    if t is list or t is tuple:   # lazy tensors inline: optimizer lists are long
        return (t, *[e._m if type(e) is LtcTensor else signature(e) for e in v])
    if t is float or t is complex:
        return t
    if t is int or t is bool:
        return (t, v)
    if isinstance(v, torch.Tensor):
        return (t, v.device, tuple(v.shape), v.stride(), v.dtype)
    if t is torch.Generator:   # its state decides values, never shapes
        return t
    return v


def to_meta(v: Any) -> Any:
    if type(v) is LtcTensor:
        m = v._m
        return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=_META)
    if isinstance(v, torch.Tensor):
        return v.to(_META)
    if isinstance(v, torch.device) and v.type == "ltc":
        return _META
    if isinstance(v, torch.Generator):
        return None
    if type(v) is list or type(v) is tuple:
        return [to_meta(e) for e in v] if any(isinstance(e, torch.Tensor) for e in v) else v
    return v


def call(func: Any, info: OpInfo, full: list) -> Any:
    args, kwargs = info.split(full)
    return func(*args, **kwargs)


def infer(func: Any, info: OpInfo, full: list) -> Any:
    """Output metas by running the op on meta tensors.  User errors propagate unchanged."""
    margs = [to_meta(v) for v in full]
    for i, k in enumerate(info.kinds):
        if k == GENERATOR:
            margs[i] = None
    by_eager = False   # the metas are eager's (meta refused what the backing device takes)
    try:
        out = call(func, info, margs)
    except NotImplementedError:
        return FALLBACK
    except RuntimeError as e:
        # data-dependent shapes (repeat_interleave without output_size, ...): only the values
        # can tell, so the op runs eagerly
        if info.dynamic_shape and "meta" in str(e).lower():
            return FALLBACK
        # a user's `torch.library.custom_op` without `register_fake`: eager runs it on any
        # device, so it runs eagerly on the host (an eager fallback, counted and reported)
        if "no fake impl registered" in str(e) and not info.qualname.startswith(("aten::", "prims::")):
            return FALLBACK
        if info.seeded:   # eager's error (`randn(3, dtype=torch.int64)`: NotImplementedError)
            _sample_like_eager(func, info, full)
            raise
        # eager's words for the same mistake, if it agrees; if the backing device's kernel takes
        # the call, its result stands: a meta kernel may hold a rule of another device's kernels
        # (`_grouped_mm` demands bf16, as CUDA's does; the CPU's computes float32)
        # (not for the copies functionalization makes of view ops: eager's `view_copy` takes
        # geometries the view it stands for refuses, `x[..., 1:].view(-1)`)
        eager = _raise_eagers_error(func, info, full)
        if eager is None or info.view_op is not None:
            raise
        out, by_eager = _as_meta(eager), True
    if by_eager:
        pass   # eager's own metas: nothing to check them against
    elif not info.seeded:
        eager = _run_like_eager(func, info, full, out)
        if eager is not None:
            out = _with_dtypes_of(out, eager)
    elif _small(out):
        _sample_like_eager(func, info, full)
    if func in _CONVOLUTIONS:
        out = _conv_layout(func, full, out)
    if info.view_op is not None:  # eager's strides for view ops functionalization turned into copies
        try:
            out = call(info.view_op, info, margs)
        except Exception:  # noqa: BLE001 - the copy op's result above is still right
            pass
    metas: list[TensorMeta] = []
    spec: list[Any] = []
    for r in (out if isinstance(out, tuple) else (out,)):
        if isinstance(r, torch.Tensor) and r.layout is not torch.strided:
            raise _not_dense(info, r.layout)
        if r is None:
            spec.append(False)
        elif isinstance(r, torch.Tensor):
            spec.append(None)
            metas.append(TensorMeta(tuple(r.shape), tuple(r.stride()), r.dtype))
        else:
            spec.append(len(r))
            metas.extend(TensorMeta(tuple(e.shape), tuple(e.stride()), e.dtype) for e in r)
    return tuple(metas), (ONE if spec == [None] else tuple(spec))


def _not_dense(info: OpInfo, layout: Any) -> RuntimeError:
    """A sparse (or other non-strided) result, which a lazy tensor cannot hold: `.to("ltc:0")` of
    a sparse tensor builds one from its uploaded indices and values."""
    return RuntimeError(f"ltc_async: {info.name} would make a {layout} tensor on an ltc device: lazy "
                        f"tensors are dense (torch.strided); convert it first, e.g. with .to_dense()")


def _lazy_inputs(full: list) -> list[LtcTensor]:
    found = []
    for v in full:
        if type(v) is LtcTensor:
            found.append(v)
        elif type(v) is list or type(v) is tuple:
            found.extend(e for e in v if type(e) is LtcTensor)
    return found


def _stand_in(t: LtcTensor) -> torch.Tensor:
    """Zeros with `t`'s shape, strides and dtype on its backing device."""
    m = t._m
    return zeros_laid_out(m.shape, m.stride, m.dtype, t._ctx.backend_device)


def zeros_laid_out(shape: Any, stride: Any, dtype: torch.dtype, device: Any, offset: int = 0) -> torch.Tensor:
    """Zeros viewed with exactly this geometry (overlapping and expanded strides too): the
    smallest storage it needs, from `offset` on."""
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
    return torch.zeros(offset + extent, dtype=dtype, device=device).as_strided(shape, stride, offset)


_LOW = (torch.bfloat16, torch.float16)
_INTEGRAL_OPS = ("bitwise_", "gcd", "lcm", "__lshift__", "__rshift__")


def _run_like_eager(func: Any, info: OpInfo, full: list, out: Any) -> Any:
    """Run the op once by eager on the backing device, on stand-ins, where meta may disagree
    with it; return eager's result, or None when meta is trusted.

    Three cases: inputs mixing floating-point dtypes, which meta accepts where eager kernels
    refuse them (eager's error, raised here, at the user's line); bool or integer inputs, which
    many meta kernels accept where the eager kernel has no case for the dtype (`argmax` of a
    bool tensor, `softmax` of a long one: eager's error if it is about the dtype; an error that
    the stand-ins' zeros cause is not the user's and is dropped); and ops with several outputs
    over bf16/fp16 inputs, whose auxiliary outputs meta types after CUDA (`native_layer_norm`'s
    mean and rstd in float32) while the CPU kernels keep the input's dtype: the metas must be
    the dtypes the device will produce, or the backward pass mixes dtypes eager never sees."""
    if func is _COPY:  # converting dtypes is what it is for
        return None
    inputs = _lazy_inputs(full)
    if inputs and all(0 in t._m.shape for t in inputs) and not info.seeded and _small(out):
        # empty inputs: stand-ins are exact (no values), and meta kernels skip checks eager makes
        # (`max()` of an empty tensor: "Expected reduction dim to be specified").  Not where the
        # result is large: `empty_buffer.new_zeros(n)` must not allocate n elements on the host
        return _on_stand_ins(func, info, full, inputs)
    floats = {t._m.dtype for t in inputs if t._m.dtype.is_floating_point or t._m.dtype.is_complex}
    several = isinstance(out, (tuple, list)) and len(out) > 1 and not floats.isdisjoint(_LOW)
    # a bool or integer input, an op defined for integers only (meta takes floats), or a
    # floating-point index (meta kernels such as index_select's do not check its dtype)
    exact = any(not (t._m.dtype.is_floating_point or t._m.dtype.is_complex) for t in inputs) \
        or info.name.startswith(_INTEGRAL_OPS) \
        or any(n in _INDEX_ARGS and type(v) is LtcTensor for n, v in zip(info.arg_names, full))
    if len(floats) < 2 and not several and not exact:
        return None
    try:
        return _on_stand_ins(func, info, full, inputs)
    except RuntimeError as e:
        if not exact or len(floats) >= 2 or several or _about_dtypes(str(e), inputs):
            raise
        return None  # an error of the stand-ins' zero values (a zero-sum multinomial, ...)


_INDEX_ARGS = ("index", "indices")
_CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


def _conv_layout(func: Any, full: list, out: Any) -> Any:
    """Convolutions keep channels-last: eager (CPU's oneDNN and slow paths, cuDNN alike) makes
    the output and the gradients channels-last when the input or the weight is, where the meta
    kernel answers contiguous outside CUDA.  `full`: convolution's (input, weight, ...) or
    convolution_backward's (grad_output, input, weight, ...)."""
    x, w = (full[0], full[1]) if func is _CONVOLUTIONS[0] else (full[1], full[2])
    rank = len(x._m.shape) if isinstance(x, LtcTensor) else 0
    if rank not in (4, 5):
        return out
    fmt = torch.channels_last if rank == 4 else torch.channels_last_3d
    if not any(isinstance(t, LtcTensor) and _is_channels_last(t._m, fmt) for t in (x, w)):
        return out
    outs = tuple(r.contiguous(memory_format=fmt) if isinstance(r, torch.Tensor) and r.dim() == rank else r
                 for r in (out if isinstance(out, tuple) else (out,)))
    return outs if isinstance(out, tuple) else outs[0]


def _is_channels_last(m: TensorMeta, fmt: torch.memory_format) -> bool:
    t = torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
    return t.is_contiguous(memory_format=fmt) and not t.is_contiguous()


_STAND_IN_BYTES = 64 << 20   # eager's re-run of a failed call allocates its inputs as zeros


def _raise_eagers_error(func: Any, info: OpInfo, full: list) -> Any:
    """A call meta refused: run it by eager on stand-ins and raise eager's error where eager
    refuses it too (the messages users know: "mat1 and mat2 shapes cannot be multiplied"
    rather than the meta kernel's "a and b must have same reduction dim").  Returns eager's
    result where eager takes it, None where the inputs are too large to make or eager fails
    otherwise (meta's error then stands)."""
    inputs = _lazy_inputs(full)
    if not inputs or info.seeded or sum(math.prod(t._m.shape) * t._m.dtype.itemsize for t in inputs) > _STAND_IN_BYTES:
        return None
    try:
        return _on_stand_ins(func, info, full, inputs)
    except (RuntimeError, IndexError, ValueError, TypeError) as e:
        raise e.with_traceback(None) from None
    except Exception:  # noqa: BLE001 - anything else: meta's error stands
        return None


def _as_meta(out: Any) -> Any:
    """Eager's outputs as meta tensors of the same geometry (what shape inference keeps)."""
    if isinstance(out, torch.Tensor):
        return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=_META)
    if isinstance(out, (tuple, list)):
        return type(out)(_as_meta(o) for o in out)
    return out


def _sample_like_eager(func: Any, info: OpInfo, full: list) -> None:
    """A random op, run once per signature by eager on ones (a value no sampler refuses) with a
    generator of its own (the user's streams do not move): eager's error for what its kernels
    refuse -- `rand(3, dtype=torch.int64)`, `bernoulli` of an integer tensor, `multinomial(p,
    0)` -- raised at the line, where meta kernels accept the call and the device would fail at
    the next barrier."""
    lazy = _lazy_inputs(full)
    device = lazy[0]._ctx.backend_device if lazy else next(
        (v for v in full if isinstance(v, torch.device)), torch.device("cpu"))
    if isinstance(device, torch.device) and device.type == "ltc":
        device = arena.get(device).backend_device
    if sum(t._m.dtype.itemsize * math.prod(t._m.shape) for t in lazy) > _STAND_IN_BYTES:
        return
    args = []
    for k, v in zip(info.kinds, full):
        if type(v) is LtcTensor:
            v = torch.ones(v._m.shape, dtype=v._m.dtype, device=device)
        elif k == GENERATOR:
            v = torch.Generator(device=device)
        elif isinstance(v, torch.device) and v.type == "ltc":
            v = device
        args.append(v)
    call(func, info, args)


def _small(out: Any) -> bool:
    """Meta outputs of at most `_STAND_IN_BYTES` in all."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor)) <= _STAND_IN_BYTES


def _on_stand_ins(func: Any, info: OpInfo, full: list, inputs: list[LtcTensor]) -> Any:
    """The call by eager on the backing device, the lazy tensors (`inputs`) as stand-ins."""
    return call(func, info, [_real(v, inputs[0]._ctx.backend_device) for v in full])


def _real(v: Any, device: torch.device) -> Any:
    """An argument for eager's run: lazy tensors as stand-ins, the ltc device as the backing
    one.  (A module function, not a closure: a recursive closure is a reference cycle, which
    would keep a compiled graph's capture-time tensors alive, and pending, until a gc.)"""
    if type(v) is LtcTensor:
        return _stand_in(v)
    if isinstance(v, torch.device) and v.type == "ltc":
        return device
    if type(v) is list or type(v) is tuple:
        return [_real(e, device) for e in v] if any(isinstance(e, torch.Tensor) for e in v) else v
    return v


def _about_dtypes(message: str, inputs: list[LtcTensor]) -> bool:
    """Whether eager's error on zero-filled stand-ins is about the inputs' dtypes (an eager
    kernel with no case for them: "argmax(): does not support bool input", '"softmax" not
    implemented for 'Long'') rather than about zeros, which the real values may not be."""
    low = message.lower()
    if "zero" in low:   # "ZeroDivisionError", a zero-sum multinomial: the stand-ins' values
        return False
    if any(k in low for k in ("dtype", "floating point", "integral", "integer", "not implemented for",
                              "scalar type")):
        return True     # ... "Integers to negative integer powers are not allowed." too
    names = {str(t._m.dtype).removeprefix("torch.") for t in inputs}
    return any(n in low for n in names) or ("bool" in names and "boolean" in low)


def _with_dtypes_of(out: Any, eager: Any) -> Any:
    """Meta outputs retyped as eager's (shapes and strides stay meta's)."""
    if isinstance(out, torch.Tensor):
        if isinstance(eager, torch.Tensor) and eager.dtype != out.dtype:
            return torch.empty_strided(out.shape, out.stride(), dtype=eager.dtype, device=_META)
        return out
    if isinstance(out, (tuple, list)) and isinstance(eager, (tuple, list)) and len(out) == len(eager):
        return type(out)(_with_dtypes_of(o, e) for o, e in zip(out, eager))
    return out
