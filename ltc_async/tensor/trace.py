"""The generic op path: record one aten call as an IR node (LTC's generated lazy kernels).

Design note.  `trace()` binds a call to its schema (see `ir/schema.py`) and builds the node:

1. tensors become operands; Python numbers in Scalar/Tensor slots become runtime scalars
   (keyed by type only, so a new learning rate does not recompile); `Generator?` slots get a
   per-device seed; everything else is a constant of the node's template;
2. host tensors among the arguments are uploaded (0-dim ones cached by value);
3. shape inference (`shapes.py`) gives the output metas, or says the op must run eagerly, which
   it also must when the backend cannot lower it (`eager_fallback` in `host.py`);
4. outputs become lazy tensors naming the node; identity ops name their input's value when
   the layout stays the same.

On a shape-cache hit, the common case, a per-overload plan (the end of this module) does steps
1 and 4 straight from the arguments; everything else comes here.

Invariant: a lazy tensor's strides (its `TensorMeta`) are the strides its value has when the
graph runs.  Eager kernels such as `native_group_norm_backward` read raw memory and rely on
callers' `.contiguous()`; a tensor claiming a layout its value lacks gives garbage there.

Threads: no lock of its own.  The per-op plans and the shape cache are plain dicts filled by
every tracing thread (see `dispatch.py`: values depend only on their keys); a new output is
registered as live with its device (`DeviceContext.register`, a dict store under the GIL), and
tracing never waits for a device.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..base import counters
from ..base.callsite import caller_location
from ..base.config import config
from ..executor import arena
from ..executor.device import DeviceContext
from ..ir.device_checks import takes_cpu_scalars
from ..ir.node import RNG, SCALAR, TENSOR, TENSOR_LIST, Node, TensorMeta, exact
from ..ir.schema import CONST, GENERATOR, NUM_CONST, OPT_TENSOR, OpInfo, op_info
from ..ir.schema import SCALAR as K_SCALAR
from ..ir.schema import TENSOR as K_TENSOR
from ..ir.schema import TENSOR_LIST as K_TENSOR_LIST
from . import shapes
from .host import eager_fallback, scalar_node, seed_from, upload
from .lazy_tensor import LtcTensor, make_tensor

# Wrapped numbers: 0-dim host tensors that `patches/seam.py` made from Python numbers in Tensor
# slots (routing them to Scalar overloads where eager would); traced as the numbers again.
stand_ins: dict[int, Any] = {}   # id(0-dim host tensor) -> the Python number it stands for
NOT_A_STAND_IN = object()


def as_number(t: torch.Tensor) -> Any:
    """The Python number a 0-dim host tensor stands for, or `NOT_A_STAND_IN`."""
    return stand_ins.get(id(t), NOT_A_STAND_IN) if stand_ins else NOT_A_STAND_IN

aten = torch.ops.aten
_SCALAR_TYPES = (int, float)  # bools stay constants: TorchScript has no bool Scalar
_INT64 = 1 << 63              # eager takes ints up to 2**64 - 1 as Scalars; TorchScript's int is int64

# Ops that read memory layout: always run eagerly on values restrided to eager's layout, as
# the op given here.  `as_strided_copy` runs as the view: its result keeps eager's strides
# (overlapping ones too, which `patches/inplace.py` looks for), and values are never written anyway.
_LAYOUT_DEPENDENT = {aten.as_strided_copy.default: aten.as_strided.default,
                     aten.as_strided_scatter.default: aten.as_strided_scatter.default,
                     aten.as_strided.default: aten.as_strided.default}


def _device_mismatch(a: DeviceContext, b: DeviceContext, op: str) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, {a.device} and {b.device}! (when checking arguments for {op})")


def _host_among_lazy(v: torch.Tensor, info: OpInfo) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found a {v.device} tensor of "
                        f"shape {tuple(v.shape)} among ltc tensors (when checking arguments for "
                        f"{info.name}); move it with .to('ltc:N')")


def _host_argument(v: torch.Tensor, info: OpInfo, full: Sequence, pos: int) -> bool:
    """A host tensor at argument `pos` of a call on lazy tensors: raise eager CUDA's device
    error where the op would not take it (a full tensor outside the arguments it copies, a CPU
    0-dim one where it takes no CPU scalars); True for a wrapped-number stand-in (`patches/seam.py`)."""
    if pos in info.copied:
        return False
    if v.dim() != 0:
        raise _host_among_lazy(v, info)
    if as_number(v) is not NOT_A_STAND_IN:
        return True
    if not takes_cpu_scalars(info.qualname):
        raise _cpu_scalar_refused(v, info, full)
    return False


def check_host_arguments(info: OpInfo, full: Sequence) -> None:
    """`trace`'s host-tensor rules for handlers that bypass its argument loop."""
    for i, (k, v) in enumerate(zip(info.kinds, full)):
        if (k == K_TENSOR or k == OPT_TENSOR) and isinstance(v, torch.Tensor) and \
                type(v) is not LtcTensor and v.device.type != "ltc":
            _host_argument(v, info, full, i)


