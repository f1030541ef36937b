"""Preparing graphs off the caller's path: post-order, key, cache lookup, compile.

Design note.  `mark_step` must return in a small fraction of a compile, even for a graph of
thousands of nodes, so under the device lock it only swaps each synced tensor's IR for a
placeholder (work proportional to the number of tensors, not of nodes).  Everything
proportional to the graph runs here, on one FIFO compiler thread, as one *prepare* job per
execution (IR nodes are immutable, so this is safe on any thread):

1. `GraphPlan`: walk the roots in post-order, build the exact graph key and the runtime inputs;
2. look the key up in the LRU `ComputationCache` (`CachedCompile`), then among the generic
   programs of graphs that differ from it only in int constants (`generic.py`: a growing KV
   cache compiles twice, not once per length; `CachedCompile` too), or compile it
   (`UncachedCompile`, `CompileTime`; `CompileReuse` when the backend already had the very
   program for another key); a graph the backend cannot compile runs on the IR interpreter
   (`CompileFallback`, with a warning naming where it was scheduled): the step still runs.

The execution, queued on its device at once, waits for its prepare job on the device worker,
in queue order.  A host read is the exception: its caller waits for the execution anyway, so
the read's graph is walked and looked up on the caller's thread, once it has released the
device lock (`prepare(..., later=...)`), and on a hit the execution's program is ready when
the device worker reaches it -- no hand-off to the compiler thread and back, 0.3 ms of each
read of tiny Llama's token-by-token loop (1.78 -> 1.48 ms).  A miss still compiles
here (the plan already made is passed on, and looked up again: a compile of the same key
queued before it has finished by then), as does every lookup while graphs are saved or
recompiles explained (`save_graphs`, `ir_debug`).  One thread means jobs finish in
submission order and a cache entry always holds a finished program.  Reading metrics first
waits for queued prepare jobs (`flush`), so compile counters are exact whenever they are read.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
import time
import warnings
from typing import Any

from ..backend import Computation
from ..base import counters, events
from ..base.config import config
from ..ir.interpreter import Interpreter
from ..ir.lint import lint
from ..ir.node import DEVICE_DATA, Node
from . import generic, tiers
from .futures import Worker


class GraphPlan:
    """A cut graph: post-order, exact key, and the runtime inputs in graph-input order.

    The key lists every node's local key and the post-order positions of its operands: equal
    keys, equal programs (a DAG hash alone cannot tell `a + a` from `a + b`)."""

    __slots__ = ("order", "roots", "key", "inputs", "comp")

    def __init__(self, roots: list[tuple[Node, int]]) -> None:
        # `ir.node.post_order`'s walk, with each node's key part made as it is placed (its
        # operands are placed before it).  In a DAG a node met again has been placed already
        # (one on the walk's stack cannot be met below itself), so the positions are the
        # visited set.  ~0.8 -> ~0.6 us per node: every cut pays it on the compiler thread,
        # and a read waits for it.
        order: list[Node] = []
        pos: dict[int, int] = {}
        parts: list[Any] = []
        inputs: list[Any] = []
        data = DEVICE_DATA
        for root, _ in roots:
            if id(root) in pos:
                continue
            stack = [(root, iter(root.operands))]
            while stack:
                node, it = stack[-1]
                for child, _ in it:
                    if id(child) not in pos:
                        stack.append((child, iter(child.operands)))
                        break
                else:
                    stack.pop()
                    pos[id(node)] = len(order)
                    order.append(node)
                    if node.op is data:
                        parts.append(node.key)
                        inputs.append(node.data)
                    else:
                        ops = node.operands
                        n = len(ops)
                        if n == 1:     # most nodes have one or two operands: no comprehension
                            (a, i), = ops
                            where: tuple = ((pos[id(a)], i),)
                        elif n == 2:
                            (a, i), (b, j) = ops
                            where = ((pos[id(a)], i), (pos[id(b)], j))
                        else:
                            where = tuple([(pos[id(o)], i) for o, i in ops])
                        parts.append((node.key, where))
                        if node.scalars:
                            inputs.extend(node.scalars)
        self.order = order
        self.roots = roots
        self.key = (tuple(parts), tuple([(pos[id(n)], i) for n, i in roots]))
        self.inputs = inputs
        self.comp: Computation | None = None

    def input_shapes(self) -> str:
        """The distinct shapes of the device-data inputs ("64x64,64"), for per-shape compile
        counts: a loop whose last batch is smaller shows two entries, each compiled once."""
        seen: dict[tuple, None] = {}
        for n in self.order:
            if n.op is DEVICE_DATA:
                seen.setdefault(n.outputs[0].shape, None)
        text = ",".join("x".join(map(str, s)) or "scalar" for s in seen)
        return text if len(text) <= 160 else text[:157] + "..."


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
        """Empty the cache, and the generic programs behind it (`generic.py`)."""
        with self._lock:
            self._d.clear()
        generic.clear()


cache = ComputationCache(config.compile_cache_size)
worker = Worker("ltc-compiler")
_last: cf.Future | None = None   # the newest prepare job (what `flush` waits for)


def prepare(ctx: Any, roots: list[tuple[Node, int]], label: str,
            later: list | None = None) -> "cf.Future[GraphPlan]":
    """Queue the prepare job of the graph producing `roots` on `ctx` (see the module note).
    `later`: the caller will wait for the execution (a host read) and holds the device lock:
    the call that walks and looks the graph up on its thread is appended to it, to be made
    once the lock is released (it completes the future, or queues the job on a miss)."""
    global _last
    fut: cf.Future = cf.Future()
    if later is not None and not (config.ir_debug or config.save_graphs):   # (the full path)
        later.append(lambda: _prepare_here(ctx, roots, label, fut))
        return fut
    _last = fut
    job = lambda: _prepare(ctx, roots, label)
    if events.prepare_job.on:   # the timeline, the profiler, recompile explanations
        job = events.prepare_job.wrap(job, ctx, label, fut)
    return worker.submit(job, fut)


def _prepare_here(ctx: Any, roots: list[tuple[Node, int]], label: str, fut: cf.Future) -> None:
    """A host read's graph, on the reading thread: a cache hit completes `fut` here; a miss
    goes to the compiler thread with the plan made."""
    global _last
    try:
        plan = GraphPlan(roots)
        if _cached(ctx, plan, label, hit_only=True) is not None:
            fut.set_result(plan)
            return
    except BaseException as e:  # noqa: BLE001 - the execution waiting for it reports it
        fut.set_exception(e)
        return
    _last = fut
    job = lambda: _prepare(ctx, roots, label, plan)
    if events.prepare_job.on:
        job = events.prepare_job.wrap(job, ctx, label, fut)
    worker.submit(job, fut)


def flush() -> None:
    """Wait until every queued prepare job has finished (not on the compiler thread itself)."""
    f = _last
    if f is not None and not f.done() and not worker.on_worker:
        cf.wait([f])


def _prepare(ctx: Any, roots: list[tuple[Node, int]], label: str,
             plan: GraphPlan | None = None) -> GraphPlan:
    if config.ir_debug:
        lint(roots)
    plan = plan or GraphPlan(roots)
    device_key = str(ctx.backend_device)
    key = (device_key, plan.key)
    comp = _cached(ctx, plan, label)
    if comp is None:
        comp, request, worth_building = generic.lookup(device_key, plan) \
            if ctx.backend.lifts_ints and tiers.only_tier(ctx) is None else (None, None, True)
        if comp is not None:   # a generic program of this graph's skeleton: no compile
            counters.counter("CachedCompile")
            # tiered with that program, for all its graphs; one compiled while tiering was off
            # (or that its tier refused) is tiered per exact graph, as below
            if worth_building and not (type(comp) is generic.Bound and type(comp.program) is tiers.Tiered):
                comp = tiers.wrap(ctx, plan, comp, label)
        else:
            counters.counter(counters.COMPILE_SHAPES_PREFIX + plan.input_shapes())
            comp, ok = _compile(ctx, plan, label, request.lifted if request else [])
            if request is not None and ok:
                # the skeleton's program: tiered once for every graph it serves, built with
                # symbolic sizes if their ints or shapes vary (`tiers.py`)
                comp = request.finish(tiers.wrap(ctx, plan, comp, label, request.lifted, generic=True), ok)
            else:
                if request is not None:   # the backend would not lift: this skeleton compiles exactly
                    comp = request.finish(comp, ok)
                if worth_building:   # not one of many shapes of such a skeleton (`generic.py`)
                    comp = tiers.wrap(ctx, plan, comp, label)   # built on a better tier once hot
        cache.put(key, comp)
        plan.comp = comp
    return plan


def _cached(ctx: Any, plan: GraphPlan, label: str, hit_only: bool = False) -> Computation | None:
    """The cached program of `plan`'s graph, set on the plan (a hit is counted), or None.  The
    lookup is reported to `events.looked_up`'s subscribers (findings, recompile explanations,
    `ltc.debug.save_graphs`); `hit_only`: a miss is not reported here (the compiler thread's
    `_prepare` looks the plan up again and reports it)."""
    comp = cache.get((str(ctx.backend_device), plan.key))
    if events.looked_up.on and (comp is not None or not hit_only):
        events.looked_up(ctx, plan, label, comp is not None)
    if comp is not None:
        counters.counter("CachedCompile")
        plan.comp = comp
    return comp


def _compile(ctx: Any, plan: GraphPlan, label: str,
             lifted: list[generic.Position]) -> tuple[Computation, bool]:
    """Compile `plan` (with `lifted` ints as inputs); also say whether the result is a backend
    program that took them (False: compiled without lifting, or the interpreter fallback)."""
    t0 = time.perf_counter()
    ok = True
    try:
        only = tiers.only_tier(ctx)
        try:
            if only is not None:      # LTC_ASYNC_TIERS names one top tier: compile with it now
                ok = False
                comp = tiers.compile_only(ctx, plan, only)
            else:
                comp = ctx.backend.compile(plan.order, plan.roots, ctx.backend_device, lifted=lifted) \
                    if lifted else ctx.backend.compile(plan.order, plan.roots, ctx.backend_device)
        except Exception:  # noqa: BLE001 - an op that needs its int constant: compile exactly
            if not lifted or only is not None:
                raise
            ok = False
            comp = ctx.backend.compile(plan.order, plan.roots, ctx.backend_device)
        # a new graph key, but the backend had this very program compiled already
        counters.counter("CompileReuse" if comp.reused_program else "UncachedCompile")
    except Exception as e:  # noqa: BLE001 - the step must still run: interpret it eagerly
        counters.counter("UncachedCompile")
        counters.counter("CompileFallback")
        warnings.warn(f"ltc_async: {ctx.backend.name} could not compile the graph scheduled at "
                      f"{label} ({type(e).__name__}: {e}); running it with the IR interpreter")
        comp = Interpreter(plan.order, plan.roots, ctx.backend_device)
        ok = False
    counters.add_sample("CompileTime", time.perf_counter() - t0)
    return comp, ok


events.counters_read.subscribe(lambda _name: flush())   # compile counters exact after mark_step
events.exit_stop.subscribe(worker.stop)
