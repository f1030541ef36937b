"""The event bus: the one way the core tells whoever listens what happened.

Design note.  The core (executor, per-op path, counters) *publishes* events; the diagnostics
(recompile explanations, the sync guard, findings, the timeline, the profiler ranges) and a few
core parts that must act on another layer's moment (the executor settling its compile queue
before counters are read, step closures draining at exit) *subscribe*.  The core never imports a
subscriber, so imports run one way: down to this module.

Cost.  An event nobody listens to costs its publisher one attribute read: hot paths are written

    if events.read_begins.on:
        events.read_begins()

and `on` is a plain bool kept equal to "has handlers".  No event is published per traced op;
most are per graph or per read, and the slow paths (an eager fallback, a host read) publish
unconditionally.

Three ways to publish, chosen by the event's meaning:

* `ev(*args)`: call every handler, in subscription order (notifications);
* `ev.wrap(fn, *args) -> fn`: pass a callable through every handler, each returning the callable
  to use instead (the timeline and the profiler wrap the jobs handed to other threads);
* `ev.waits(*args)`: an iterator over what the handlers want waited for -- each handler may
  return an iterable yielding lists of futures (a generator), and the publisher, itself a
  generator of futures (`executor/steps.py`), yields them on, so the same handler serves the
  blocking API (which blocks on each list) and the trio one (which awaits it).

Locking.  `subscribe` / `unsubscribe` replace the handler tuple under `_lock` (copy on write);
publishing reads the tuple once without a lock, so a handler added or removed concurrently is
either called for the whole publication or not at all.  Handlers run on the publisher's thread
(named on each event below) and must not block unless the event says so.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Event"]

_lock = threading.Lock()


class Event:
    """One kind of moment the core publishes; see the module note."""

    __slots__ = ("name", "doc", "handlers", "on")

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.doc = doc
        self.handlers: tuple[Callable[..., Any], ...] = ()
        self.on = False

    def __repr__(self) -> str:
        return f"<event {self.name}: {len(self.handlers)} handler(s)>"

    def subscribe(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """Add `handler` (once: subscribing it again is a no-op); returns it (a decorator)."""
        with _lock:
            if handler not in self.handlers:
                self.handlers = self.handlers + (handler,)
            self.on = True
        return handler

    def unsubscribe(self, handler: Callable[..., Any]) -> None:
        with _lock:
            self.handlers = tuple(h for h in self.handlers if h != handler)
            self.on = bool(self.handlers)

    def __call__(self, *args: Any) -> None:
        for h in self.handlers:
            h(*args)

    def wrap(self, fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        for h in self.handlers:
            fn = h(fn, *args)
        return fn

    def waits(self, *args: Any) -> Iterator[list[Any]]:
        for h in self.handlers:
            r = h(*args)
            if r is not None:
                yield from r


# -- the events ------------------------------------------------------------------------------
# Publisher, thread and locks held are part of each event's contract.

step_begins = Event("step_begins", "mark_step entered, before the cut; args (ctxs); user thread, "
                    "no lock")
step_done = Event("step_done", "mark_step cut and queued its graphs; args (ctxs); user thread, "
                  "no lock")
scheduled = Event("scheduled", "a schedule (mark_step, sync, read) returned; no args; user "
                  "thread, no lock; handlers may return futures to wait for (`waits`)")
prepare_job = Event("prepare_job", "wrap: a graph's prepare job before it goes to the compiler "
                    "thread; args (job, ctx, label, future); user thread, device lock held")
tier_up_job = Event("tier_up_job", "wrap: a background top-tier build before it goes to the "
                    "tier-up thread; args (job, ctx, label, tier); device worker, no lock")
looked_up = Event("looked_up", "a graph key was looked up in the computation cache; args (ctx, "
                  "plan, label, hit); compiler thread (a host read's hit: the reading thread)")
execution_job = Event("execution_job", "wrap: an execution's closure before it goes to the "
                      "device worker; args (fn, execution); user thread, device lock held")
values_cut = Event("values_cut", "a graph was cut: each pending value roots[i] (a (node, output) "
                   "pair) is now output 0 of data_nodes[i]; args (roots, data_nodes); user thread, "
                   "device lock held; handlers take only leaf locks")
read_begins = Event("read_begins", "a host read starts waiting; no args; user thread, no lock")
read_ends = Event("read_ends", "a host read has its data; args (tensors); user thread, no lock")
host_read = Event("host_read", "an op reads device data to the host (a Python value, an output "
                  "size); args (func, what=None); user thread, no lock")
fallback = Event("fallback", "an op runs eagerly on the host; args (op name, bound args); user "
                 "thread, no lock")
explicit_reads = Event("explicit_reads", "wrap: a step closure about to run (reads inside are "
                       "explicit); args (fn); closure thread or user thread, no lock")
counters_read = Event("counters_read", "counters or metrics are about to be read (settle queued "
                      "work, fill counters computed when read); args (name: the counter read, "
                      "'*' for all values, None for names only); any thread, no lock; may block")
counters_reset = Event("counters_reset", "`ltc.metrics.reset()`; no args; any thread, no lock")
exit_drain = Event("exit_drain", "the interpreter exits: device queues are drained, drain what "
                   "depends on them; no args; main thread; may block")
exit_stop = Event("exit_stop", "the interpreter exits: device workers are stopped, stop other "
                  "threads; no args; main thread; may block")
