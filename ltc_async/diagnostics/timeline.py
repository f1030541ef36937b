"""`ltc.debug.timeline`: where a step's time goes, per device, as spans.

Design note.  A lazy step is spread over threads: the user's thread traces and cuts it, the
compiler thread prepares it (post-order, key, cache lookup or compile), the device worker runs
it after the executions queued before it.  Five kinds of span cover that, each tagged with its
device and step (the number of `mark_step`s on that device since the timeline opened):

* `trace` (lane "host"): the user's thread from its previous ltc event on that device (a cut,
  a read, the timeline's start) up to this cut (or the `mark_step` call that made it):
  tracing, plus whatever else the host did;
* `compile` (lane "compile"): the prepare job on the compiler thread (`args["cache"]` says
  "hit" or "miss": a hit costs the key only);
* `queue` (lane "queue"): from the cut until the device starts executing the graph (waiting
  behind earlier executions, for the compile, for inputs from other devices); on lane "host",
  a `mark_step` from its call to its cut: waiting for a free slot when the device queue is
  full (the device is `LTC_ASYNC_MAX_INFLIGHT` executions behind);
* `execute` (lane "device"): the program running on the device worker;
* `transfer`: a copy between lazy devices (lane "device", on the target's worker) or a host
  read (lane "host": `.cpu()`, `.item()`, ...: waiting for the data and copying it).

The executor publishes events (`base/events.py`); this module subscribes.  Always: the
`prepare_job` and `execution_job` wrappers (`compile_job`, `execution_job`), which wrap the
closures handed to the compiler thread and to the device worker at the cut only while a
timeline is open or the PyTorch profiler runs (one call per graph otherwise).  While a
timeline is open: `looked_up`, `read_begins` / `read_ends` (bracketing host reads),
`step_begins` / `step_done` (bracketing `mark_step`s, numbering the steps).  The
same wrappers open `torch.profiler.record_function` ranges ("ltc::compile", "ltc::execute",
"ltc::transfer") when the PyTorch profiler is on, so profiler traces show ltc_async's work
(PyTorch records other threads' ranges when asked to:
`experimental_config=torch._C._profiler._ExperimentalConfig(profile_all_threads=True)`).

`summary()` gives one line per step and device: host trace, compile, queue, execute and
transfer time, the step's wall time and how busy the device was during it; `save()` /
`chrome_trace()` write Chrome's trace event format (Perfetto, chrome://tracing): one process
per device, one thread per lane, queue waits as async slices (they overlap).

Threads: spans are added from every thread under `_lock` (a leaf lock; also guarding the open
timelines, step numbers and host marks).  Timelines are process-wide: one opened in a trio
task or a thread sees every thread's work.  On exit a timeline waits (without raising their
errors) for the executions queued inside it, so their spans are complete.
"""
from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from torch.autograd import profiler as _profiler

from ..base import events
from ..executor import arena

__all__ = ["Span", "Timeline", "timeline"]

NAMES = ("trace", "compile", "queue", "execute", "transfer")
_now = time.perf_counter


class Span(NamedTuple):
    """One span.  Times are microseconds from the timeline's start.  Fields read as attributes
    or as keys (`span.name`, `span["name"]`)."""

    name: str        # "trace", "compile", "queue", "execute", "transfer"
    device: str      # "ltc:0"
    start_us: float
    dur_us: float
    step: int        # mark_steps done on `device` since the timeline opened, at the cut
    lane: str        # "host", "compile", "queue", "device"
    args: dict

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return getattr(self, key)
        return tuple.__getitem__(self, key)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


_lock = threading.Lock()
_open: list[Timeline] = []
_steps: dict[str, int] = {}                     # device -> mark_steps seen while timelines open
_marks: dict[tuple[int, str], float] = {}       # (thread, device) -> end of its last ltc event
_tls = threading.local()   # .prep (user thread: the cut's record), .hit (compiler thread), .read_t0
# when this thread's (trio task's) mark_step began: a context variable, so that trio tasks
# sharing the thread, each awaiting a slot in its own mark_step_async, keep theirs apart
_step_t0: contextvars.ContextVar[float | None] = contextvars.ContextVar("ltc_step_t0", default=None)


