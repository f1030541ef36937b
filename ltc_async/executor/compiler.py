"""Compiling graphs off the caller's path (LTC's `ComputationCache` + compile step).

Design note.  `mark_step` must return in a small fraction of a compile, so it never compiles:
under the device lock it only looks the graph key up.  The LRU `ComputationCache` maps a key
to a *future* of the compiled `Computation`:

* hit (compiled, or still compiling for an earlier step): `CachedCompile`, share that future;
* miss: queue the compile on the compiler thread and cache its future at once, so a second
  step with the same graph never compiles twice.

The execution that needs the program is queued on its device right away and waits for the
future on the device worker, in queue order.  A graph the backend cannot compile runs on the
IR interpreter instead (`CompileFallback`, with a warning naming where it was scheduled): the
step still runs, and the device is never poisoned.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
import time
import warnings
from typing import Any

from .. import metrics
from .._config import config
from ..backend import Computation
from .futures import Worker
from .interpreter import Interpreter


class ComputationCache:
    """LRU map graph key -> compiled `Computation` (or a future of one)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._d: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            c = self._d.get(key)
            if c is not None:
                self._d.move_to_end(key)
            return c

    def put(self, key: Any, comp: Any) -> None:
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
worker = Worker("ltc-compiler")


def computation_for(ctx: Any, plan: Any, label: str) -> "cf.Future[Computation]":
    """The (future) compiled program of `plan` on `ctx`'s backend device; compiles on a miss."""
    key = (str(ctx.backend_device), plan.key)
    fut = cache.get(key)
    if fut is not None:
        metrics.counter("CachedCompile")
        return fut
    # Counted here, on the caller's thread, so the counter is exact when `mark_step` returns;
    # the compiler thread turns it into `CompileReuse` if the backend reuses a program.
    metrics.counter_exact("UncachedCompile")
    metrics.counter(metrics.COMPILE_SHAPES_PREFIX + plan.input_shapes())
    fut = cf.Future()
    cache.put(key, fut)
    order, roots = plan.order, plan.roots
    worker.submit(lambda: _compile(ctx, order, roots, label), fut)
    return fut


def _compile(ctx: Any, order: list, roots: list, label: str) -> Computation:
    """Compiler thread: lower and compile, or fall back to the interpreter."""
    t0 = time.perf_counter()
    try:
        comp = ctx.backend.compile(order, roots, ctx.backend_device)
        if comp.reused_program:  # a new graph key, but the backend had this program already
            metrics.counter_exact("UncachedCompile", -1)
            metrics.counter_exact("CompileReuse")
    except Exception as e:  # noqa: BLE001 - the step must still run: interpret it eagerly
        metrics.counter("CompileFallback")
        warnings.warn(f"ltc_async: {ctx.backend.name} could not compile the graph scheduled at "
                      f"{label} ({type(e).__name__}: {e}); running it with the IR interpreter")
        comp = Interpreter(order, roots, ctx.backend_device)
    metrics.add_sample("CompileTime", time.perf_counter() - t0)
    return comp