def _cpu_scalar_refused(v: torch.Tensor, info: OpInfo, full: Sequence) -> RuntimeError:
    lazy = next((a for a in full if type(a) is LtcTensor), None)
    where = lazy._ctx.device if lazy is not None else "ltc"
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, {where} and {v.device}! (when checking arguments for {info.name}: "
                        f"it takes no CPU 0-dim tensor as a scalar, as on CUDA; pass a Python number "
                        f"or move it with .to('{where}'))")


def _is_wide(v: Any) -> bool:
    """An int (or list of ints) TorchScript cannot hold: only eager takes (or rejects) it."""
    if type(v) is int:
        return not -_INT64 <= v < _INT64
    return (type(v) is list or type(v) is tuple) and any(_is_wide(e) for e in v)


# Template entries are tuples; the common ones are built once (an allocation less per argument).
_TREFS = tuple((TENSOR, i) for i in range(256))                          # operand i
_SREFS = {t: tuple((SCALAR, k, t) for k in range(64)) for t in (int, float)}  # scalar k of type t
_ONE = shapes.ONE                                                         # out_spec: one tensor
_cache_get = shapes.cache.get
_counters = counters._counters


def _tref(i: int) -> tuple:
    return _TREFS[i] if i < 256 else (TENSOR, i)


def _sref(k: int, t: type) -> tuple:
    refs = _SREFS.get(t)
    return refs[k] if refs is not None and k < 64 else (SCALAR, k, t)


