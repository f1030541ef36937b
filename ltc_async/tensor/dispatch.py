"""The one op path: every aten call that reaches an `LtcTensor` becomes an IR node here.

Design note.  LTC generates a C++ IR class and kernel per op with torchgen; ltc_async reads each
op's schema once (`ir/schema.py`) and traces every op through `trace()`:

1. bind args to the schema; tensors become operands, Python numbers in Scalar/Tensor slots
   become runtime scalars (keyed by type only), `Generator?` slots get a per-device seed,
   everything else is a constant;
2. shape inference runs the op on `meta` tensors, cached by (op, template, input metas), so a
   shape error raises *here*, at the user's line, and a repeated op costs one dict lookup;
3. ops the backend cannot lower, or that have no meta kernel, run eagerly on the host
   (`EagerFallback`); ops returning non-tensors (`.item()`, `bool(t)`) sync their inputs
   (`DataDependentSync`).

A few ops need explicit handlers (`_SPECIAL`): device transfers (`_to_copy`, `copy`) and ops
that are the identity on immutable values (`detach_copy`, `alias_copy`, `clone`).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import metrics
from .._config import config
from ..executor import arena
from ..executor import graph_executor as gx
from ..executor.device import DeviceContext, caller_location
from ..executor.futures import BackendData
from ..ir.node import RNG, SCALAR, TENSOR, TENSOR_LIST, Node, TensorMeta, make_data_node
from ..ir.schema import CONST, GENERATOR, OPT_TENSOR, OpInfo, op_info
from ..ir.schema import SCALAR as K_SCALAR
from ..ir.schema import TENSOR as K_TENSOR
from ..ir.schema import TENSOR_LIST as K_TENSOR_LIST
from . import lazy_tensor
from .lazy_tensor import LtcTensor, make_tensor, wrap

aten = torch.ops.aten
_FALLBACK = "fallback"                 # shape-cache value: run this signature eagerly
_shape_cache: dict[tuple, Any] = {}    # (op, template, input metas) -> (metas, out_spec) | _FALLBACK
_SHAPE_CACHE_MAX = 1 << 16
_entries: dict[int, tuple[Any, OpInfo]] = {}  # id(op) -> (special handler, OpInfo)
_SCALAR_TYPES = (int, float)  # bools stay constants: TorchScript has no bool Scalar
_META = torch.device("meta")


def dispatch(func: torch._ops.OpOverload, args: tuple, kwargs: dict | None) -> Any:
    entry = _entries.get(id(func))  # by id: OpOverload.__hash__ is slow Python code
    if entry is None:
        entry = _entries[id(func)] = (_SPECIAL.get(func), op_info(func))
    handler, info = entry
    if handler is not None:
        return handler(func, args, kwargs or {})
    metrics.counter(info.counter)
    if info.is_inplace_or_out:
        return mutating_host_op(func, info, args, kwargs or {})
    if not info.returns_only_tensors:
        return host_op(func, info, args, kwargs or {})
    full = info.bind(args, kwargs) if (kwargs or len(args) != len(info.kinds)) else list(args)
    if info.seeded and not info.has_generator:
        return _seeded(func, info, full)
    return trace(func, info, full)


def _seeded(func: Any, info: OpInfo, full: list) -> Any:
    """Random ops with no Generator argument: use the overload that has one, or PyTorch's
    decomposition into ones that do (`native_dropout` -> `rand_like` -> `rand.generator`)."""
    twin = info.generator_twin
    if twin is not None:
        tinfo = op_info(twin)
        by_name = dict(zip(info.arg_names, full))
        return trace(twin, tinfo, [by_name.get(n) for n in tinfo.arg_names])
    from torch._decomp import decomposition_table
    decomp = decomposition_table.get(func)
    if decomp is not None:
        args, kwargs = info.split(full)
        return decomp(*args, **kwargs)
    return trace(func, info, full)  # eager fallback or backend RNG: still correct in distribution


lazy_tensor._dispatch = dispatch


def _device_mismatch(a: DeviceContext, b: DeviceContext, op: str) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, {a.device} and {b.device}! (when checking arguments for {op})")


def trace(func: Any, info: OpInfo, full: list, alias_of: LtcTensor | None = None) -> Any:
    """Record `func(*full)` as an IR node and return lazy tensors for its outputs."""
    operands: list[tuple[Node, int]] = []
    template: list[Any] = []
    scalars: list[Any] = []
    ctx: DeviceContext | None = None
    uploads: list[tuple[int, int | None, torch.Tensor]] | None = None  # (template pos, list pos, tensor)
    kinds = info.kinds
    for i, v in enumerate(full):
        k = kinds[i]
        if k == CONST:
            tv = type(v)
            if tv is list:
                v = tuple(v)
            elif tv is torch.device and v.type == "ltc" and ctx is None and info.is_factory:
                ctx = arena.get(v)
            template.append(v)
        elif k == K_TENSOR or k == OPT_TENSOR:
            if type(v) is LtcTensor:
                c = v._ctx
                if c is not ctx:
                    if ctx is None:
                        ctx = c
                    else:
                        raise _device_mismatch(ctx, c, info.name)
                template.append((TENSOR, len(operands)))
                operands.append(v._v)
            elif v is None:
                template.append(None)
            elif isinstance(v, torch.Tensor):
                if v.dim() != 0 and v.device.type != "ltc":
                    raise RuntimeError(f"Expected all tensors to be on the same device, but found a "
                                       f"{v.device} tensor of shape {tuple(v.shape)} among ltc tensors "
                                       f"(when checking arguments for {info.name}); move it with .to('ltc:N')")
                uploads = uploads or []
                uploads.append((len(template), None, v))
                template.append(None)
            else:  # a Python number where the schema says Tensor: a wrapped number
                template.append((SCALAR, len(scalars), type(v)))
                scalars.append(v)
        elif k == K_SCALAR:
            if info.is_factory or type(v) not in _SCALAR_TYPES:
                template.append(v)  # factories: scalars can decide shapes (arange)
            else:
                template.append((SCALAR, len(scalars), type(v)))
                scalars.append(v)
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
                    refs.append(len(operands))
                    operands.append(e._v)
                elif e is None:
                    refs.append(None)
                else:  # host tensors in index lists are allowed, as in eager CUDA
                    uploads = uploads or []
                    uploads.append((len(template), j, e))
                    refs.append(None)
            template.append((TENSOR_LIST, tuple(refs)))
        elif k == GENERATOR:
            template.append((RNG, len(scalars)))
            scalars.append(v)  # replaced by a seed below, once the device is known
    if ctx is None:
        ctx = arena.get(None)
    if uploads:
        for pos, j, host in uploads:
            t = upload(ctx, host)
            ref = len(operands)
            operands.append(t._v)
            if j is None:
                template[pos] = (TENSOR, ref)
            else:
                refs = list(template[pos][1])
                refs[j] = ref
                template[pos] = (TENSOR_LIST, tuple(refs))
            full = _replace_arg(full, pos, j, t)
    if info.has_generator:
        for e in template:
            if type(e) is tuple and e and e[0] is RNG:
                scalars[e[1]] = _seed_from(ctx, scalars[e[1]])
    tpl = tuple(template)
    skey = (info.qualname, tpl, tuple([n.outputs[i] for n, i in operands]))
    res = _shape_cache.get(skey)
    if res is None:
        res = _FALLBACK if func in _LAYOUT_DEPENDENT else _infer(func, info, full)
        if res is not _FALLBACK and not ctx.backend.can_lower(
                Node(func, tuple(operands), tpl, tuple(scalars), res[0], res[1], op_key=info.qualname)):
            res = _FALLBACK
        if len(_shape_cache) >= _SHAPE_CACHE_MAX:  # programs with endless new shapes
            _shape_cache.clear()
        _shape_cache[skey] = res
    if res is _FALLBACK:
        return eager_fallback(func, info, full, ctx)
    metas, out_spec = res
    if info.identity:
        src = operands[0]
        return make_tensor(ctx, src[0], src[1], metas[0])
    node = Node(func, tuple(operands), tpl, tuple(scalars), metas, out_spec,
                origin=caller_location() if config.ir_debug else None, op_key=info.qualname)
    if out_spec == (None,):
        return make_tensor(ctx, node, 0, metas[0])
    outs = [make_tensor(ctx, node, i, m) for i, m in enumerate(metas)]
    return _unflatten(outs, out_spec)


def _replace_arg(full: list, pos: int, j: int | None, t: LtcTensor) -> list:
    full = list(full)
    if j is None:
        full[pos] = t
    else:
        lst = list(full[pos])
        lst[j] = t
        full[pos] = lst
    return full


def _seed_from(ctx: DeviceContext, gen: Any) -> int:
    if gen is None:
        return ctx.next_seed()
    if isinstance(gen, torch.Generator) and gen.device.type == "cpu":
        return int(torch.randint(0, 1 << 62, (), generator=gen))
    raise RuntimeError(f"ltc_async: unsupported generator {gen!r}; pass a CPU torch.Generator or none "
                       "(lazy devices draw from a per-device generator seeded by torch.manual_seed)")


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


def _to_meta(v: Any) -> Any:
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
        return [_to_meta(e) for e in v] if any(isinstance(e, torch.Tensor) for e in v) else v
    return v


def _call(func: Any, info: OpInfo, full: list) -> Any:
    args, kwargs = info.split(full)
    return func(*args, **kwargs)


def _infer(func: Any, info: OpInfo, full: list) -> Any:
    """Output metas by running the op on meta tensors.  User errors propagate unchanged."""
    margs = [_to_meta(v) for v in full]
    for i, k in enumerate(info.kinds):
        if k == GENERATOR:
            margs[i] = None
    try:
        out = _call(func, info, margs)
    except NotImplementedError:
        return _FALLBACK
    except RuntimeError as e:
        # data-dependent shapes (repeat_interleave without output_size, ...): only the values
        # can tell, so the op runs eagerly
        if info.dynamic_shape and "meta" in str(e).lower():
            return _FALLBACK
        raise
    if info.view_op is not None:  # eager's strides for view ops functionalization turned into copies
        try:
            out = _call(info.view_op, info, margs)
        except Exception:  # noqa: BLE001 - the copy op's result above is still right
            pass
    metas: list[TensorMeta] = []
    spec: list[Any] = []
    for r in (out if isinstance(out, tuple) else (out,)):
        if r is None:
            spec.append(False)
        elif isinstance(r, torch.Tensor):
            spec.append(None)
            metas.append(TensorMeta(tuple(r.shape), tuple(r.stride()), r.dtype))
        else:
            spec.append(len(r))
            metas.extend(TensorMeta(tuple(e.shape), tuple(e.stride()), e.dtype) for e in r)
    return tuple(metas), tuple(spec)


# -- host interaction ---------------------------------------------------------------------

def upload(ctx: DeviceContext, host: torch.Tensor) -> LtcTensor:
    """Device data for a host tensor (copied: later host writes do not leak in)."""
    if host.device.type == "ltc":  # a functional wrapper on another lazy device
        return transfer(lazy_tensor.unwrap(host), ctx)
    meta = TensorMeta(tuple(host.shape), tuple(host.stride()), host.dtype)
    if host.dim() == 0:
        return _upload_scalar(ctx, host, meta)
    metrics.counter("UploadTensor")
    data = BackendData(ctx, meta, value=ctx.backend.upload(host, ctx.backend_device))
    return make_tensor(ctx, make_data_node(data, meta), 0, meta)


_scalar_cache: dict[tuple, Node] = {}


def _upload_scalar(ctx: DeviceContext, host: torch.Tensor, meta: TensorMeta) -> LtcTensor:
    """0-dim host tensors (`x + torch.tensor(2.0)`) are cached by value: LTC's DataCache."""
    # repr keeps what equality would merge: -0.0 vs 0.0, and NaN equal to itself
    key = (ctx.index, host.dtype, repr(host.item()))
    node = _scalar_cache.get(key)
    if node is None:
        metrics.counter("DeviceDataCacheMiss")
        data = BackendData(ctx, meta, value=ctx.backend.upload(host, ctx.backend_device))
        node = make_data_node(data, meta)
        if len(_scalar_cache) > 4096:
            _scalar_cache.clear()
        _scalar_cache[key] = node
    return make_tensor(ctx, node, 0, meta)


