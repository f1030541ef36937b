"""torch.distributed collectives on `ltc` tensors, queued on the device (the per-op path of
`c10d::*_` ops; `patches/collectives.py` makes writes through views reach their base)."""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import torch

from ..base import counters
from ..base.callsite import caller_location
from ..executor import graph_executor as gx
from ..executor.futures import BackendData, Failed
from ..ir.node import make_data_node
from .lazy_tensor import LtcTensor, tensors_in

# -- queued collectives --------------------------------------------------------------------------
#
# A collective on `ltc` tensors is an execution on its device's queue, like a graph or a
# transfer: the caller cuts the device's live graph (so every input is device data or a
# placeholder), queues the collective and rebinds each written tensor to a placeholder for its
# result, then returns at once -- the host goes on tracing while the inputs compute and the
# collective runs.  The returned `Work` is complete from the host's point of view, as NCCL's
# is on CUDA: `wait()` orders nothing more, because every later use of a written tensor already
# waits for its placeholder.  A failure (a dead peer, gloo's timeout) is the execution's error:
# reading a written tensor raises it, and so does the next barrier on the device.
#
# Every process must issue its collectives in program order.  One device's queue keeps its
# own in order; collectives on *several* local devices are issued in ticket order (taken at
# the call): a job waits for the previous ticket's job to have issued its collective.  That
# wait ends: the earlier ticket's job was queued before this one, and its queue only holds work
# queued before it (the locking rules of `executor/device.py`).  A ticket whose execution is
# cancelled (shutdown) is released by the execution's done-callback.
#
# A collective on *host* tensors (a CPU metric's `all_reduce`, `dist.barrier()`, the object
# collectives) runs at once on the calling thread.  Issued while ltc collectives of the same
# process are still queued, it would reach the process group before them on one rank and after
# them on another: gloo then pairs different collectives across ranks (swapped values, a size
# mismatch that aborts, a barrier that never meets).  So a host collective first waits until
# every ltc collective queued before it has been issued and has completed (a ticket is released
# after its collective's `wait()`: `issue_queued_first`, called by torch.distributed's functions
# as `patches/collectives.py` wraps them): program order, on every rank.  (A device job issues
# its collective through the c10d op itself, not through those functions.)

_turn = threading.Condition()
_tickets = itertools.count()
_issued: set[int] = set()
_next = 0
_taken = 0


def _take_ticket() -> int:
    global _taken
    with _turn:
        _taken += 1
        return next(_tickets)


def issue_queued_first() -> None:
    """Block until every ltc collective queued so far has been issued and completed (above)."""
    if _next >= _taken:
        return
    with _turn:
        target = _taken
        while _next < target:
            _turn.wait()


def _release(ticket: int) -> None:
    global _next
    with _turn:
        if ticket < _next:      # released already (by the job, then by its done-callback)
            return
        _issued.add(ticket)
        while _next in _issued:
            _issued.discard(_next)
            _next += 1
        _turn.notify_all()


def _wait_turn(ticket: int) -> None:
    with _turn:
        while _next < ticket:
            _turn.wait()


def _lazy_in(v: Any) -> list[LtcTensor]:
    return tensors_in(v, LtcTensor)


def _has_host_tensor(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return type(v) is not LtcTensor
    if isinstance(v, (list, tuple)):
        return any(_has_host_tensor(e) for e in v)
    return False


def queue(func: Any, info: Any, args: tuple, kwargs: dict) -> Any:
    """Queue the c10d op `func` on its device (see above); NotImplemented when it cannot be
    queued (tensors on several devices or on the host): then it runs on the spot."""
    full = info.bind(args, kwargs)
    lazy = _lazy_in(full)
    ctxs = {t._ctx for t in lazy}
    if len(ctxs) != 1 or _has_host_tensor(full):
        return NotImplemented
    ctx = next(iter(ctxs))
    counters.counter("Collective")
    counters.counter("Collective::" + info.name)
    written: list[LtcTensor] = []
    seen: set[int] = set()
    for i in info.written:
        for t in _lazy_in(full[i]):
            if id(t) not in seen:
                seen.add(id(t))
                written.append(t)
    gx.schedule({ctx: None})             # every input is device data or a placeholder now
    t_host = time.perf_counter()         # (a full queue made `schedule` wait, as mark_step would)
    datas = [(t, t._v[0].data) for t in lazy]
    ticket = _take_ticket()
    backend = ctx.backend
    label = f"{info.name} at {caller_location()}"

    def run(ex: Any) -> list[Any]:
        _wait_turn(ticket)
        try:
            values: dict[int, torch.Tensor] = {}
            for t, data in datas:
                v = data.resolve()
                if type(v) is Failed:              # an input failed: so does the collective
                    ex.failure = v
                    return [v] * len(written)
                host = backend.to_torch(v)
                # written tensors get fresh memory: device data is immutable
                values[id(t)] = host.clone() if id(t) in seen else host

            def host_of(v: Any) -> Any:
                if type(v) is LtcTensor:
                    return values[id(v)]
                if isinstance(v, list):
                    return [host_of(e) for e in v]
                if isinstance(v, tuple):
                    return tuple(host_of(e) for e in v)
                return v
            hargs, hkwargs = info.split([host_of(v) for v in full])
            t0 = time.perf_counter()
            out = func(*hargs, **hkwargs)
            for o in (out if isinstance(out, tuple) else (out,)):
                if hasattr(o, "wait") and not isinstance(o, torch.Tensor):
                    o.wait()
            counters.add_sample("CollectiveTime", time.perf_counter() - t0)   # on the device queue
        finally:
            _release(ticket)
        return [backend.from_torch(values[id(t)], ctx.backend_device) for t in written]

    slot = ctx.try_acquire_slot()
    ex = ctx.submit(run, label, slot=slot)
    ex.add_done_callback(lambda _: _release(ticket))   # a cancelled job never issues
    with ctx.lock:
        for j, t in enumerate(written):
            data = BackendData(ctx, t._m, future=ex, index=j)
            ctx.rebind(t, (make_data_node(data, t._m), 0))
    counters.add_sample("CollectiveHostTime", time.perf_counter() - t_host)   # what the caller paid
    done = torch.futures.Future()
    done.set_result(None)
    work = torch._C._distributed_c10d._create_work_from_future(done).boxed()
    results = []
    for r in func._schema.returns:
        if "Work" in str(r.type):
            results.append(work)
        else:
            results.append(full[info.written[0]])
    return results[0] if len(results) == 1 else tuple(results)
