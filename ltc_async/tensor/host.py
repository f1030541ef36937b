"""Where lazy tensors meet host memory: uploads, device data, transfers, eager execution.

Design note.  Everything here moves values across the lazy boundary, never traces IR itself:

* `upload` / `adopt` make DEVICE_DATA nodes from host tensors (0-dim uploads are cached by
  exact value: LTC's DataCache) or from tensors already on the backing device;
* `transfer` moves a lazy tensor to another lazy device as a closure on the target's queue;
* `eager_fallback` runs an op the backend cannot lower on synced values and adopts the results;
  `host_op` does the same for ops returning non-tensors (`.item()`), `mutating_host_op` for
  ops writing their arguments with no functional form (c10d collectives).  Values handed to
  eager code get the strides eager would have given them (`eager_layout`): compiled graphs
  may produce other layouts;
* a written lazy tensor is pointed at its new value through `DeviceContext.rebind`, the one
  writer of an existing tensor's value.

Threads: the scalar upload cache is a plain dict (values depend only on the key; cleared
wholesale when large).  Reads and fallbacks wait only for the executions they need
(`graph_executor.read`); a written lazy tensor takes its new value through
`DeviceContext.rebind`, under that device's lock.
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from ..base import counters, events
from ..executor import arena
from ..executor import graph_executor as gx
from ..executor.device import DeviceContext
from ..executor.futures import BackendData
from ..ir.node import Node, TensorMeta, exact, make_data_node
from ..ir.schema import GENERATOR, OpInfo
from . import host_compute
from .lazy_tensor import LtcTensor, make_tensor, tensors_in, unwrap

_META = torch.device("meta")
_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


def seed_from(ctx: DeviceContext, gen: Any) -> int:
    """The seed a random op draws: the device's next one, or one from a user's CPU generator."""
    if gen is None:
        return ctx.next_seed()
    if isinstance(gen, torch.Generator) and gen.device.type == "cpu":
        return int(torch.randint(0, 1 << 62, (), generator=gen))
    if isinstance(gen, torch.Generator) and gen.device.type == "ltc":
        # `torch.Generator(device="ltc:0")` (the native hooks make one): a CPU generator's engine
        # and state on an ltc device.  Draw on a CPU twin of its state, then advance it.
        with _generator_lock:
            twin = torch.Generator()
            twin.set_state(gen.get_state())
            seed = int(torch.randint(0, 1 << 62, (), generator=twin))
            gen.set_state(twin.get_state())
        return seed
    raise RuntimeError(f"ltc_async: unsupported generator {gen!r}; pass a CPU torch.Generator, one made "
                       "with torch.Generator(device='ltc:N'), or none (lazy devices draw from a "
                       "per-device generator seeded by torch.manual_seed)")


_generator_lock = threading.Lock()   # a user's ltc generator shared by threads: one draw at a time


def upload(ctx: DeviceContext, host: torch.Tensor) -> LtcTensor:
    """Device data for a host tensor (copied: later host writes do not leak in)."""
    if type(host) is not torch.Tensor and isinstance(host, torch.nn.parameter.UninitializedTensorMixin):
        with torch._C.DisableTorchFunctionSubclass():   # `LazyLinear().to("ltc:0")`: its empty
            host = host.as_subclass(torch.Tensor)         # placeholder refuses `.shape` itself
    if host.device.type == "ltc":  # a functional wrapper on another lazy device
        return transfer(unwrap(host), ctx)
    if host.is_nested:   # its buffer would travel as a dense tensor the nested ops then misread
        raise RuntimeError(f"ltc_async: a nested tensor cannot move to {ctx.device}: lazy tensors "
                           f"are dense; pad it first (torch.nested.to_padded_tensor) and keep a mask")
    if host.layout is not torch.strided:
        # a sparse (or mkldnn) value would travel as device data claiming a dense layout, and
        # fail only at a later execution, with an error naming no line of the user's
        raise RuntimeError(f"ltc_async: a {host.layout} tensor cannot move to {ctx.device}: lazy "
                           f"tensors are dense (torch.strided); convert it first, e.g. with .to_dense()")
    if host.dim() == 0:
        return _upload_scalar(ctx, host, TensorMeta((), (), host.dtype))
    counters.counter("UploadTensor")
    value = ctx.backend.upload(host, ctx.backend_device)
    # the copy's own strides: dense for an expanded or strided host tensor, as `.to()` gives
    stride = tuple(ctx.backend.to_torch(value).stride())
    meta = TensorMeta(tuple(host.shape), stride, host.dtype)
    data = BackendData(ctx, meta, value=value)
    return make_tensor(ctx, make_data_node(data, meta), 0, meta)


_scalar_cache: dict[tuple, Node] = {}


def scalar_node(ctx: DeviceContext, host: torch.Tensor) -> Node:
    """The device-data node of a 0-dim host tensor (`x + torch.tensor(2.0)`, wrapped numbers),
    cached by exact value: LTC's DataCache.  Read and filled by every tracing thread without a
    lock: a racing miss uploads the value twice and keeps one node, both hold the same value."""
    # exact(): keeps apart what equality would merge (-0.0 vs 0.0, NaN signs), NaN equal to itself.
    # One dtype's values are all of one Python type, and equality of ints, bools and floats other
    # than zeros and NaNs is already exact: those (nearly all) are keys as they are.
    v = host.item()
    tv = type(v)
    if tv is int or tv is bool or (tv is float and v == v and v != 0.0):
        key: tuple = (ctx.index, host.dtype, v)
    else:
        key = (ctx.index, host.dtype, exact(v))
    node = _scalar_cache.get(key)
    if node is None:
        counters.counter("DeviceDataCacheMiss")
        meta = TensorMeta((), (), host.dtype)
        data = BackendData(ctx, meta, value=ctx.backend.upload(host, ctx.backend_device))
        node = make_data_node(data, meta)
        if len(_scalar_cache) > 4096:
            _scalar_cache.clear()
        _scalar_cache[key] = node
    return node


def _upload_scalar(ctx: DeviceContext, host: torch.Tensor, meta: TensorMeta) -> LtcTensor:
    """0-dim host tensors (`x + torch.tensor(2.0)`) are cached by value: LTC's DataCache."""
    node = scalar_node(ctx, host)
    return make_tensor(ctx, node, 0, node.outputs[0])


