"""Cutting, keying and scheduling graphs (LTC's `LazyGraphExecutor`).

Design note.  Scheduling `tensors` on a set of devices (`mark_step`, `sync`, a read) is:

1. **reserve** an in-flight slot on every device that has pending IR to run, with no lock held
   (a full queue waits for its oldest execution: `schedule` is a `twin`, blocking or awaiting;
   `_try_schedule` itself never blocks);
2. under the devices' lockers (index order: LTC's `TensorCollectionBarrier`), per device: take
   the tensors that still hold pending IR and dedupe their (node, output) values; queue the
   graph's prepare job (post-order, exact key, cache lookup or compile: `compiler.py`, on the
   compiler thread) and the execution on the device; give every synced tensor a placeholder
   `BackendData` (output i of the new `Execution`) and rebind it to a DEVICE_DATA node, so the
   next trace can consume the result before it exists.  This costs time proportional to the
   number of tensors synced, not to the size of the graph, and never waits for anything;
3. the device worker waits for the prepare job (in queue order), resolves inputs (waiting only
   for other devices' data: its own queue already ran everything before it), runs the program
   and completes the execution with the outputs (or `Failed` values, see `_execute`).

The backward's own cut.  A program that reads a result on the host every step (`loss.item()`)
waits for the whole step's graph, which can only start once the step is traced: the device
idles while the host traces, the host idles while the device runs.  So when a backward pass
starts over tensors of a device whose program has, since its previous backward began, read on
the host a value computed after that moment (`DeviceContext.read_since_backward`: the loss,
a metric; not the initial weights copied to the host), the device's pending work -- the
forward, with whatever else is live -- is cut and queued first (`before_backward`, called by
the autograd engine's entry in `patches/registration.py`): the forward runs while the backward
and the optimizer step are traced, and the read waits for less.  Measured: tiny GPT-2 / BERT
training steps with the loss read every step, 30-40% shorter (`benchmarks/bench_tiers.py`).
Values read to the host before the cut stay known after it (`events.values_cut`: a mask's
count read in the forward still sizes the backward's index ops without a second read).  A program
that does not read every step keeps one graph per step: its steps already overlap each other,
and a second graph per step only adds overhead.  The decision follows program order (reads,
backward calls), not timing, so a steady loop cuts the same graphs every step (cached keys);
the cut never blocks (a full in-flight queue means the device is busy anyway: no cut).
A loop that reads every step thus compiles one graph more than one that does not (the forward,
and the backward with the optimizer step, where the latter has one); `LTC_ASYNC_CUT_AT_BACKWARD=0`
keeps one graph per step.

Errors.  Each failed execution is reported exactly once, by the first barrier that covers it,
and what a barrier covers depends only on program order: `wait_device_ops` covers everything
queued on its devices before it; a read or sync covers, per device, the executions queued up to
the newest producer of a tensor it reads (a read of a tensor whose own computation failed
raises `ComputationError` and so reports that execution).  `mark_step` only schedules.  An
execution whose input had failed fails too and says so (`ExecutionError.upstream`).
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from ..base import counters, events
from ..base.callsite import caller_location
from ..base.config import config
from ..ir.interpreter import Interpreter
from ..ir.node import DEVICE_DATA, Node, TensorMeta, make_data_node
from . import compiler, read_here, tiers
from .compiler import ComputationCache, GraphPlan, cache  # noqa: F401 - re-exported
from .device import DeviceContext, lock_devices, raise_errors
from .futures import (
    BackendData,
    ComputationError,
    Execution,
    Failed,
    Steps,
    run,
    twin,
)


def _roots_of(tensors: Sequence[Any]) -> tuple[list[tuple[Node, int]], list[Any], list[int]]:
    """Unique pending (node, output) values of `tensors`, and which root each tensor maps to."""
    roots: list[tuple[Node, int]] = []
    index: dict[tuple[int, int], int] = {}
    pending: list[Any] = []
    which: list[int] = []
    for t in tensors:
        v = t._v
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


def _has_pending(tensors: Sequence[Any]) -> bool:
    return any(not t._v[0].is_data for t in tensors)


# -- scheduling ---------------------------------------------------------------------------

class _Full:
    """`_try_schedule`'s answer when device `ctx` has no free in-flight slot."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: DeviceContext) -> None:
        self.ctx = ctx