class _Prep:
    """What the cut knows about its graph, handed from `compile_job` to `execution_job`."""

    __slots__ = ("done", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.done = 0.0       # when the prepare job finished (compiler thread)


def _emit(name: str, device: str, t0: float | None, t1: float, lane: str, step: int,
          args: dict) -> None:
    with _lock:
        for tl in _open:
            tl._add(name, device, t0, t1, lane, step, args)


def _profiling() -> bool:
    return _profiler._is_profiler_enabled


# -- event handlers (see the module note) ----------------------------------------------------

@events.prepare_job.subscribe
def _wrap_prepare(job: Callable[[], Any], ctx: Any, label: str, _fut: Any) -> Callable[[], Any]:
    return compile_job(job, ctx, label) if _open or _profiling() else job


@events.tier_up_job.subscribe
def _wrap_tier_up(job: Callable[[], Any], ctx: Any, label: str, tier: str) -> Callable[[], Any]:
    """A background top-tier build, as a "compile" span in the "tier-up" lane."""
    if not _open:
        return job
    device = str(ctx.device)

    def run() -> Any:
        t0 = _now()
        try:
            return job()
        finally:
            _emit("compile", device, t0, _now(), "tier-up", _steps.get(device, 0),
                  {"label": label, "tier": tier, "background": True})
    return run


@events.execution_job.subscribe
def _wrap_execution(fn: Callable[[Any], Any], ex: Any) -> Callable[[Any], Any]:
    return execution_job(fn, ex) if _open or _profiling() else fn


def _looked_up(_ctx: Any, _plan: Any, _label: str, hit: bool) -> None:
    looked_up(hit)


def _listen(flag: bool) -> None:
    """Subscribe the handlers needed only while a timeline is open (or unsubscribe them)."""
    for event, handler in ((events.looked_up, _looked_up), (events.read_begins, read_begins),
                           (events.read_ends, read_ends), (events.step_begins, step_begins),
                           (events.step_done, step_done)):
        (event.subscribe if flag else event.unsubscribe)(handler)


def compile_job(job: Callable[[], Any], ctx: Any, label: str) -> Callable[[], Any]:
    """At the cut (user thread, device lock held): the host span up to here, and the prepare
    job wrapped to time it on the compiler thread."""
    device = str(ctx.device)
    now = _now()
    recording = bool(_open)
    begun = _step_t0.get()                    # this thread's (task's) mark_step began then
    with _lock:
        prep = _Prep(_steps.get(device, 0))
        if recording:
            key = (threading.get_ident(), device)
            start = _marks.get(key)
            _marks[key] = now
            thread = threading.current_thread().name
            end = now if begun is None else begun
            for tl in _open:
                tl._add("trace", device, start if start is None else min(start, end), end,
                        "host", prep.step, {"label": label, "thread": thread})
                if begun is not None:  # mark_step before its cut: waiting for a queue slot
                    tl._add("queue", device, begun, now, "host", prep.step,
                            {"label": label, "thread": thread,
                             "what": "mark_step: a free slot in the device queue, then the cut"})
    _tls.prep = prep
    profiling = _profiling()

    def run() -> Any:
        t0 = _now()
        _tls.hit = None
        try:
            if profiling:
                with _profiler.record_function("ltc::compile", label):
                    return job()
            return job()
        finally:
            t1 = prep.done = _now()
            if recording:
                hit = getattr(_tls, "hit", None)
                _emit("compile", device, t0, t1, "compile", prep.step,
                      {"label": label, "cache": "?" if hit is None else ("hit" if hit else "miss")})
    return run


def looked_up(hit: bool) -> None:
    """Compiler thread: whether the job being timed found its key in the cache."""
    _tls.hit = hit


def execution_job(fn: Callable[[Any], Any], ex: Any) -> Callable[[Any], Any]:
    """At submit (user thread): wrap the device worker's closure to time its queue wait and its
    execution (or transfer)."""
    ctx = ex.ctx
    device = str(ctx.device)
    prep = getattr(_tls, "prep", None)
    _tls.prep = None
    transfer = ex.label.startswith("transfer ")
    name = "transfer" if transfer else "execute"
    if transfer:
        prep = None   # a transfer has no prepare job: the record belongs to no one now
    with _lock:
        step = prep.step if prep is not None else _steps.get(device, 0)
    recording = bool(_open)
    profiling = _profiling()
    t_submit = _now()

    def run(e: Any) -> Any:
        t0 = _now()
        failed = True
        try:
            if profiling:
                with _profiler.record_function(f"ltc::{name}", f"{device} {ex.label}"):
                    out = fn(e)
            else:
                out = fn(e)
            failed = False
            return out
        finally:
            if recording:
                t1 = _now()
                start = max(t0, prep.done) if prep is not None and prep.done else t0
                args = {"label": ex.label, "seq": ex.seq}
                _emit("queue", device, t_submit, start, "queue", step, args)
                if failed or ex.failure is not None:
                    args = dict(args, failed=True)
                _emit(name, device, start, t1, "device", step, args)
    return run


def read_begins() -> None:
    """A host read is about to wait for its data (user thread)."""
    _tls.read_t0 = _now()


def read_ends(tensors: Any) -> None:
    """The host read that `read_begins` opened has its data (user thread)."""
    t0 = getattr(_tls, "read_t0", None)
    _tls.read_t0 = None
    if t0 is None or not _open:
        return
    t1 = _now()
    devices = sorted({str(t._ctx.device) for t in tensors})
    ident = threading.get_ident()
    with _lock:
        for device in devices:
            _marks[(ident, device)] = t1
        for device in devices[:1]:
            for tl in _open:
                tl._add("transfer", device, t0, t1, "host", _steps.get(device, 0),
                        {"to": "host", "tensors": len(tensors),
                         "thread": threading.current_thread().name})


def step_begins() -> None:
    """This thread enters `mark_step` (what follows, until the cut, is waiting for a slot)."""
    if _open:
        _step_t0.set(_now())


def step_done(ctxs: Any) -> None:
    """A `mark_step` over `ctxs` has cut its graphs (user thread)."""
    _step_t0.set(None)
    with _lock:
        for c in ctxs:
            d = str(c.device)
            _steps[d] = _steps.get(d, 0) + 1


def any_open() -> bool:
    return bool(_open)


# -- the timeline --------------------------------------------------------------------------

class Timeline:
    """Spans recorded while open (see the module docstring); `events` lists them."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.events: list[Span] = []
        self._t0 = 0.0
        self._base: dict[str, int] = {}
        self._closed = False

    # called under _lock
    def _add(self, name: str, device: str, t0: float | None, t1: float, lane: str, step: int,
             args: dict) -> None:
        start = self._t0 if t0 is None or t0 < self._t0 else t0
        if t1 < start:
            return
        self.events.append(Span(name, device, (start - self._t0) * 1e6, (t1 - start) * 1e6,
                                max(0, step - self._base.get(device, 0)), lane, args))

    def __enter__(self) -> Timeline:
        with _lock:
            self._t0 = _now()
            self._base = dict(_steps)
            _open.append(self)
            _listen(True)    # under _lock: a timeline closing meanwhile cannot unsubscribe
        return self

    def __exit__(self, *exc: object) -> None:
        for ctx in arena.started():
            ctx.wait()          # the executions queued inside: their spans end (no errors raised)
        with _lock:
            _open.remove(self)
            if not _open:
                _marks.clear()
            self.events.sort(key=lambda s: s.start_us)
            self._closed = True
            if not _open:
                _listen(False)
        if self.path is not None:
            self.save(self.path)

    # -- output ---------------------------------------------------------------------------
    def chrome_trace(self) -> dict:
        """The spans in Chrome's trace event format (a dict; `save` writes it as JSON)."""
        with _lock:
            events = list(self.events)
        devices = sorted({s.device for s in events}, key=_device_order)
        pid = {d: i + 1 for i, d in enumerate(devices)}
        lanes = {"host": 1, "compile": 2, "queue": 3, "device": 4}
        lane_names = {"host": "host (trace, reads)", "compile": "compiler thread",
                      "queue": "queue (waiting to run)", "device": "device (execute, transfer)"}
        out: list[dict] = []
        for d in devices:
            out.append({"ph": "M", "name": "process_name", "pid": pid[d], "args": {"name": d}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid[d],
                        "args": {"sort_index": pid[d]}})
            for lane, tid in lanes.items():
                out.append({"ph": "M", "name": "thread_name", "pid": pid[d], "tid": tid,
                            "args": {"name": lane_names[lane]}})
        for k, s in enumerate(events):
            args = dict(s.args, step=s.step)
            base = {"name": s.name, "cat": "ltc", "pid": pid[s.device], "tid": lanes[s.lane],
                    "args": args}
            if s.lane == "queue":   # queue waits overlap: async slices, one per execution
                ident = f"{s.device}/{s.args.get('seq', k)}"
                out.append(dict(base, ph="b", id=ident, ts=s.start_us))
                out.append({"name": s.name, "cat": "ltc", "pid": pid[s.device], "tid": lanes[s.lane],
                            "ph": "e", "id": ident, "ts": s.end_us})
            else:
                out.append(dict(base, ph="X", ts=s.start_us, dur=s.dur_us))
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"producer": "ltc_async.debug.timeline"}}

    def save(self, path: str) -> None:
        """Write the Chrome trace event JSON file (open it in https://ui.perfetto.dev or
        chrome://tracing)."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)

    def steps(self) -> list[dict]:
        """Per (step, device): seconds of trace, compile, queue, execute and transfer, the
        step's wall time on the host and the fraction of it the device was busy."""
        with _lock:
            events = list(self.events)
        rows: dict[tuple[int, str], dict] = {}
        for s in events:
            r = rows.get((s.step, s.device))
            if r is None:
                r = rows[(s.step, s.device)] = dict(step=s.step, device=s.device, start=None,
                                                    end=None, **{n: 0.0 for n in NAMES},
                                                    compiles=0, reads=0, read=0.0, blocked=0.0)
            if s.lane == "host" and s.name == "queue":
                r["blocked"] += s.dur_us / 1e6
            else:
                r[s.name] += s.dur_us / 1e6
            if s.name == "compile" and s.args.get("cache") == "miss":
                r["compiles"] += 1
            if s.lane == "host":
                if s.name == "transfer":
                    r["reads"] += 1
                    r["read"] += s.dur_us / 1e6
                r["start"] = s.start_us if r["start"] is None else min(r["start"], s.start_us)
                r["end"] = s.end_us if r["end"] is None else max(r["end"], s.end_us)
        busy: dict[str, list[tuple[float, float]]] = {}
        for s in events:
            if s.lane == "device":
                busy.setdefault(s.device, []).append((s.start_us, s.end_us))
        out = []
        for (step, device), r in sorted(rows.items(), key=lambda kv: (kv[0][0], _device_order(kv[0][1]))):
            if r["start"] is None:   # no host span (work queued before the timeline)
                continue
            wall = (r["end"] - r["start"]) / 1e6
            overlap = sum(max(0.0, min(b, r["end"]) - max(a, r["start"]))
                          for a, b in busy.get(device, ())) / 1e6
            r["wall"] = wall
            r["busy"] = overlap / wall if wall > 0 else 0.0
            del r["start"], r["end"]
            out.append(r)
        return out

    def summary(self) -> str:
        """One line per step and device, then where the time went overall."""
        rows = self.steps()
        if not rows:
            return "ltc_async timeline: no steps recorded\n"
        head = (f"{'step':>4} {'device':<7} {'wall':>9} {'trace':>9} {'compile':>9} {'queue':>9} "
                f"{'execute':>9} {'transfer':>9} {'busy':>5}  notes")
        lines = [head]
        for r in rows:
            notes = []
            if r["compiles"]:
                notes.append(f"{r['compiles']} compile(s)")
            if r["reads"]:
                notes.append(f"{r['reads']} host read(s)")
            if r["blocked"] >= 1e-3:
                notes.append(f"mark_step waited {r['blocked'] * 1e3:.1f}ms for a queue slot")
            lines.append(f"{r['step']:>4} {r['device']:<7} {_ms(r['wall'])} {_ms(r['trace'])} "
                         f"{_ms(r['compile'])} {_ms(r['queue'])} {_ms(r['execute'])} "
                         f"{_ms(r['transfer'])} {r['busy']:>5.0%}  {', '.join(notes)}")
        wall = sum(r["wall"] for r in rows)
        tot = {n: sum(r[n] for r in rows) for n in NAMES}
        busy = sum(r["busy"] * r["wall"] for r in rows) / wall if wall else 0.0
        lines.append(f"total: wall {wall * 1e3:.1f}ms over {len(rows)} step(s); host tracing "
                     f"{_pct(tot['trace'], wall)}, compiling {tot['compile'] * 1e3:.1f}ms, device "
                     f"executing {tot['execute'] * 1e3:.1f}ms (busy {busy:.0%} of the wall time), "
                     f"transfers {tot['transfer'] * 1e3:.1f}ms")
        lines.append("verdict: " + _verdict(rows))
        return "\n".join(lines) + "\n"