def adopt(ctx: DeviceContext, value: torch.Tensor) -> LtcTensor:
    """Wrap a tensor already on the backing device (eager-fallback results) as device data."""
    meta = TensorMeta(tuple(value.shape), tuple(value.stride()), value.dtype)
    data = BackendData(ctx, meta, value=ctx.backend.from_torch(value, ctx.backend_device))
    return make_tensor(ctx, make_data_node(data, meta), 0, meta)


def transfer(src: LtcTensor, dst: DeviceContext) -> LtcTensor:
    """Move a lazy tensor to another lazy device, ordered after its producer, no host wait."""
    if src._ctx is dst:
        return src
    metrics.counter("TransferToDevice")
    data = gx.data_of(src)  # schedules src's graph on its device if still pending
    meta = src._m
    out = gx.schedule_transfer(data, dst, meta)
    return make_tensor(dst, make_data_node(out, meta), 0, meta)


def _materialize_args(args: Any, kwargs: dict) -> tuple[Any, dict, DeviceContext | None]:
    """Replace lazy tensors by backend `torch.Tensor`s, syncing what is pending."""
    found: list[LtcTensor] = []

    def collect(v: Any) -> None:
        if type(v) is LtcTensor:
            found.append(v)
        elif type(v) in (list, tuple):
            for e in v:
                collect(e)
    for v in args:
        collect(v)
    for v in kwargs.values():
        collect(v)
    values = [_eager_layout(v, t._m) for t, v in zip(found, gx.materialize(found))]
    mapping = {id(t): v for t, v in zip(found, values)}
    ctx = found[0]._ctx if found else None

    def repl(v: Any) -> Any:
        if type(v) is LtcTensor:
            return mapping[id(v)]
        if type(v) in (list, tuple):
            return type(v)(repl(e) for e in v)
        if isinstance(v, torch.device) and v.type == "ltc":
            return arena.get(v).backend_device
        return v
    return [repl(v) for v in args], {k: repl(v) for k, v in kwargs.items()}, ctx