def trace(func: Any, info: OpInfo, full: Sequence) -> Any:
    """Record `func(*full)` as an IR node and return lazy tensors for its outputs.

    The hot path of every traced op: one pass over the arguments builds the node's operands,
    template and runtime scalars and the shape-cache key; on a hit nothing else is computed
    (no meta tensors, no lowering check).  Host tensors among the arguments are uploaded;
    0-dim ones (wrapped numbers, `x * 2.0`) are cached device data and get no tensor of their
    own unless shape inference or the eager fallback needs one."""
    operands: list[tuple[Node, int]] = []
    metas: list[TensorMeta] = []   # the operands' metas: the shape-cache key
    template: list[Any] = []
    scalars: list[Any] = []
    ctx: DeviceContext | None = None
    uploads: list[tuple[int, int | None, torch.Tensor]] | None = None  # (template pos, list pos, tensor)
    wide = False  # an int scalar beyond int64: only eager takes it
    is_factory = info.is_factory
    for k, v in zip(info.kinds, full):
        if k == K_TENSOR or k == OPT_TENSOR:
            if type(v) is LtcTensor:
                c = v._ctx
                if c is not ctx:
                    if ctx is None:
                        ctx = c
                    else:
                        raise _device_mismatch(ctx, c, info.name)
                o = v._v
                template.append(_tref(len(operands)))
                operands.append(o)
                metas.append(o[0].outputs[o[1]])
            elif v is None:
                template.append(None)
            elif isinstance(v, torch.Tensor):
                if v.device.type != "ltc" and _host_argument(v, info, full, len(template)):
                    return trace(func, info, [_number_of(a) for a in full])   # a wrapped number
                uploads = uploads or []
                uploads.append((len(template), None, v))
                template.append(None)
            else:  # a Python number where the schema says Tensor: a wrapped number
                tv = type(v)
                if tv is bool:   # TorchScript has no bool Scalar: a 0-dim bool tensor promotes alike
                    uploads = uploads or []
                    uploads.append((len(template), None, torch.tensor(v)))
                    template.append(None)
                    continue
                if tv is int and not -_INT64 <= v < _INT64:
                    wide = True
                template.append(_sref(len(scalars), tv))
                scalars.append(v)
        elif k == CONST:
            tv = type(v)
            if tv is list:
                v = tuple(v)
            elif tv is torch.device and v.type == "ltc" and ctx is None and is_factory:
                ctx = arena.get(v)
            template.append(v)
        elif k == K_SCALAR:
            tv = type(v)
            if tv is int and not -_INT64 <= v < _INT64:
                wide = True
            const = is_factory   # a factory's scalars can decide its shape (arange) ...
            if const and len(template) in info.fill_scalars:   # ... but not a fill value (schema.py)
                const = False
                if tv is bool and full[info.fill_dtype] is not None:
                    v, tv = int(v), int
            if const or (tv is not int and tv is not float):
                template.append(exact(v))   # bools stay constants: TorchScript has no bool Scalar
            else:
                template.append(_sref(len(scalars), tv))
                scalars.append(v)
        elif k == NUM_CONST:
            if _is_wide(v):
                wide = True
            template.append(exact(v))
        elif k == K_TENSOR_LIST:
            if v is None:
                template.append(None)
                continue
            refs: list[Any] = []
            for j, e in enumerate(v):
                if type(e) is LtcTensor:
                    c = e._ctx
                    if c is not ctx:
                        if ctx is None:
                            ctx = c
                        else:
                            raise _device_mismatch(ctx, c, info.name)
                    o = e._v
                    refs.append(len(operands))
                    operands.append(o)
                    metas.append(o[0].outputs[o[1]])
                elif e is None:
                    refs.append(None)
                else:  # host tensors in index lists are allowed, as in eager CUDA
                    if len(template) not in info.index_lists and len(template) not in info.copied:
                        raise _host_among_lazy(e, info)
                    uploads = uploads or []
                    uploads.append((len(template), j, e))
                    refs.append(None)
            template.append((TENSOR_LIST, tuple(refs)))
        elif k == GENERATOR:
            template.append((RNG, len(scalars)))
            scalars.append(v)  # replaced by a seed below, once the device is known
    if ctx is None:
        ctx = arena.get(None)
    uploaded: list[tuple[int, int | None, Any]] | None = None
    if uploads:
        uploaded = []
        for pos, j, host in uploads:
            if host.dim() == 0 and host.device.type != "ltc":
                t: Any = scalar_node(ctx, host)   # a Node: a tensor only if `full` is needed
                o = (t, 0)
            else:
                t = upload(ctx, host)
                o = t._v
            ref = len(operands)
            operands.append(o)
            metas.append(o[0].outputs[o[1]])
            if j is None:
                template[pos] = _tref(ref)
            else:
                refs = list(template[pos][1])
                refs[j] = ref
                template[pos] = (TENSOR_LIST, tuple(refs))
            uploaded.append((pos, j, t))
    if info.has_generator:
        for e in template:
            if type(e) is tuple and e and e[0] is RNG:
                scalars[e[1]] = seed_from(ctx, scalars[e[1]])
    if wide:
        return eager_fallback(func, info, _with_uploads(full, uploaded, ctx), ctx)
    tpl = tuple(template)
    skey = (info.qualname, tpl, *metas)
    res = _cache_get(skey)
    if res is None:
        full = _with_uploads(full, uploaded, ctx)
        uploaded = None
        res = shapes.FALLBACK if func in _LAYOUT_DEPENDENT or info.qualname in config.force_fallback \
            else shapes.infer(func, info, full)   # force_fallback: `ltc.debug.force_fallback`
        if res is not shapes.FALLBACK:
            promoted = _promoted_by_default(func, metas, res[0])
            if promoted is not None:
                res = promoted
            else:
                # the entry keeps the node key (op, template), shared by every node of the
                # signature; a factory's dtype is spelled out (the default, decided now)
                ntpl = _explicit_dtype(info, tpl, res[0]) if is_factory else tpl
                res = (res[0], res[1], (info.qualname, ntpl))
                if not ctx.backend.can_lower(Node(func, tuple(operands), ntpl, tuple(scalars), res[0],
                                                  res[1], op_key=info.qualname)):
                    res = shapes.FALLBACK
        shapes.remember(skey, res)
    if type(res) is shapes.Promoted:
        to = aten._to_copy.default
        return trace(func, info, [to(v, dtype=res.dtype) if type(v) is LtcTensor else v for v in full])
    if res is shapes.FALLBACK:
        if ctx is not None and not is_factory:
            out = _bool_scalar_twin(func, info, full, ctx)
            if out is not NotImplemented:
                return out
        return eager_fallback(_LAYOUT_DEPENDENT.get(func, func), info, _with_uploads(full, uploaded, ctx), ctx)
    out_metas, out_spec, nkey = res
    if info.identity:  # values are immutable: the output is the input's value ...
        node, i = operands[0]
        if node.outputs[i].stride == out_metas[0].stride:
            return make_tensor(ctx, node, i, out_metas[0])
        # ... unless it has another layout (`contiguous()` of a transposed or expanded tensor):
        # kernels that read memory directly trust the layout they were promised
    node = Node(func, tuple(operands), nkey[1], tuple(scalars), out_metas, out_spec, None,
                caller_location() if config.ir_debug else None, info.qualname, nkey)
    if out_spec is _ONE:
        return make_tensor(ctx, node, 0, out_metas[0])
    outs = [make_tensor(ctx, node, i, m) for i, m in enumerate(out_metas)]
    return _unflatten(outs, out_spec)


