"""Cutting, keying, compiling and scheduling graphs (LTC's `LazyGraphExecutor`).

Design note.  `sync_tensors(ctx, tensors)` is `SyncTensorsGraph` + `ScheduleSyncTensorsGraph`:

1. under the device's locker, take the tensors that still hold pending IR, dedupe their
   (node, output) values and walk the graph in post-order;
2. build the graph key: for every node its local key (op + template, or shape/dtype for device
   data) and the post-order positions of its operands.  This identifies the graph *exactly*
   (equal keys, equal programs), which a DAG hash alone does not when the same data feeds
   several places; the LRU `ComputationCache` is looked up with it and a miss compiles once
   (`UncachedCompile`, `CompileTime`);
3. hand every synced tensor a placeholder `BackendData` (output i of a new `Future`) and swap its
   IR for a DEVICE_DATA node, so the next trace can consume the result before it exists;
4. queue the execution on the device worker and return.  The worker resolves inputs (waiting
   only for other devices' data: its own queue already ran everything before it), runs the
   computation, and completes the future with the outputs or the error.
"""
from __future__ import annotations

import collections
import threading
import time
import warnings
from typing import Any, Sequence

import torch

from .. import metrics
from .._config import config
from ..backend import Computation
from .interpreter import Interpreter
from ..ir.lint import lint
from ..ir.node import DEVICE_DATA, Node, TensorMeta, make_data_node, post_order
from .device import DeviceContext, ExecutionError, caller_location, lock_devices
from .futures import BackendData, ComputationError, Future, MultiWait


