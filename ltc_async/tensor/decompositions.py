"""Ops traced as other aten ops (LTC's decompositions), for ops whose own node would not do.

Design note.  A handler here receives the op below autograd and functionalization, as the
generic path would, and calls the aten ops it decomposes into on the same lazy tensors: each of
them is traced as usual (its own shape inference, lowering check and node).  Two families
below autograd:

* **`_foreach_*` ops with a list of scalars** (`Scalar[]`, or a host `Tensor` of them): the list
  would be baked into the node as constants, so Adam's bias corrections (new values every
  step) would compile a new graph every step -- and TorchScript takes no `Scalar[]` at all, so
  they took the eager fallback.  Each becomes one op per tensor, the op eager's CPU kernel runs per
  tensor, with its scalar a runtime scalar of that node (keyed by type, as every other
  scalar), so no value ever recompiles.
* **The fused RNN cells** `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` and their backward
  ops: ATen picks them for every non-CPU device (`nn.LSTM`, `nn.GRU`, `nn.LSTMCell`, ...), but
  only CUDA has kernels.  They become the pointwise ops of ATen's CUDA kernels
  (`aten/src/ATen/native/cuda/RNN.cu`), with the same workspace layout, so the autograd
  formulas ATen records for them (which call the backward ops below) work unchanged.

Above autograd (`register()`, kernels for `AutogradPrivateUse1`, which only ltc tensors reach):

* **the in-place `_foreach_*_` ops** (every optimizer step): functionalization would first run
  each of them on meta copies of its arguments, every call, through Python meta kernels (about
  70 us per tensor); here that check runs once per signature and the functional op is traced
  on the inner lazy tensors, each written wrapper then takes its result (see the section);
* `_pack_padded_sequence` reads its host `lengths` and returns `batch_sizes` on the host, where
  the packed RNN kernels read it.  Below autograd, functionalization would wrap that host result
  (and every later read of its memory would fail), so its kernel computes `batch_sizes` with
  eager's own kernel (on a stand-in of the input's first two dims: eager's checks and errors)
  and the packed data with differentiable ops on the lazy input, as ATen's kernel does.

Argument checks run on meta once per signature (`_check_on_meta`: tensor metas, list lengths,
scalar types); the per-tensor ops go straight to the op path (`dispatch`), not through the
dispatcher again.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..base import counters
from ..ir.schema import TENSOR_LIST, aten_schemas, op_info, type_name
from . import shapes
from .dispatch import dispatch, register_handlers
from .lazy_tensor import LtcTensor, inner_of
from .trace import check_host_arguments, trace
from .writeback import write

aten = torch.ops.aten

# -- _foreach_* with scalar lists ---------------------------------------------------------------

# `_foreach_<name>`'s list overloads -> the op eager's per-tensor (slow) path calls for one tensor
_PER_TENSOR = {
    "add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor, "div": aten.div.Tensor,
    "clamp_min": aten.clamp_min.default, "clamp_max": aten.clamp_max.default,
    "maximum": aten.clamp_min.default, "minimum": aten.clamp_max.default,
    "pow": aten.pow.Tensor_Scalar, "lerp": aten.lerp.Scalar,
    "addcdiv": aten.addcdiv.default, "addcmul": aten.addcmul.default,
}


def _meta_of(v: Any) -> Any:
    """A lazy tensor (inner, or a user's functional wrapper) as a meta tensor of its geometry."""
    if type(v) is LtcTensor:
        return shapes.to_meta(v)
    if isinstance(v, torch.Tensor) and v.device.type == "ltc":
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=_META)
    if type(v) is list or type(v) is tuple:
        return [_meta_of(e) for e in v]
    return v


def _validate_on_meta(func: Any, args: Any, kwargs: dict) -> None:
    """Eager's argument checks (list lengths, shapes, where the scalars live) at the user's line:
    the op itself on meta tensors.  Host tensors stay where they are: their device is checked."""
    try:
        func(*[_meta_of(a) for a in args], **{k: _meta_of(v) for k, v in kwargs.items()})
    except RuntimeError as e:
        raise RuntimeError(str(e).replace("got meta", f"got {_device_of(args)}")) from None