def _promoted_by_default(func: Any, metas: list, out: tuple) -> shapes.Promoted | None:
    """An elementwise op whose floating result dtype only the default dtype decided (`ids * 0.1`,
    `ids / 2`, `sqrt(ids)`: no floating tensor among its inputs), as `Promoted`: it is traced on
    inputs cast to that dtype, which computes what eager computes, and the node then names its
    dtype -- the device never consults the default dtype, which may have changed by the time
    the graph runs.  None for every other op (nearly all: the check runs once per signature)."""
    if not out or not metas or not (out[0].dtype.is_floating_point or out[0].dtype.is_complex):
        return None
    if any(m.dtype.is_floating_point or m.dtype.is_complex for m in metas):
        return None
    if torch.Tag.pointwise not in func.tags or func.overloadpacket is aten.where:
        return None
    return shapes.Promoted(out[0].dtype)


def _explicit_dtype(info: OpInfo, tpl: tuple, out: tuple) -> tuple:
    """A factory's template with its `dtype=None` replaced by the dtype it makes (the default
    dtype for floats: decided when traced, not when the device runs it)."""
    at = info.index_of.get("dtype")
    if at is None or at >= len(tpl) or tpl[at] is not None or not out:
        return tpl
    return tpl[:at] + (out[0].dtype,) + tpl[at + 1:]


_bool_routes: dict[tuple, bool] = {}   # signature -> may the bools travel as ints


def _bool_scalar_twin(func: Any, info: OpInfo, full: Sequence, ctx: DeviceContext) -> Any:
    """`mask.masked_fill(m, True)`, `b & True`, `t == True`, `fill_(True)`, `scatter_(1, i,
    True)`: TorchScript has no bool Scalar.  Where the result's dtype does not depend on it
    (a value written into a tensor of its own dtype, a comparison), the bool travels as an int;
    elsewhere the op runs as its `.Tensor` overload, the bool a 0-dim bool tensor on the device
    -- which promotes exactly as the bool Scalar does (bool is the lowest category: it never
    widens the result).  NotImplemented where neither works (once per signature: `_bool_routes`)."""
    at = [i for i, (k, v) in enumerate(zip(info.kinds, full)) if k == K_SCALAR and type(v) is bool]
    if not at:
        return NotImplemented
    as_int = [int(v) if i in at else v for i, v in enumerate(full)]
    key = (info.qualname, *[shapes.signature(v) for v in full])
    ints = _bool_routes.get(key)
    if ints is None:
        try:
            a, b = shapes.infer(func, info, list(full)), shapes.infer(func, info, list(as_int))
            ints = a is not shapes.FALLBACK and b is not shapes.FALLBACK and \
                [m.dtype for m in a[0]] == [m.dtype for m in b[0]]
        except Exception:  # noqa: BLE001 - the twin (or the fallback) raises what eager raises
            ints = False
        if ints:   # eager's kernels refuse some bools the meta kernels take: `True - t`
            ints = _refused_by_eager(func, info, full) or True
        if len(_bool_routes) >= 4096:   # programs with endless new shapes
            _bool_routes.clear()
        _bool_routes[key] = ints
    if isinstance(ints, BaseException):
        raise ints.with_traceback(None)
    if ints:
        return trace(func, info, as_int)
    twin = getattr(func.overloadpacket, "Tensor", None)
    if twin is None or twin is func:
        return NotImplemented
    want = [a.type for a in func._schema.arguments]
    have = [a.type for a in twin._schema.arguments]
    if len(want) != len(have) or any(
            (i in at) != (w != h) or (i in at and not isinstance(h, torch._C.TensorType))
            for i, (w, h) in enumerate(zip(want, have))):
        return NotImplemented
    args = list(full)
    for i in at:
        args[i] = make_tensor(ctx, scalar_node(ctx, torch.tensor(full[i])), 0,
                              TensorMeta((), (), torch.bool))
    targs, tkwargs = op_info(twin).split(args)
    return twin(*targs, **tkwargs)   # through the dispatcher, back to `LtcTensor.__torch_dispatch__`