class ComputationCache:
    """LRU map graph key -> compiled `Computation` (LTC's `ComputationCache`)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._d: collections.OrderedDict[Any, Computation] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Computation | None:
        with self._lock:
            c = self._d.get(key)
            if c is not None:
                self._d.move_to_end(key)
            return c

    def put(self, key: Any, comp: Computation) -> None:
        with self._lock:
            self._d[key] = comp
            self._d.move_to_end(key)
            while len(self._d) > self.capacity:
                self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


cache = ComputationCache(config.compile_cache_size)


class GraphPlan:
    """A cut graph: post-order, exact key, and the runtime inputs in graph-input order."""

    __slots__ = ("order", "roots", "key", "inputs")

    def __init__(self, roots: list[tuple[Node, int]]) -> None:
        order = post_order([n for n, _ in roots])
        pos = {id(n): i for i, n in enumerate(order)}
        parts: list[Any] = []
        inputs: list[Any] = []
        for n in order:
            if n.op is DEVICE_DATA:
                parts.append(n.key)
                inputs.append(n.data)
            else:
                parts.append((n.key, tuple([(pos[id(o)], i) for o, i in n.operands])))
                if n.scalars:
                    inputs.extend(n.scalars)
        self.order = order
        self.roots = roots
        self.key = (tuple(parts), tuple([(pos[id(n)], i) for n, i in roots]))
        self.inputs = inputs


def _roots_of(tensors: Sequence[Any]) -> tuple[list[tuple[Node, int]], list[Any], list[int]]:
    """Unique pending (node, output) values of `tensors`, and which root each tensor maps to."""
    roots: list[tuple[Node, int]] = []
    index: dict[tuple[int, int], int] = {}
    pending: list[Any] = []
    which: list[int] = []
    for t in tensors:
        v = t._v  # one read: another thread may swap it for device data at any time
        node = v[0]
        if node.op is DEVICE_DATA:
            continue
        k = (id(node), v[1])
        r = index.get(k)
        if r is None:
            r = index[k] = len(roots)
            roots.append(v)
        pending.append(t)
        which.append(r)
    return roots, pending, which


def _input_shapes(plan: GraphPlan) -> str:
    """The distinct shapes of a graph's device-data inputs ("64x64,64"), for per-shape
    compile counts: a loop whose last batch is smaller shows two entries, each compiled once."""
    seen: dict[tuple, None] = {}
    for n in plan.order:
        if n.op is DEVICE_DATA:
            seen.setdefault(n.outputs[0].shape, None)
    text = ",".join("x".join(map(str, s)) or "scalar" for s in seen)
    return text if len(text) <= 160 else text[:157] + "..."


def compile_plan(ctx: DeviceContext, plan: GraphPlan) -> Computation:
    key = (str(ctx.backend_device), plan.key)
    comp = cache.get(key)
    if comp is not None:
        metrics.counter("CachedCompile")
        return comp
    metrics.counter(metrics.COMPILE_SHAPES_PREFIX + _input_shapes(plan))
    t0 = time.perf_counter()
    try:
        comp = ctx.backend.compile(plan.order, plan.roots, ctx.backend_device)
        # a new graph key, but the backend had this very program compiled already
        metrics.counter("CompileReuse" if comp.reused_program else "UncachedCompile")
    except Exception as e:  # noqa: BLE001 - the step must still run: interpret it eagerly
        metrics.counter("UncachedCompile")
        metrics.counter("CompileFallback")
        warnings.warn(f"ltc_async: {ctx.backend.name} could not compile a graph "
                      f"({type(e).__name__}: {e}); running it with the IR interpreter", stacklevel=3)
        comp = Interpreter(plan.order, plan.roots, ctx.backend_device)
    metrics.add_sample("CompileTime", time.perf_counter() - t0)
    cache.put(key, comp)
    return comp


def sync_tensors(ctx: DeviceContext, tensors: Sequence[Any], label: str | None = None) -> Future | None:
    """Schedule the pending IR of `tensors` (all on `ctx`) as one graph; return its future."""
    with ctx.lock:
        return _sync_locked(ctx, tensors, label)


def sync_multi(tensors: Sequence[Any], label: str | None = None) -> list[Future]:
    """Schedule the pending IR of tensors on any devices: one graph per device, all cut under
    one barrier across their lockers (LTC's `TensorCollectionBarrier`), so a concurrent
    `mark_step` sees either none or all of them scheduled."""
    groups: dict[int, list[Any]] = {}
    for t in tensors:
        groups.setdefault(t._ctx.index, []).append(t)
    if len(groups) == 1:
        (group,) = groups.values()
        f = sync_tensors(group[0]._ctx, group, label)
        return [f] if f is not None else []
    ctxs = [g[0]._ctx for g in groups.values()]
    futures = []
    with lock_devices(ctxs):
        for group in groups.values():
            f = _sync_locked(group[0]._ctx, group, label)
            if f is not None:
                futures.append(f)
    return futures


def _sync_locked(ctx: DeviceContext, tensors: Sequence[Any], label: str | None) -> Future | None:
    t0 = time.perf_counter()
    roots, pending, which = _roots_of(tensors)
    if not roots:
        return None
    if config.ir_debug:
        lint(roots)
    plan = GraphPlan(roots)
    comp = compile_plan(ctx, plan)
    future = Future(label or caller_location(), ctx)
    datas = [BackendData(ctx, n.outputs[i], future=future, index=j) for j, (n, i) in enumerate(roots)]
    dnodes = [make_data_node(d, d.meta) for d in datas]
    for t, r in zip(pending, which):
        t._v = (dnodes[r], 0)
        ctx.unregister(t)
    ctx.inflight.acquire()  # bounded queue: wait here if the device is far behind
    ctx.worker.submit(lambda: _run(ctx, comp, plan.inputs, future))
    ctx.last = future
    metrics.counter("SyncTensorsGraphCount")
    metrics.add_sample("SyncTensorsGraph", time.perf_counter() - t0)
    return future


def _run(ctx: DeviceContext, comp: Computation, inputs: list[Any], future: Future) -> None:
    """Worker side of one execution: every outcome ends in `future`, never in the thread."""
    try:
        values = [x.get() if type(x) is BackendData else x for x in inputs]
        t0 = time.perf_counter()
        outs = comp.execute(values)
        future.marker = ctx.backend.completion_marker(ctx.backend_device)
        metrics.add_sample("ExecuteTime", time.perf_counter() - t0)
    except BaseException as e:  # noqa: BLE001 - captured for the next barrier
        err = ExecutionError(f"execution on {ctx.device} of the graph scheduled at {future.label} "
                             f"failed: {type(e).__name__}: {e}")
        err.__cause__ = e
        ctx.record_error(err)
        ctx.inflight.release()
        future.set_error(e)
        return
    ctx.inflight.release()
    future.set_result(outs)


def schedule_transfer(src: BackendData, dst: DeviceContext, meta: TensorMeta) -> BackendData:
    """Copy `src` to `dst` on `dst`'s worker, after `src`'s producer finished."""
    future = Future(f"transfer {src.device} -> {dst.device}", dst)
    out = BackendData(dst, meta, future=future, index=0)

    def run() -> None:
        try:
            value = src.get()
            res = dst.backend.upload(src.device.backend.to_torch(value), dst.backend_device)
        except BaseException as e:  # noqa: BLE001
            future.set_error(e)
            return
        future.set_result([res])
    with dst.lock:
        dst.worker.submit(run)
        dst.last = future
    return out


def data_of(t: Any) -> BackendData:
    """The BackendData of a lazy tensor, scheduling its pending graph first if needed."""
    if not t._v[0].is_data:
        sync_tensors(t._ctx, [t])
    return t._v[0].data


def materialize(tensors: Sequence[Any]) -> list[torch.Tensor]:
    """Backend `torch.Tensor`s of lazy tensors, waiting only for the futures they need.

    Raises `ComputationError` when a tensor's computation failed, and the device's pending
    execution error (once) when another execution on a touched device failed.
    """
    sync_multi(tensors)
    pending = {id(f): f for t in tensors if (f := t._v[0].data.future) is not None}
    if len(pending) > 1:  # several executions (often on several devices): wait for all at once
        mw = MultiWait(len(pending))
        for f in pending.values():
            f.add_done_callback(lambda _f: mw.done())
        mw.wait()
    out = []
    for t in tensors:
        data = t._v[0].data
        try:
            value = data.get()
        except ComputationError as e:
            t._ctx.discard_error(e.__cause__)
            raise
        out.append(t._ctx.backend.to_torch(value))
    for ctx in {t._ctx.index: t._ctx for t in tensors}.values():
        ctx.check_error()
    return out


def mark_step(ctxs: Sequence[DeviceContext], wait: bool = False) -> list[Future]:
    """Cut and schedule every live tensor's graph on each of `ctxs`."""
    label = caller_location()
    metrics.counter("MarkStep")
    futures = []
    with lock_devices(ctxs):
        for ctx in ctxs:
            f = _sync_locked(ctx, ctx.live_tensors(), label)
            if f is not None:
                futures.append(f)
    if wait:
        wait_device_ops(ctxs)
    return futures


def wait_device_ops(ctxs: Sequence[DeviceContext]) -> None:
    """Block until all work queued on `ctxs` has run; re-raise a captured error once."""
    if len(ctxs) > 1:
        mw = MultiWait(len(ctxs))
        for ctx in ctxs:
            f = ctx.last
            if f is None:
                mw.done()
            else:
                f.add_done_callback(lambda _f: mw.done())
        mw.wait()
    else:
        for ctx in ctxs:
            ctx.wait()
    for ctx in ctxs:
        ctx.check_error()