def _device_of(args: Any) -> str:
    for a in args:
        for t in (a if type(a) is list else [a]):
            if type(t) is LtcTensor:
                return str(t._ctx.device)
            if isinstance(t, torch.Tensor) and t.device.type == "ltc":
                return str(t.device)
    return "ltc"


# Signatures whose meta check passed: (op, argument signatures) -> True.  A foreach call checks
# every tensor of its lists; an optimizer repeats the same call every step, so after the first
# step this costs one key (the tensors' metas, the scalars' types) and one lookup.  Read and
# written by every tracing thread without a lock: single dict operations are atomic under the
# GIL and a racing insert only stores the same True twice.
_checked: dict[tuple, bool] = {}
_CHECKED_MAX = 4096


def _check_on_meta(func: Any, info: Any, full: list) -> None:
    """`_validate_on_meta`, once per signature."""
    try:
        key = (func, *[shapes.signature(v) for v in full])
        if key in _checked:
            return
        hash(key)
    except TypeError:  # an unhashable argument: check every call
        key = None
    _validate_on_meta(func, *info.split(full))
    if key is not None:
        if len(_checked) >= _CHECKED_MAX:
            _checked.clear()
        _checked[key] = True


def _foreach_with_scalars(func: Any, args: tuple, kwargs: dict) -> list:
    """`_foreach_op(tensors..., scalars)`: `op(tensor_i..., scalars[i])` for each i."""
    info = op_info(func)
    full = info.bind(args, kwargs)
    _check_on_meta(func, info, full)
    *lists, scalars = full
    if isinstance(scalars, torch.Tensor):  # the `.Tensor` overload: a host tensor of scalars
        scalars = scalars.tolist()
    per_tensor = _PER_TENSOR[info.name.split(".")[0][len("_foreach_"):]]
    slot = per_tensor._schema.arguments[len(lists)]  # the scalar's argument
    if slot.kwarg_only:  # `addcdiv(self, tensor1, tensor2, *, value)`
        return [dispatch(per_tensor, tuple([lst[i] for lst in lists]), {slot.name: s})
                for i, s in enumerate(scalars)]
    return [dispatch(per_tensor, (*[lst[i] for lst in lists], s), None) for i, s in enumerate(scalars)]


# -- _foreach_*_ in place, above autograd ---------------------------------------------------------
#
# PyTorch's functionalization kernel of an in-place op first runs the op itself on meta copies of
# its arguments (to catch what only the in-place form rejects, such as broadcasting `self`).  The
# foreach ops' meta kernels are Python (`torch/_meta_registrations.py`), per tensor: ~70 us per
# tensor, 10-25 ms per optimizer step of a small model, every step.  So the in-place foreach
# overloads get a kernel for `AutogradPrivateUse1` (ltc tensors only) that does what autograd
# (nothing to record: no grad mode, or nothing requires grad) and functionalization would do,
# with that meta check run once per signature: the functional op on the inner lazy tensors
# (one traced node, or the decomposition above), then each written wrapper takes its new value
# (`replace_`, `commit_update`, `sync`, as functionalization does) and its version is bumped.
# When autograd must record (grad mode and an input requiring grad, or a forward-AD level), the
# functional op runs through the dispatcher and each target takes its result by `copy_`, which
# records the same derivatives.  Tensors that are not all ltc wrappers, and calls under a Python
# dispatch mode, take PyTorch's own path below autograd.

_fwd_ad = torch.autograd.forward_ad
_dispatch_modes = torch._C._len_torch_dispatch_stack
_META = torch.device("meta")