def _try_schedule(groups: dict[DeviceContext, Any], label: str,
                  inline: bool = False) -> list[Execution] | _Full:
    """Never blocks.  `groups` maps each device to the tensors to sync there (or None: all its
    live tensors).  Reserves a slot on each device with pending work, then cuts and queues
    under the lockers; returns the executions, or `_Full(ctx)` (nothing scheduled) when a
    device's queue is full."""
    ctxs = sorted(groups, key=lambda c: c.index)
    held: list[DeviceContext] = []
    for ctx in ctxs:
        tensors = groups[ctx]
        if not (ctx.has_pending() if tensors is None else _has_pending(tensors)):
            continue
        if not ctx.try_acquire_slot():
            for h in held:
                h.release_slot()
            return _Full(ctx)
        held.append(ctx)
    executions: list[Execution] = []
    later: list | None = [] if inline else None   # lookups made once the locks are released
    try:
        with lock_devices(ctxs):
            for ctx in ctxs:
                tensors = groups[ctx]
                has_slot = ctx in held
                ex = _cut_and_queue(ctx, ctx.live_tensors() if tensors is None else tensors,
                                    label, has_slot, later)
                if ex is not None:
                    executions.append(ex)
                    if has_slot:
                        held.remove(ctx)
    finally:
        for h in held:  # reserved, but another thread had synced the tensors meanwhile
            h.release_slot()
        for finish in later or ():   # each completes its execution's prepare future
            finish()
    return executions


@twin
def schedule(groups: dict[DeviceContext, Any], label: str | None = None, inline: bool = False) -> Steps:
    """Cut and queue, waiting while a device's queue is full (for its oldest execution); see
    `_try_schedule`.  Then the `scheduled` event's subscribers may wait too (recompile
    explanations: for the prepare jobs, to warn at the caller's line).  `inline`: the caller
    will wait for these executions (a host read): each graph is looked up on this thread,
    after the device locks are released (`compiler.prepare`)."""
    label = label or caller_location()
    for ctx in groups:        # the top tier's one-time imports on this thread, before any lock
        tiers.set_up_here(ctx)
    while True:
        r = _try_schedule(groups, label, inline)
        if type(r) is not _Full:
            if events.scheduled.on:
                yield from events.scheduled.waits()
            return r
        oldest = r.ctx.oldest()
        # no oldest: slots reserved by another thread that is about to queue; look again soon
        yield [oldest] if oldest is not None else []


def _wait_for_slot(ctx: DeviceContext) -> None:
    oldest = ctx.oldest()
    if oldest is not None:
        oldest.wait()
    else:  # slots reserved by another thread that is about to queue: take one when free
        ctx.acquire_slot()
        ctx.release_slot()


def _cut_and_queue(ctx: DeviceContext, tensors: Sequence[Any], label: str,
                   has_slot: bool, later: list | None = None) -> Execution | None:
    """Under `ctx.lock`: one graph of the pending IR of `tensors`, queued on `ctx`."""
    t0 = time.perf_counter()
    roots, pending, which = _roots_of(tensors)
    if not roots:
        return None
    # Tensors that became pending after the slot check (another thread traced into them) are
    # queued without a slot rather than blocking under the lock: the bound is exceeded by one.
    has_slot = has_slot or ctx.try_acquire_slot()
    prepared = compiler.prepare(ctx, roots, label, later)
    ex = ctx.submit(lambda e: _execute(ctx, prepared, e), label, slot=has_slot)
    datas = [BackendData(ctx, n.outputs[i], future=ex, index=j) for j, (n, i) in enumerate(roots)]
    dnodes = [make_data_node(d, d.meta) for d in datas]
    if events.values_cut.on:   # values read to the host before the cut stay known
        events.values_cut(roots, dnodes)
    for t, r in zip(pending, which):
        t._v = (dnodes[r], 0)     # we hold ctx.lock: this is `rebind`, inlined for the hot path
        ctx.unregister(t)
    counters.counter("SyncTensorsGraphCount")
    counters.add_sample("SyncTensorsGraph", time.perf_counter() - t0)
    return ex