def _refused_by_eager(func: Any, info: OpInfo, full: Sequence) -> BaseException | None:
    """The exception eager raises for this call (run once on host stand-ins of the lazy
    inputs, up to `shapes._STAND_IN_BYTES`), or None."""
    lazy = [v for v in full if type(v) is LtcTensor]
    if not lazy or sum(t._m.dtype.itemsize * t.numel() for t in lazy) > shapes._STAND_IN_BYTES:
        return None
    try:
        shapes._on_stand_ins(func, info, list(full), lazy)
    except Exception as e:  # noqa: BLE001 - eager's refusal, raised at the user's line
        return e
    return None


def _number_of(v: Any) -> Any:
    n = as_number(v) if isinstance(v, torch.Tensor) else NOT_A_STAND_IN
    return v if n is NOT_A_STAND_IN else n


def _with_uploads(full: Sequence, uploaded: list | None, ctx: DeviceContext) -> Sequence:
    """`full` with its host tensors replaced by their uploads (for shape inference and the
    eager fallback)."""
    if not uploaded:
        return full
    for pos, j, t in uploaded:
        if type(t) is Node:
            t = make_tensor(ctx, t, 0, t.outputs[0])
        full = _replace_arg(full, pos, j, t)
    return full


def _replace_arg(full: Sequence, pos: int, j: int | None, t: LtcTensor) -> list:
    full = list(full)
    if j is None:
        full[pos] = t
    else:
        lst = list(full[pos])
        lst[j] = t
        full[pos] = lst
    return full


def _unflatten(outs: list, out_spec: tuple) -> Any:
    res: list[Any] = []
    i = 0
    for s in out_spec:
        if s is None:
            res.append(outs[i])
            i += 1
        elif s is False:
            res.append(None)
        else:
            res.append(outs[i:i + s])
            i += s
    return res[0] if len(res) == 1 else tuple(res)


# -- per-overload plans --------------------------------------------------------------------------
#
# LTC generates a C++ lazy kernel per op; the Python equivalent of that specialization is a plan
# per overload: `trace`'s argument loop unrolled for the overload's schema (no loop, no kind
# tests, template entries built straight from the arguments), written once as source and
# compiled with `exec`.  A plan handles the common case only -- lazy tensors (or 0-dim host
# tensors, wrapped numbers) in tensor slots, Python numbers in Scalar slots, plain constants
# (a factory's device among them),
# and a shape-cache hit that is not an eager fallback -- and builds exactly the node `trace`
# builds; anything else (a device mismatch, a host tensor, a wide int, a first call) goes to
# `trace`, which raises, uploads, infers or falls back as usual.  Ops with generators and
# layout-dependent ops have no plan.  Handlers that rewrite a call (`data_dependent.py`: a
# boolean mask as long indices) trace the rewritten call through its plan too (`planned`).

_PLANNED = (K_TENSOR, OPT_TENSOR, K_TENSOR_LIST, CONST, K_SCALAR, NUM_CONST)
_UP = object()   # a plan's template slot waiting for a 0-dim host tensor's upload


_plans: dict[int, Any] = {}   # id(OpOverload) -> its plan, for `planned` (racing threads store equals)


def planned(func: Any, info: OpInfo, full: list) -> Any:
    """`trace(func, info, full)` through `func`'s plan (counted, as a dispatched call is)."""
    plan = _plans.get(id(func))
    if plan is None:
        plan = _plans[id(func)] = make_plan(func, info)
    return plan(tuple(full), None)