def _inner_args(info: Any, full: list) -> list | None:
    """The bound arguments with every tensor replaced by its inner lazy tensor; None unless all
    tensors in lists are ltc tensors (a lone host tensor, such as a tensor of scalars, stays)."""
    out: list[Any] = []
    for k, v in zip(info.kinds, full):
        if k == TENSOR_LIST:
            lst = []
            for t in v:
                i = inner_of(t)
                if i is None:
                    return None
                lst.append(i)
            out.append(lst)
        elif isinstance(v, torch.Tensor):
            i = inner_of(v)
            if i is None:
                if v.device.type == "ltc":
                    return None
                out.append(v)
            else:
                out.append(i)
        else:
            out.append(v)
    return out


def _write(targets: list, inner: list[LtcTensor], outs: list) -> None:
    """Each target takes its new value (`writeback.write`: the value seen through every alias,
    the version counter bumped; an unshared view with the value's layout takes a fresh storage)."""
    write(targets, outs, layouts=[i._m for i in inner])


def records_autograd(full: Any) -> bool:
    """Whether autograd records a call with these arguments (tensors, or lists of them): grad
    mode and an input requiring grad, or a forward-AD level.  (`composites.py` too.)"""
    if _fwd_ad._current_level >= 0:
        return True
    if not torch.is_grad_enabled():
        return False
    for v in full:
        if type(v) is list or type(v) is tuple:
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in v):
                return True
        elif isinstance(v, torch.Tensor) and v.requires_grad:
            return True
    return False


