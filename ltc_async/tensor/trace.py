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

Invariant: a lazy tensor's strides (its `TensorMeta`) are the strides its value has when the
graph runs.  Eager kernels such as `native_group_norm_backward` read raw memory and rely on
callers' `.contiguous()`; a tensor claiming a layout its value lacks gives garbage there.
"""
from __future__ import annotations

from typing import Any

import torch

from .._config import config
from ..executor import arena
from ..executor.device import DeviceContext, caller_location
from ..ir.node import RNG, SCALAR, TENSOR, TENSOR_LIST, Node, exact
from ..ir.schema import CONST, GENERATOR, NUM_CONST, OPT_TENSOR, OpInfo
from ..ir.schema import SCALAR as K_SCALAR
from ..ir.schema import TENSOR as K_TENSOR
from ..ir.schema import TENSOR_LIST as K_TENSOR_LIST
from . import shapes
from .host import eager_fallback, seed_from, upload
from .lazy_tensor import LtcTensor, make_tensor

aten = torch.ops.aten
_SCALAR_TYPES = (int, float)  # bools stay constants: TorchScript has no bool Scalar
_INT64 = 1 << 63              # eager takes ints up to 2**64 - 1 as Scalars; TorchScript's int is int64

# Ops that read memory layout: always run eagerly on values restrided to eager's layout, as
# the op given here.  `as_strided_copy` runs as the view: its result keeps eager's strides
# (overlapping ones too, which `inplace.py` looks for), and values are never written anyway.
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


def _is_wide(v: Any) -> bool:
    """An int (or list of ints) TorchScript cannot hold: only eager takes (or rejects) it."""
    if type(v) is int:
        return not -_INT64 <= v < _INT64
    return (type(v) is list or type(v) is tuple) and any(_is_wide(e) for e in v)


def trace(func: Any, info: OpInfo, full: list) -> Any:
    """Record `func(*full)` as an IR node and return lazy tensors for its outputs."""
    operands: list[tuple[Node, int]] = []
    template: list[Any] = []
    scalars: list[Any] = []
    ctx: DeviceContext | None = None
    uploads: list[tuple[int, int | None, torch.Tensor]] | None = None  # (template pos, list pos, tensor)
    wide = False  # an int scalar beyond int64: only eager takes it
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
                    raise _host_among_lazy(v, info)
                uploads = uploads or []
                uploads.append((len(template), None, v))
                template.append(None)
            else:  # a Python number where the schema says Tensor: a wrapped number
                if type(v) is int and not -_INT64 <= v < _INT64:
                    wide = True
                template.append((SCALAR, len(scalars), type(v)))
                scalars.append(v)
        elif k == K_SCALAR:
            tv = type(v)
            if info.is_factory or tv not in _SCALAR_TYPES:
                if tv is int and not -_INT64 <= v < _INT64:
                    wide = True
                template.append(exact(v))  # factories: scalars can decide shapes (arange)
            else:
                if tv is int and not -_INT64 <= v < _INT64:
                    wide = True
                template.append((SCALAR, len(scalars), tv))
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
                    refs.append(len(operands))
                    operands.append(e._v)
                elif e is None:
                    refs.append(None)
                else:  # host tensors in index lists are allowed, as in eager CUDA
                    if i not in info.index_lists:
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
                scalars[e[1]] = seed_from(ctx, scalars[e[1]])
    if wide:
        return eager_fallback(func, info, full, ctx)
    tpl = tuple(template)
    skey = (info.qualname, tpl, tuple([n.outputs[i] for n, i in operands]))
    res = shapes.cache.get(skey)
    if res is None:
        res = shapes.FALLBACK if func in _LAYOUT_DEPENDENT or info.qualname in config.force_fallback \
            else shapes.infer(func, info, full)   # force_fallback: `ltc.debug.force_fallback`
        if res is not shapes.FALLBACK and not ctx.backend.can_lower(
                Node(func, tuple(operands), tpl, tuple(scalars), res[0], res[1], op_key=info.qualname)):
            res = shapes.FALLBACK
        shapes.remember(skey, res)
    if res is shapes.FALLBACK:
        return eager_fallback(_LAYOUT_DEPENDENT.get(func, func), info, full, ctx)
    metas, out_spec = res
    if info.identity:  # values are immutable: the output is the input's value ...
        node, i = operands[0]
        if node.outputs[i].stride == metas[0].stride:
            return make_tensor(ctx, node, i, metas[0])
        # ... unless it has another layout (`contiguous()` of a transposed or expanded tensor):
        # kernels that read memory directly trust the layout they were promised
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