def adopt(ctx: DeviceContext, value: torch.Tensor) -> LtcTensor:
    """Wrap a tensor already on the backing device (eager-fallback results) as device data."""
    meta = TensorMeta(tuple(value.shape), tuple(value.stride()), value.dtype)
    data = BackendData(ctx, meta, value=ctx.backend.from_torch(value, ctx.backend_device))
    return make_tensor(ctx, make_data_node(data, meta), 0, meta)


def transfer(src: LtcTensor, dst: DeviceContext) -> LtcTensor:
    """Move a lazy tensor to another lazy device, ordered after its producer, no host wait."""
    if src._ctx is dst:
        return src
    counters.counter("TransferToDevice")
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
    values = [eager_layout(v, t._m) for t, v in zip(found, gx.read(found))]
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


def eager_layout(value: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
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
    counters.counter("EagerFallback")
    counters.counter("EagerFallback::" + info.name)
    events.fallback(info.name, full)   # findings (op, user line); the sync guard
    n = info.n_positional_max
    args, kwargs, read_ctx = _materialize_args(*info.split(full))
    if read_ctx is not None:
        counters.round_trip("fallback", info.name)
    for i, k in enumerate(info.kinds):
        if k == GENERATOR:  # keep per-device seeding: a generator on the backing device
            g = torch.Generator(ctx.backend_device)
            g.manual_seed(seed_from(ctx, full[i]))
            if i < n:
                args[i] = g
            else:
                kwargs[info.arg_names[i]] = g
    return _wrap_outputs(func(*args, **kwargs), ctx)


def host_op(func: Any, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """Ops whose result is not a tensor (`.item()`, `bool(t)`, `equal`): a data-dependent sync,
    unless the value is computed on the host from values it has (`host_compute.py`)."""
    counters.counter("DataDependentSync")
    events.host_read(func)   # findings (user line); the sync guard
    scalar = func is _LOCAL_SCALAR and type(args[0]) is LtcTensor and not kwargs
    if scalar:
        known = host_compute.scalar(args[0])
        if known is not None:
            counters.counter("ReadOnHost")
            return func(known)
    hargs, hkwargs, ctx = _materialize_args(args, kwargs)
    if ctx is not None:
        counters.round_trip("read", info.name)
        if scalar:   # known from now on
            host_compute.remember([args[0]._v], [hargs[0]])
    out = func(*hargs, **hkwargs)
    return _wrap_outputs(out, ctx) if ctx is not None else out


def mutating_host_op(func: Any, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """Ops that write their arguments and have no functional form (torch.distributed's
    `c10d::allreduce_` and friends): run on host copies at this point of the program, then
    point the written lazy tensors at the results.  Device data stays immutable."""
    counters.counter("HostMutation")
    counters.counter("HostMutation::" + info.name)
    full = info.bind(args, kwargs)
    written: dict[int, LtcTensor] = {}

    for i in info.written:
        for t in tensors_in(full[i], LtcTensor):
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

    def back(o: torch.Tensor) -> Any:
        lazy = results.get(id(o))
        return lazy if lazy is not None else adopt(_ctx_of(written), o)
    return tree_map_only(torch.Tensor, back, out)


def _ctx_of(tensors: dict[int, LtcTensor]) -> DeviceContext:
    return next(iter(tensors.values()))._ctx if tensors else arena.get(None)