def _inplace_foreach_kernel(inplace: Any, functional: Any) -> Callable[..., None]:
    info = op_info(inplace)
    # the lists the op writes (`Tensor(a!)[]`): the functional twin returns their new values,
    # in this order (one list, or a tuple of lists for the fused optimizers)
    written = [i for i, a in enumerate(inplace._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    # `_fused_sgd_` / `_fused_adagrad_` have no meta kernel: their functional twin's own
    # shape inference checks the call
    meta_check = _check_on_meta if torch._C._dispatch_has_kernel_for_dispatch_key(
        inplace.name(), "Meta") or "_foreach_" in inplace.name() else (lambda *a: None)

    def kernel(*args: Any, **kwargs: Any) -> None:
        full = info.bind(args, kwargs)
        inner = _inner_args(info, full) if _dispatch_modes() == 0 else None
        if inner is not None:
            if not records_autograd(full):
                meta_check(inplace, info, inner)   # what functionalization checks first
                fargs, fkwargs = info.split(inner)
                outs = dispatch(functional, tuple(fargs), fkwargs)
                if len(written) == 1:
                    _write(full[0], inner[0], outs)
                else:
                    for i, new in zip(written, outs):
                        _write(full[i], inner[i], new)
                return None
            if len(written) != 1:   # a fused optimizer under autograd: PyTorch's path
                with torch._C._AutoDispatchBelowAutograd():
                    return inplace(*args, **kwargs)
            # recorded by autograd: the functional op on copies of the targets (its derivative
            # may read them), then each target takes its result
            _validate_on_meta(inplace, *info.split(full))
            targets = full[0]
            fargs, fkwargs = info.split([[t.clone() for t in targets], *full[1:]])
            for t, o in zip(targets, functional(*fargs, **fkwargs)):
                t.copy_(o)
            return None
        with torch._C._AutoDispatchBelowAutograd():   # PyTorch's path: version bump, functionalization
            return inplace(*args, **kwargs)
    return kernel


def _inplace_foreach_ops() -> list[tuple[Any, Any]]:
    """Every in-place `_foreach_*_` overload, and the fused optimizers (`_fused_adam_`,
    `_fused_adamw_`, `_fused_sgd_`, ...: `Adam(fused=True)`), with its functional twin.  (The
    fused optimizers also need this path for correctness: PyTorch's functionalization kernel
    takes an empty list, Adam's `max_exp_avg_sqs` without amsgrad, for a non-functional
    argument and fails an internal assert.)"""
    found = []
    names = sorted({s.name.split("::")[1] for s in aten_schemas()
                    if s.name.startswith(("aten::_foreach_", "aten::_fused_"))
                    and s.name.endswith("_")})
    for name in names:
        packet, functional = getattr(aten, name, None), getattr(aten, name[:-1], None)
        if packet is None or functional is None:
            continue
        for overload in packet.overloads():
            twin = getattr(functional, overload, None)
            op = getattr(packet, overload)
            if twin is not None and [a.name for a in twin._schema.arguments] == \
                    [a.name for a in op._schema.arguments]:
                found.append((op, twin))
    return found


def _foreach_decompositions() -> dict[Any, Callable[[Any, tuple, dict], Any]]:
    table = {getattr(aten, "_foreach_" + name).ScalarList: _foreach_with_scalars for name in _PER_TENSOR}
    # `.Tensor` overloads holding one scalar per tensor (the others take one tensor for all,
    # `_foreach_mul.Tensor`, and trace as they are)
    table.update({getattr(aten, "_foreach_" + name).Tensor: _foreach_with_scalars
                  for name in ("addcdiv", "addcmul")})
    return table


# -- fused RNN cells ----------------------------------------------------------------------------

def _split(t: LtcTensor, n: int, dim: int) -> list:
    return aten.split_copy.Tensor(t, t.shape[dim] // n, dim)


def _one_minus(t: LtcTensor) -> LtcTensor:
    return aten.rsub.Scalar(t, 1)


def _with_bias(gates: LtcTensor, bias: LtcTensor | None) -> LtcTensor:
    return gates if bias is None else aten.add.Tensor(gates, bias)


def _lstm_cell(func: Any, args: tuple, kwargs: dict) -> tuple:
    """`_thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias)` ->
    (hy, cy, workspace): gates i, f, g, o; workspace = activated gates (backward's input)."""
    input_gates, hidden_gates, cx, input_bias, hidden_bias = op_info(func).bind(args, kwargs)
    gates = aten.add.Tensor(_with_bias(input_gates, input_bias), _with_bias(hidden_gates, hidden_bias))
    i, f, g, o = _split(gates, 4, 1)
    i, f, g, o = aten.sigmoid.default(i), aten.sigmoid.default(f), aten.tanh.default(g), aten.sigmoid.default(o)
    cy = aten.add.Tensor(aten.mul.Tensor(f, cx), aten.mul.Tensor(i, g))
    hy = aten.mul.Tensor(o, aten.tanh.default(cy))
    return hy, cy, aten.cat.default([i, f, g, o], 1)


def _lstm_cell_backward(func: Any, args: tuple, kwargs: dict) -> tuple:
    """`_thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)` ->
    (grad_gates, grad_cx, grad_bias)."""
    grad_hy, grad_cy, cx, cy, workspace, has_bias = op_info(func).bind(args, kwargs)
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = _split(workspace, 4, 1)
    tanh_cy = aten.tanh.default(cy)
    if grad_hy is None:
        grad_o = aten.zeros_like.default(o)
        grad_c = grad_cy
    else:
        grad_o = aten.mul.Tensor(grad_hy, tanh_cy)
        d_tanh = _one_minus(aten.mul.Tensor(tanh_cy, tanh_cy))
        grad_c = aten.mul.Tensor(aten.mul.Tensor(grad_hy, o), d_tanh)
        if grad_cy is not None:
            grad_c = aten.add.Tensor(grad_c, grad_cy)
    grad_i = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(grad_c, g), _one_minus(i)), i)
    grad_f = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(grad_c, cx), _one_minus(f)), f)
    grad_g = aten.mul.Tensor(aten.mul.Tensor(grad_c, i), _one_minus(aten.mul.Tensor(g, g)))
    grad_o = aten.mul.Tensor(aten.mul.Tensor(grad_o, _one_minus(o)), o)
    grad_gates = aten.cat.default([grad_i, grad_f, grad_g, grad_o], 1)
    grad_cx = aten.mul.Tensor(grad_c, f)
    grad_bias = aten.sum.dim_IntList(grad_gates, [0]) if has_bias else None
    return grad_gates, grad_cx, grad_bias