def _eager_layout(value: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
    """The value with the strides eager would have given it (ops like `as_strided` read memory
    layout, and compiled graphs are free to produce other layouts)."""
    if tuple(value.stride()) == meta.stride or value.dim() == 0:
        return value
    # what preserve_format makes of the lazy tensor's strides (dense for expanded views)
    like = torch.empty_strided(meta.shape, meta.stride, dtype=value.dtype, device=_META)
    out = torch.empty_like(like, device=value.device)
    if tuple(out.stride()) == tuple(value.stride()):
        return value
    return out.copy_(value)


def _wrap_outputs(out: Any, ctx: DeviceContext) -> Any:
    if isinstance(out, torch.Tensor):
        return adopt(ctx, out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap_outputs(o, ctx) for o in out)
    return out


def eager_fallback(func: Any, info: OpInfo, full: list, ctx: DeviceContext) -> Any:
    """Run an op the backend cannot express eagerly on the backing device (LTC's
    `ts_eager_fallback`): sync its inputs, call the aten op, keep the result as device data."""
    metrics.counter("EagerFallback")
    metrics.counter("EagerFallback::" + info.name)
    n = info.n_positional_max
    args, kwargs, _ = _materialize_args(*info.split(full))
    for i, k in enumerate(info.kinds):
        if k == GENERATOR:  # keep per-device seeding: a generator on the backing device
            g = torch.Generator(ctx.backend_device)
            g.manual_seed(_seed_from(ctx, full[i]))
            if i < n:
                args[i] = g
            else:
                kwargs[info.arg_names[i]] = g
    return _wrap_outputs(func(*args, **kwargs), ctx)


def host_op(func: Any, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """Ops whose result is not a tensor (`.item()`, `bool(t)`, `equal`): a data-dependent sync."""
    metrics.counter("DataDependentSync")
    hargs, hkwargs, ctx = _materialize_args(args, kwargs)
    out = func(*hargs, **hkwargs)
    return _wrap_outputs(out, ctx) if ctx is not None else out


def mutating_host_op(func: Any, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """Ops that write their arguments and have no functional form (torch.distributed's
    `c10d::allreduce_` and friends): run on host copies at this point of the program, then
    point the written lazy tensors at the results.  Device data stays immutable."""
    metrics.counter("HostMutation")
    metrics.counter("HostMutation::" + info.name)
    full = info.bind(args, kwargs)
    written: dict[int, LtcTensor] = {}

    def lazy_in(v: Any) -> list[LtcTensor]:
        if type(v) is LtcTensor:
            return [v]
        if type(v) in (list, tuple):
            return [t for e in v for t in lazy_in(e)]
        return []
    for i in info.written:
        for t in lazy_in(full[i]):
            written[id(t)] = t
    n = info.n_positional_max
    hargs, hkwargs, _ = _materialize_args(*info.split(full))
    clones: dict[int, tuple[torch.Tensor, LtcTensor]] = {}  # id(host copy) -> (copy, lazy)

    def clone_written(v: Any, lazy: Any) -> Any:
        if type(lazy) is LtcTensor and id(lazy) in written:
            c = v.clone()
            clones[id(c)] = (c, lazy)
            return c
        if type(lazy) in (list, tuple):
            return type(v)(clone_written(a, b) for a, b in zip(v, lazy))
        return v
    for i in info.written:
        if i < n:
            hargs[i] = clone_written(hargs[i], full[i])
        else:
            name = info.arg_names[i]
            hkwargs[name] = clone_written(hkwargs[name], full[i])
    out = func(*hargs, **hkwargs)
    for o in (out if isinstance(out, tuple) else (out,)):
        if hasattr(o, "wait") and not isinstance(o, torch.Tensor):
            o.wait()  # a c10d Work: the host copies are complete before lazy work reads them
    results: dict[int, LtcTensor] = {}
    for key, (host, lazy) in clones.items():
        lazy._ctx.rebind(lazy, adopt(lazy._ctx, host)._v)  # the written tensor names the result
        results[key] = lazy

    def back(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            lazy = results.get(id(o))
            return lazy if lazy is not None else adopt(_ctx_of(written), o)
        if isinstance(o, list):
            return [back(e) for e in o]
        if isinstance(o, tuple):
            return tuple(back(e) for e in o)
        return o
    return back(out)


def _ctx_of(tensors: dict[int, LtcTensor]) -> DeviceContext:
    return next(iter(tensors.values()))._ctx if tensors else arena.get(None)


# -- special ops --------------------------------------------------------------------------

def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    device = kwargs.get("device")
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    metrics.counter("ltc::_to_copy")
    if device is not None and device.type != "ltc":
        # Leaving the lazy world: wait for exactly this tensor, copy to the target device.
        metrics.counter("TensorToHost")
        value = gx.materialize([x])[0]
        out = func(value, **kwargs)
        if kwargs.get("memory_format") in (None, torch.preserve_format):
            out = _eager_layout(out, x._m)  # eager's layout for this copy
        return out
    # Functionalization hands `_to_copy` results back unwrapped (it expects them to leave the
    # functional world, as `.cpu()` does), so lazy results are wrapped here.
    if device is not None and arena.get(device) is not x._ctx:
        x = transfer(x, arena.get(device))
    kwargs = dict(kwargs)
    kwargs["device"] = x._ctx.device if device is not None else None
    if kwargs.get("dtype") in (None, x.dtype) and kwargs.get("memory_format") in (None, torch.preserve_format):
        node, idx = x._v  # values are immutable: an unchanged copy is the same value
        return wrap(make_tensor(x._ctx, node, idx, x._m))
    info = op_info(func)
    return wrap(trace(func, info, info.bind((x,), kwargs)))


def _copy(func: Any, args: tuple, kwargs: dict) -> Any:
    """`copy(self, src)` (what functionalization makes of `copy_`): uploads end up here."""
    self, src = args[0], args[1]
    ctx = self._ctx
    metrics.counter("ltc::copy")
    if type(src) is not LtcTensor:
        src = upload(ctx, src)
    elif src._ctx is not ctx:
        src = transfer(src, ctx)
    ms = self._m
    mt = src._m
    if ms.shape == mt.shape and ms.dtype == mt.dtype:
        node, idx = src._v
        return make_tensor(ctx, node, idx, ms)
    info = op_info(func)
    return trace(func, info, info.bind((self, src), kwargs))


def _native_batch_norm(func: Any, args: tuple, kwargs: dict) -> Any:
    """`native_batch_norm` updates the running stats in place although its schema does not say
    so (functionalization cannot see it).  Trace the functional variant and point the running
    stat tensors at its new values: they are the inner tensors of the module's buffers."""
    info = op_info(func)
    full = info.bind(args, kwargs)
    inp, weight, bias, rmean, rvar, training, momentum, eps = full
    if not training or rmean is None or rvar is None:
        metrics.counter("ltc::native_batch_norm")
        return trace(func, info, full)
    legit = aten._native_batch_norm_legit_functional.default
    metrics.counter("ltc::_native_batch_norm_legit_functional")
    out, mean, invstd, new_mean, new_var = trace(legit, op_info(legit), full)
    for dst, src in ((rmean, new_mean), (rvar, new_var)):
        dst._ctx.rebind(dst, src._v)
    return out, mean, invstd


def copy_into(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """In-place copy across the lazy/host boundary, for the paths that bypass functionalization."""
    if type(dst) is LtcTensor:
        value = src if type(src) is LtcTensor else upload(dst._ctx, src)
        if value._ctx is not dst._ctx:
            value = transfer(value, dst._ctx)
        if value._m.shape != dst._m.shape or value._m.dtype != dst._m.dtype:
            info = op_info(aten.copy.default)
            value = trace(aten.copy.default, info, [dst, value, False])
        dst._ctx.rebind(dst, value._v)
        return dst
    return dst.copy_(gx.materialize([src])[0])


def _lift_fresh(func: Any, args: tuple, kwargs: dict) -> Any:
    """`torch.tensor(data, device="ltc")` fills a bare lazy tensor below functionalization and
    ends with `lift_fresh` on it: this is where it enters the functional world."""
    x = args[0]
    metrics.counter("ltc::lift_fresh")
    node, idx = x._v
    return wrap(make_tensor(x._ctx, node, idx, x._m))


# Ops that read memory layout: always run eagerly on values restrided to eager's layout.
_LAYOUT_DEPENDENT = {aten.as_strided_copy.default, aten.as_strided_scatter.default,
                     aten.as_strided.default}

_IDENTITY = {aten.detach_copy.default, aten.alias_copy.default, aten.lift_fresh_copy.default,
             aten.clone.default, aten.detach.default, aten.alias.default, aten.lift_fresh.default}
for _op in _IDENTITY:
    op_info(_op).identity = True

_SPECIAL: dict[Any, Callable[[Any, tuple, dict], Any]] = {
    aten._to_copy.default: _to_copy,
    aten.copy.default: _copy,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.lift_fresh.default: _lift_fresh,
    aten.lift_fresh_copy.default: _lift_fresh,
}