def _execute(ctx: DeviceContext, prepared: Any, ex: Execution) -> list[Any]:
    """Device worker: wait for the prepared program (`compiler.prepare`), resolve inputs, run.

    If the program raises, or an input had failed, the graph runs again on the IR interpreter
    node by node (`execute_salvaging`): only the outputs that depend on the failing op or the
    failed input become `Failed`; every other output (an optimizer update beside a bad
    gather) gets its value, as eager would have computed it.  `ex.failure` then tells the
    device to record this execution's error for the next barrier."""
    plan = prepared.result()
    values = [x.resolve() if type(x) is BackendData else x for x in plan.inputs]
    upstream = next((v for v in values if type(v) is Failed), None)
    if upstream is None:
        comp = plan.comp
        t0 = time.perf_counter()
        try:
            outs = comp.execute(values)
        except Exception:  # noqa: BLE001 - salvaged below, the failing op reported
            if not config.salvage:
                raise
            counters.counter("ExecutionSalvaged")
        else:
            ex.set_marker(ctx.backend, ctx.backend_device)
            counters.add_sample("ExecuteTime", time.perf_counter() - t0)
            counters.counter("ExecutedIrNodes", len(plan.order))
            return outs
    elif not config.salvage:   # LTC semantics: the whole graph fails with its input
        ex.failure = upstream
        return [upstream] * len(plan.roots)
    outs = Interpreter(plan.order, plan.roots, ctx.backend_device).execute_salvaging(values)
    own = None
    for v in outs:
        if type(v) is Failed and v.ctx is None:   # failed here, not upstream
            v.ctx, v.label = ctx, ex.label
            own = own or v
    failed = own or next((v for v in outs if type(v) is Failed), None)
    if failed is not None:
        ex.failure = failed
    ex.set_marker(ctx.backend, ctx.backend_device)
    return outs


def schedule_transfer(src: BackendData, dst: DeviceContext, meta: TensorMeta) -> BackendData:
    """Copy `src` to `dst` on `dst`'s queue, after `src`'s producer finished: an execution like
    any other (an in-flight slot, errors recorded and re-raised at the next barrier)."""
    label = f"transfer {src.device} -> {dst.device} at {caller_location()}"
    while not dst.try_acquire_slot():
        _wait_for_slot(dst)

    def run(ex: Execution) -> list[Any]:
        value = src.resolve()
        if type(value) is Failed:   # the source failed: so does its copy, saying why
            ex.failure = value
            return [value]
        return [dst.backend.upload(src.device.backend.to_torch(value), dst.backend_device)]
    ex = dst.submit(run, label, slot=True)
    return BackendData(dst, meta, future=ex, index=0)


# -- syncing and reading --------------------------------------------------------------------

def _groups(tensors: Sequence[Any]) -> dict[DeviceContext, list[Any]]:
    groups: dict[DeviceContext, list[Any]] = {}
    for t in tensors:
        groups.setdefault(t._ctx, []).append(t)
    return groups


def sync_tensors(ctx: DeviceContext, tensors: Sequence[Any], label: str | None = None) -> Execution | None:
    """Schedule the pending IR of `tensors` (all on `ctx`) as one graph; return its execution."""
    ex = schedule({ctx: list(tensors)}, label)
    return ex[0] if ex else None


def sync_multi(tensors: Sequence[Any], label: str | None = None) -> list[Execution]:
    """Schedule the pending IR of tensors on any devices: one graph per device, all cut under
    one barrier across their lockers, so a concurrent `mark_step` sees none or all of them."""
    groups = _groups(tensors)
    return schedule(groups, label) if groups else []


def data_of(t: Any) -> BackendData:
    """The BackendData of a lazy tensor, scheduling its device's live graph first if needed
    (see `read`)."""
    if not t._v[0].is_data:
        schedule({t._ctx: None})
    return t._v[0].data


def needed(tensors: Sequence[Any]) -> list[Execution]:
    """The executions that reading `tensors` (already scheduled) waits for."""
    found: dict[int, Execution] = {}
    for t in tensors:
        f = t._v[0].data.future
        if f is not None:
            found[id(f)] = f
    if events.read_begins.on:   # the timeline
        events.read_begins()
    return list(found.values())