def _gru_cell(func: Any, args: tuple, kwargs: dict) -> tuple:
    """`_thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias)` ->
    (hy, workspace): gates r, z (ATen's "i"), n; workspace = r, z, hx, hidden n + bias, n."""
    input_gates, hidden_gates, hx, input_bias, hidden_bias = op_info(func).bind(args, kwargs)
    ir, ii, in_ = _split(_with_bias(input_gates, input_bias), 3, 1)
    hr, hi, hn = _split(_with_bias(hidden_gates, hidden_bias), 3, 1)
    r = aten.sigmoid.default(aten.add.Tensor(ir, hr))
    z = aten.sigmoid.default(aten.add.Tensor(ii, hi))
    n = aten.tanh.default(aten.add.Tensor(in_, aten.mul.Tensor(r, hn)))
    hy = aten.add.Tensor(n, aten.mul.Tensor(z, aten.sub.Tensor(hx, n)))
    return hy, aten.cat.default([r, z, hx, hn, n], 1)


def _gru_cell_backward(func: Any, args: tuple, kwargs: dict) -> tuple:
    """`_thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)` -> (grad_input_gates,
    grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)."""
    grad_hy, workspace, has_bias = op_info(func).bind(args, kwargs)
    r, z, hx, hn, n = _split(workspace, 5, 1)
    grad_z = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(grad_hy, aten.sub.Tensor(hx, n)),
                                             _one_minus(z)), z)
    grad_hx = aten.mul.Tensor(grad_hy, z)
    grad_in = aten.mul.Tensor(aten.mul.Tensor(grad_hy, _one_minus(z)), _one_minus(aten.mul.Tensor(n, n)))
    grad_hn = aten.mul.Tensor(grad_in, r)
    grad_r = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(grad_in, hn), _one_minus(r)), r)
    grad_input_gates = aten.cat.default([grad_r, grad_z, grad_in], 1)
    grad_hidden_gates = aten.cat.default([grad_r, grad_z, grad_hn], 1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return (grad_input_gates, grad_hidden_gates, grad_hx,
            aten.sum.dim_IntList(grad_input_gates, [0]), aten.sum.dim_IntList(grad_hidden_gates, [0]))


# -- packed sequences, above autograd ------------------------------------------------------------

def _pack_padded_sequence(input: torch.Tensor, lengths: torch.Tensor, batch_first: bool) -> tuple:
    if lengths.device.type != "cpu":  # eager's check, naming the lazy device
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got {lengths.dim()}D "
                           f"{lengths.device} {type_name(lengths.dtype)} tensor")
    shape = list(input.shape)
    stand_in = torch.empty((), dtype=input.dtype).expand(shape[:2] + [min(d, 1) for d in shape[2:]])
    _, batch_sizes = aten._pack_padded_sequence.default(stand_in, lengths, batch_first)
    steps = input.transpose(0, 1) if batch_first else input   # time-major
    rows = batch_sizes.tolist()
    chunks, t = [], 0
    while t < len(rows):  # runs of equal batch size: one slice each, as ATen's kernel
        end = t
        while end < len(rows) and rows[end] == rows[t]:
            end += 1
        chunks.append(steps[t:end, :rows[t]].contiguous().view(-1, *shape[2:]))
        t = end
    return torch.cat(chunks), batch_sizes


_libs: list = []


def register() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_pack_padded_sequence", _pack_padded_sequence, "AutogradPrivateUse1")
    for op, functional in _inplace_foreach_ops():
        name = op._schema.name.split("::")[1]
        overload = op._schema.overload_name
        lib.impl(name + ("." + overload if overload else ""), _inplace_foreach_kernel(op, functional),
                 "AutogradPrivateUse1")
    _libs.append(lib)


def _fma(func: Any, args: tuple, kwargs: dict) -> Any:
    """`prims::fma(a, b, c)` = `a * b + c`, its reference implementation (Dynamo writes
    `t.addcmul_(x, y, value=v)` as `t.copy_(fma(x * y, v, t))`: AdamW with `foreach=False`
    under `torch.compile`).  An Inductor prim, registered only once Inductor is imported, so
    it is looked up by name."""
    a, b, c = op_info(func).bind(args, kwargs)
    mul = aten.mul.Tensor if isinstance(b, torch.Tensor) else aten.mul.Scalar
    return dispatch(aten.add.Tensor, (dispatch(mul, (a, b), {}), c), {})