def _generic_plan(func: Any, info: OpInfo) -> Any:
    """The traced path without a plan: count, bind, `trace`."""
    counter, n_args, tails, bind = info.counter, info.n_args, info.default_tails, info.bind

    def generic(args: tuple, kwargs: dict | None) -> Any:
        _counters[counter] = _counters.get(counter, 0) + 1
        n = len(args)
        if kwargs or n > n_args or (n < n_args and tails[n] is None):
            return trace(func, info, bind(args, kwargs))
        return trace(func, info, args if n == n_args else args + tails[n])
    return generic


def make_plan(func: Any, info: OpInfo) -> Any:
    """The traced path of `func` as a function of its `(args, kwargs)` (see above): counts the
    call, binds the arguments to the schema and builds the node."""
    kinds = info.kinds
    n = len(kinds)
    factory = info.is_factory   # no tensor arguments: the device argument names the context,
    #                             and Scalars are constants (they can decide shapes: arange)
    if (info.has_generator or func in _LAYOUT_DEPENDENT
            or n == 0 or n > 200 or any(k not in _PLANNED for k in kinds)):
        return _generic_plan(func, info)
    names = [f"a{i}" for i in range(n)]
    full = "(" + ", ".join(names) + ("," if n == 1 else "") + ")"   # the bound arguments again
    src = ["def plan(args, kwargs):",
           "    _counters[counter] = _counters.get(counter, 0) + 1",
           "    if kwargs:",
           "        full = bind(args, kwargs)",
           f"        if len(full) != {n}:",
           "            return _trace(func, info, full)",
           f"        {', '.join(names)}{',' if n == 1 else ''} = full",
           f"    elif len(args) == {n}:",
           f"        {', '.join(names)}{',' if n == 1 else ''} = args"]
    defaults: dict[str, Any] = {}
    for m in range(n - 1, -1, -1):   # fewer positional arguments: the defaults of the rest
        if info.default_tails[m] is None:
            break
        given = ", ".join(names[:m]) + ("," if m == 1 else "")
        rest = []
        for i in range(m, n):
            defaults[f"_d{i}"] = info.defaults[i]
            rest.append(f"{names[i]} = _d{i}")
        src += [f"    elif len(args) == {m}:",
                (f"        {given} = args; " if m else "        ") + "; ".join(rest)]
    src += ["    else:",
            "        return _trace(func, info, bind(args, kwargs))",
            "    ctx = None",
            "    ops = []",
            "    ms = []",
            "    sc = []"]
    entries, tensor_slots = [], []
    for i, k in enumerate(kinds):
        a, e = f"a{i}", f"e{i}"
        if k == K_TENSOR or k == OPT_TENSOR:
            tensor_slots.append(i)
            src += [f"    if type({a}) is LtcTensor:",
                    f"        c = {a}._ctx",
                    "        if c is not ctx:",
                    "            if ctx is not None:",
                    f"                return _trace(func, info, {full})",
                    "            ctx = c",
                    f"        o = {a}._v",
                    f"        {e} = _TREFS[len(ops)]",
                    "        ops.append(o)",
                    "        ms.append(o[0].outputs[o[1]])"]
            if k == OPT_TENSOR:
                src += [f"    elif {a} is None:",
                        f"        {e} = None"]
            if takes_cpu_scalars(info.qualname):   # else `trace` raises eager CUDA's error
                src += [f"    elif type({a}) is _Tensor and {a}.is_cpu and {a}.dim() == 0:",
                        f"        if stand_ins and id({a}) in stand_ins:",   # a wrapped number: patches/seam.py
                        f"            return _trace(func, info, {full})",
                        f"        {e} = _UP"]
            # a Python number where the schema says Tensor (`x * 0.5`, `x + 1`: eager's wrapped
            # number reaches `__torch_dispatch__` as the number): a runtime scalar, as in `trace`
            src += [f"    elif type({a}) is float or (type({a}) is int and -_INT64 <= {a} < _INT64):",
                    f"        t = type({a})",
                    f"        {e} = _SREFS[t][len(sc)] if len(sc) < 64 else (SCALAR, len(sc), t)",
                    f"        sc.append({a})"]
            src += ["    else:",
                    f"        return _trace(func, info, {full})"]
        elif k == K_TENSOR_LIST:   # `cat`'s tensors, `index`'s optional index tensors
            src += [f"    if {a} is None:",
                    f"        {e} = None",
                    "    else:",
                    "        refs = []",
                    f"        for x in {a}:",
                    "            if type(x) is LtcTensor:",
                    "                c = x._ctx",
                    "                if c is not ctx:",
                    "                    if ctx is not None:",
                    f"                        return _trace(func, info, {full})",
                    "                    ctx = c",
                    "                refs.append(len(ops))",
                    "                o = x._v",
                    "                ops.append(o)",
                    "                ms.append(o[0].outputs[o[1]])",
                    "            elif x is None:",
                    "                refs.append(None)",
                    "            else:",   # a host tensor (an index list may hold one): `trace`
                    f"                return _trace(func, info, {full})",
                    f"        {e} = (TENSOR_LIST, tuple(refs))"]
        elif k == CONST:
            src += [f"    {e} = tuple({a}) if type({a}) is list else {a}"]
            if factory:
                src += [f"    if ctx is None and type({a}) is _device and {a}.type == 'ltc':",
                        f"        ctx = _arena_get({a})"]
        elif k == NUM_CONST or (k == K_SCALAR and factory and i not in info.fill_scalars):
            src += [f"    if _is_wide({a}):",
                    f"        return _trace(func, info, {full})",
                    f"    {e} = exact({a})"]
        else:  # a Scalar: a runtime scalar, keyed by type (bools and complex numbers stay constants)
            if i in info.fill_scalars:   # a factory's fill value: a bool travels as an int (trace)
                src += [f"    if type({a}) is bool and a{info.fill_dtype} is not None:",
                        f"        {a} = int({a})"]
            src += [f"    t = type({a})",
                    f"    if t is float or (t is int and -_INT64 <= {a} < _INT64):",
                    f"        {e} = _SREFS[t][len(sc)] if len(sc) < 64 else (SCALAR, len(sc), t)",
                    f"        sc.append({a})",
                    "    elif t is int:",
                    f"        return _trace(func, info, {full})",
                    "    else:",
                    f"        {e} = exact({a})"]
        entries.append(e)
    src += ["    if ctx is None:",
            f"        return _trace(func, info, {full})"]
    for i in tensor_slots:  # uploads come after the other operands, in argument order, as in trace
        src += [f"    if e{i} is _UP:",
                f"        node = scalar_node(ctx, a{i})",
                "        ops.append((node, 0))",
                "        ms.append(node.outputs[0])",
                f"        e{i} = _TREFS[len(ops) - 1]"]
    src += [f"    tpl = ({', '.join(entries)}{',' if n == 1 else ''})",
            "    res = _cache_get((qualname, tpl, *ms))",
            "    if res is None or res.__class__ is not tuple:",   # FALLBACK, Promoted
            f"        return _trace(func, info, {full})",
            "    om, spec, key = res"]
    if info.identity:   # values are immutable: the input's value, unless the layout changes
        src += ["    o = ops[0]",
                "    if o[0].outputs[o[1]].stride == om[0].stride:",
                "        return make_tensor(ctx, o[0], o[1], om[0])"]
    src += ["    node = Node(func, tuple(ops), key[1], tuple(sc), om, spec, None,",
            "                caller_location() if config.ir_debug else None, qualname, key)",
            "    if spec is _ONE:",
            "        return make_tensor(ctx, node, 0, om[0])",
            "    return _unflatten([make_tensor(ctx, node, i, m) for i, m in enumerate(om)], spec)"]
    namespace = dict(func=func, info=info, qualname=info.qualname, _trace=trace, LtcTensor=LtcTensor,
                     counter=info.counter, _counters=_counters, bind=info.bind, **defaults,
                     _device=torch.device, _arena_get=arena.get,
                     _Tensor=torch.Tensor, _TREFS=_TREFS, _SREFS=_SREFS, SCALAR=SCALAR, _UP=_UP,
                     TENSOR_LIST=TENSOR_LIST,
                     _INT64=_INT64, _is_wide=_is_wide, exact=exact, scalar_node=scalar_node,
                     stand_ins=stand_ins, _cache_get=_cache_get, FALLBACK=shapes.FALLBACK, Node=Node, _ONE=_ONE,
                     make_tensor=make_tensor, _unflatten=_unflatten, config=config,
                     caller_location=caller_location)
    # named as a file of this package, so that `caller_location` looks past it to the user's line
    exec(compile("\n".join(src), f"{__file__}<plan {info.qualname}>", "exec"), namespace)
    return namespace["plan"]