def _verdict(rows: list[dict]) -> str:
    """One sentence on the steady state: the steps after the first (warm-up: first compiles and
    first executions), when there are enough."""
    steady = [r for r in rows if r["step"] > 0] if len({r["step"] for r in rows}) > 2 else rows
    wall = sum(r["wall"] for r in steady)
    if wall <= 0:
        return "nothing measured"
    which = "after the first step" if steady is not rows else "over all steps"
    compile_s = sum(r["compile"] for r in steady)
    read_s = sum(r["read"] for r in steady)
    reads = sum(r["reads"] for r in steady)
    busy = sum(r["busy"] * r["wall"] for r in steady) / wall
    if compile_s > 0.5 * wall:
        return (f"compiling dominates {which} ({compile_s * 1e3:.1f}ms of {wall * 1e3:.1f}ms): "
                f"ltc.debug.explain_recompiles(True) says why graphs keep changing")
    blocked = sum(r["blocked"] for r in steady)
    if blocked > 0.25 * wall:
        return (f"the device is the bottleneck {which}: mark_step waited {blocked * 1e3:.1f}ms "
                f"({blocked / wall:.0%} of the wall time) for a slot in the device queue "
                f"(LTC_ASYNC_MAX_INFLIGHT executions ahead); device busy {busy:.0%}")
    if read_s > 0.25 * wall:
        return (f"the host waits on {reads} host read(s) {which} ({read_s * 1e3:.1f}ms, "
                f"{read_s / wall:.0%} of the wall time): read less often; ltc.sync_guard('warn') "
                f"points at implicit ones")
    if busy < 0.5:
        return (f"the device is busy {busy:.0%} of the time {which}: it waits for the host (less "
                f"Python per step, torch.compile(backend='ltc'), more work per step)")
    return f"the device is busy {busy:.0%} of the time {which}: the step is device bound"


def _ms(s: float) -> str:
    return f"{s * 1e3:>7.2f}ms"


def _pct(part: float, whole: float) -> str:
    return f"{part * 1e3:.1f}ms ({part / whole:.0%})" if whole else f"{part * 1e3:.1f}ms"


def _device_order(d: str) -> tuple:
    name, _, idx = d.partition(":")
    return (name, int(idx) if idx.isdigit() else 0)


def timeline(path: str | None = None) -> Timeline:
    """`with ltc.debug.timeline("step.json") as tl:` records spans of every thread's ltc work
    (`tl.events`: `name`, `device`, `start_us`, `dur_us`, `step`, `lane`, `args`) and on exit
    writes them to `path` (if given) as a Chrome trace event file; `tl.summary()` tells where
    each step's time went."""
    return Timeline(path)