def _pinv(func: Any, args: tuple, kwargs: dict) -> Any:
    """`linalg_pinv` traced as itself, its default tolerances spelled out: with `atol` and
    `rtol` both None, TorchScript resolves the call to the float overload and the op would take
    the eager fallback.  `atol = 0` is the same call (eager then takes rtol = eps * max(m, n))."""
    info = op_info(func)
    a, atol, rtol, hermitian = info.bind(args, kwargs)
    counters.counter(info.counter)
    if atol is None and rtol is None and isinstance(a, LtcTensor) and \
            (a._m.dtype.is_floating_point or a._m.dtype.is_complex):
        atol = torch.zeros((), dtype=a._m.dtype.to_real())
    return trace(func, info, [a, atol, rtol, hermitian])


_INTEGRAL = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _histc(func: Any, args: tuple, kwargs: dict) -> Any:
    """`torch.histc` of an integer tensor: CUDA's kernel takes it (transformers' MoE
    load-balancing loss calls it on int32 expert indices whenever the device is not the CPU),
    the CPU's has no integer case.  The same bins counted in float64 (exact for every integer
    a bin edge can tell apart), returned in the input's dtype as CUDA returns them."""
    info = op_info(func)
    x, bins, lo, hi = info.bind(args, kwargs)
    if not (isinstance(x, LtcTensor) and x._m.dtype in _INTEGRAL):
        counters.counter(info.counter)
        return trace(func, info, [x, bins, lo, hi])
    counts = dispatch(func, (_cast(x, torch.float64), bins, lo, hi), None)
    return _cast(counts, x._m.dtype)


def _cast(x: LtcTensor, dtype: torch.dtype) -> LtcTensor:
    """`x.to(dtype)` below functionalization, traced (`_to_copy`'s handler wraps what it
    returns for functionalization's own callers)."""
    info = op_info(aten._to_copy.default)
    counters.counter(info.counter)
    return trace(aten._to_copy.default, info, info.bind((x,), {"dtype": dtype}))


def _put(func: Any, args: tuple, kwargs: dict) -> Any:
    """`torch.put(self, index, source)`, traced as itself after eager CUDA's device check.
    `put` has only a composite kernel (`self.clone().put_(index, source)`), so it takes CPU
    0-dim tensors by the declarations (`device_checks.py`), but the `put_` it runs checks that
    all three are on one device: a CPU 0-dim `self` (or `index`, `source`) among CUDA tensors is
    refused there.  Taken as a wrapped scalar instead, a 1-element `self` reached the device's
    kernel with the sample's indices: on CUDA a device-side assert (`put_kernel`'s
    `CUDA_KERNEL_ASSERT(idx >= -numel && idx < numel)`, IndexKernel.cu) that kills the context,
    where eager CUDA raises the device error first."""
    info = op_info(func)
    full = info.bind(args, kwargs)
    check_host_arguments(op_info(aten.put_.default), full)   # put_'s device rules
    counters.counter(info.counter)
    return trace(func, info, full)


#: decompositions of ops that may not exist when this module loads, by qualified name
BY_NAME: dict[str, Callable[[Any, tuple, dict], Any]] = {"prims::fma": _fma}

DECOMPOSITIONS: dict[Any, Callable[[Any, tuple, dict], Any]] = {
    **_foreach_decompositions(),
    aten._thnn_fused_lstm_cell.default: _lstm_cell,
    aten._thnn_fused_lstm_cell_backward_impl.default: _lstm_cell_backward,
    aten._thnn_fused_gru_cell.default: _gru_cell,
    aten._thnn_fused_gru_cell_backward.default: _gru_cell_backward,
    aten.linalg_pinv.atol_rtol_tensor: _pinv,
    aten.histc.default: _histc,
    aten.put.default: _put,
}
register_handlers(DECOMPOSITIONS, BY_NAME)