def coverage(tensors: Sequence[Any]) -> list[tuple[DeviceContext, int]]:
    """What a read of `tensors` reports: per device, the failed executions queued up to the
    newest producer of a read tensor (a function of program order, not of timing)."""
    upto: dict[DeviceContext, int] = {}
    for t in tensors:
        seq = t._v[0].data.seq
        if seq > upto.get(t._ctx, 0):
            upto[t._ctx] = seq
    return list(upto.items())


def collect(tensors: Sequence[Any]) -> list[Any]:
    """Backend `torch.Tensor`s of scheduled, finished lazy tensors.  Raises `ComputationError`
    for the first tensor whose computation failed (that execution's failure is then reported),
    else the pending errors the read covers."""
    out = []
    for t in tensors:
        data = t._v[0].data
        try:
            value = data.get()
        except ComputationError:
            t._ctx.discard_error(data.seq)
            raise
        out.append(t._ctx.backend.to_torch(value))
    if events.read_ends.on:   # the timeline
        events.read_ends(tensors)
    raise_errors(coverage(tensors))
    return out


@twin
def materialize(tensors: Sequence[Any], inline: bool = False) -> Steps:
    """Backend `torch.Tensor`s of lazy tensors, waiting only for the executions they need.
    Schedules exactly these tensors' pending IR (`ltc.sync`).  `inline`: a blocking caller's
    small read (a data-dependent size): the graphs are looked up on this thread (never from a
    trio task: that would hold up its event loop for the walk)."""
    groups = _groups(tensors)
    if groups:
        yield from schedule.steps(groups, inline=inline)
    yield needed(tensors)
    return collect(tensors)


def read_size(tensors: Sequence[Any]) -> list[Any]:
    """`materialize(tensors, inline=True)` for a blocking data-dependent size read: the graph
    may run on this thread (`read_here.py`)."""
    with read_here.reading():
        return run(materialize.steps(tensors, inline=True), read_here.run_or_wait)


def read(tensors: Sequence[Any]) -> list[Any]:
    """A host read (`.item()`, `.cpu()`, `print`, an eager fallback's inputs, a transfer).

    Unlike `materialize`, it schedules *every live tensor* of the devices read, as `mark_step`
    does, and waits only for what the read needs.  A read of one tensor would otherwise leave
    the live tensors that share its graph pending, and their shared part would run again at
    the next cut: a `generate()` loop reading each new token re-ran all earlier tokens' work
    (the KV cache stayed pending), and an eager fallback mid-forward re-ran the forward.  The
    graph this cuts depends on the live tensors, which a loop repeats, so it is cached."""
    # only devices where a read tensor is still pending: reading device data (an older value,
    # from a closure or another thread) must not cut another thread's half-traced step
    groups = {t._ctx: None for t in tensors if not t._v[0].is_data}
    with read_here.reading():
        if groups:
            schedule(groups, inline=True)
        for t in tensors:   # a value of this step read on the host: see `before_backward`
            ctx = t._ctx
            if ctx.backward_seq is not None and t._v[0].data.seq > ctx.backward_seq:
                ctx.read_since_backward = True
        read_here.run_or_wait(needed(tensors))
    return collect(tensors)


def before_backward(ctxs: Sequence[DeviceContext]) -> None:
    """A backward pass starts over tensors of `ctxs`: cut and queue the pending work of each
    device whose program read from the host since its last backward (see "The backward's own
    cut" in the module note).  Never blocks."""
    if not config.cut_at_backward:
        return
    groups: dict[DeviceContext, Any] = {}
    for ctx in ctxs:
        if ctx.read_since_backward:
            ctx.read_since_backward = False
            groups[ctx] = None
        ctx.backward_seq = ctx.last.seq if ctx.last is not None else 0   # before this cut
    if groups:
        _try_schedule(groups, caller_location())


@twin
def mark_step(ctxs: Sequence[DeviceContext]) -> Steps:
    """Cut and schedule every live tensor's graph on each of `ctxs`."""
    counters.counter("MarkStep")
    return (yield from schedule.steps({c: None for c in ctxs}))


@twin
def wait_device_ops(ctxs: Sequence[DeviceContext]) -> Steps:
    """Wait until all work queued on `ctxs` has run (kernels included); re-raise the errors
    of those executions, once."""
    lasts = [(c, c.last) for c in ctxs]
    yield [f for _, f in lasts if f is not None]
    raise_errors([(c, f.seq if f is not None else 0) for c, f in lasts])
