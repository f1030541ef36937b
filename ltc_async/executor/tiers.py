"""Tiered compilation: graphs start on the quick tier and move to a better one built in the
background once hot (issue 19; `LTC_ASYNC_TIERS`, `LTC_ASYNC_TIER_UP_AFTER`).

Design note.  The quick tier (the backend's `compile`: TorchScript) has a graph running within
milliseconds of its first cut; the top tier (`Backend.compile_tier`: Inductor) runs it faster
but takes seconds to build.  Every program the compiler thread puts in the computation cache
is a `Tiered` wrapper around the quick program:

* `Tiered.execute` (device worker) counts the executions whose specialization (the runtime
  scalars the top tier would bake in: `Backend.tier_specialization`; Inductor lifts an
  optimizer's changing floats to inputs instead) equals the previous execution's.  At
  `config.tier_up_after` such executions in a row it queues ONE background build (state
  `_QUEUED`): a graph that is not run again (the last smaller batch) never reaches the
  threshold (the lengths of a growing KV cache share their skeleton's program, which does,
  and is built once for all of them: below), and one whose baked scalars change every step
  (a clamp bound from a schedule) is not built for values that will not come back;
* the build runs on the tier-up thread (`worker`, niced: `_background_priority`), never on a
  tracing thread, a device worker or inside `mark_step`; it sees the graph's structure (an
  `Interpreter`, no node objects, so no device data is kept alive) and the layouts of the
  inputs, not their values;
* a skeleton's shape-generic program (`generic.py`; `wrap(..., generic=True)`) serves graphs
  of other sizes and ints: its lifted ints are not part of the specialization, and `_count`
  notes which tensor dimensions changed during the streak; the build makes those and the ints
  symbolic (`Backend.compile_tier(..., varying)`), and the program says in `accepts` which
  executions it serves (a run it refuses takes the quick program);
* when it is ready, `_top` is set (one attribute store); the next execution whose scalars it
  accepts runs it.  Nothing ever waits for a build (`ltc.debug.wait_compiles` does, on
  request).  The top tier is not always the faster (measured: BERT's compile path with rare
  reads), so the first executions after a build are a trial (`_Trial`: `config.tier_trial`
  timed runs per tier, alternating, each timed itself -- device work included -- and from
  its start to the start of the graph's next execution -- what the run costs the tracing
  threads --): a top tier that measures slower in either is dropped (`TierUpSlower`).  A
  trial decides on a few runs, on a machine whose load comes and goes (a compiler, another
  process): a top tier dropped by one is tried again after `_TRIAL_AGAIN_AFTER` more
  executions (`TierTrialAgain`), and again ten times later, then never; it is not built again.
  A build that
  fails, or a top-tier program that raises where the quick one does not, leaves the graph on
  the quick tier for good: `TierUpFailed`, one warning naming the graph (an error both tiers
  raise is the inputs' fault: it is raised, the top tier stays);
* the build traces with FX on its own thread; `patches/fx_tracing.py` keeps that from stopping
  `torch.compile`d calls on the user's threads.

`LTC_ASYNC_TIERS=inductor` (a top tier alone) compiles every graph with it, synchronously on the
compiler thread (`SingleTier`: the Inductor-only conformance run).

Counters `TierUpCompile` (builds finished), `TierUpFailed`, `TierUpRun` (executions on the top
tier), `TierUpRetried` (a build that met another thread's import of the same modules, queued
again at the graph's next execution), `TierUpSlower` (a top tier dropped by its trial),
`TierTrialAgain` (a dropped top tier's trial repeated); metrics
`TierUpTime` (build seconds) and, one sample per trial decided, `TierTrialRun` /
`TierTrialPeriod` (the top tier's shortest run / period over the quick tier's: why a trial
went the way it did, on a machine where it cannot be profiled).  At exit, queued builds are dropped and a running
one is cancelled (`_Cancelled`, raised between bytecodes: the interpreter never finalizes
under a build, and exit waits only for the compiler subprocess or C++ call in progress).

Threads: `_state`, `_streak`, `_last`, `_trial`, `_dropped`, `_again_in`, `_trials` are touched
only by the graph's device worker
(a cache entry belongs to one device), except that the tier-up thread sets `_trial` once,
before `_top`; `_top` is written once by the tier-up thread (cleared by the worker when the
tier is dropped) and read by the worker (an attribute load).  `_builds` (futures of queued
builds) is guarded by `_lock`.  `_trial_holders` (a device's running trial: one at a time)
changes by single dict operations only.
"""
from __future__ import annotations

import concurrent.futures as cf
import ctypes
import os
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Sequence

import torch

from ..backend import Computation
from ..base import counters, events
from ..base.config import config
from ..ir.interpreter import Interpreter
from ..ir.node import TensorMeta
from .futures import BackendData, Worker

_IDLE, _QUEUED, _READY, _FAILED, _SLOWER = "idle", "queued", "ready", "failed", "slower"


def _background_priority() -> None:
    """The tier-up thread runs at a lower scheduling priority (nice +10): Linux nices threads,
    and the compiler processes a build starts (g++) inherit it.  Where the user's threads keep
    the cores busy, a build takes what they leave instead of slowing them down."""
    if sys.platform.startswith("linux"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
        except OSError:   # not permitted (a sandbox): the build runs at the user's priority
            pass


worker = Worker("ltc-tier-up", init=_background_priority)
_builds: list[cf.Future] = []
_lock = threading.Lock()


def only_tier(ctx: Any) -> str | None:
    """The one tier every graph is compiled by, synchronously, when `LTC_ASYNC_TIERS` names a
    backend's top tier alone (`LTC_ASYNC_TIERS=inductor`: the Inductor-only conformance run)."""
    tiers = config.tiers
    if len(tiers) == 1 and tiers[0] in ctx.backend.tiers[1:]:
        return tiers[0]
    return None


def compile_only(ctx: Any, plan: Any, tier: str) -> Computation:
    """`plan` compiled by `tier` now (compiler thread); see `SingleTier`."""
    interp = Interpreter(plan.order, plan.roots, ctx.backend_device)
    layout = [x.meta if type(x) is BackendData else x for x in plan.inputs]
    return SingleTier(ctx, interp, tier, ctx.backend.compile_tier(tier, interp, ctx.backend_device, layout))


class SingleTier(Computation):
    """A graph compiled by one tier only.  A program that does not accept an execution's
    scalars (they were baked in) is joined by one built for them, synchronously."""

    def __init__(self, ctx: Any, interp: Interpreter, tier: str, first: Computation) -> None:
        self._ctx, self._interp, self._tier = ctx, interp, tier
        self._programs = [first]
        self.backend_text = first.backend_text

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        for p in self._programs:
            if p.accepts(inputs):
                return p.execute(inputs)
        p = self._ctx.backend.compile_tier(self._tier, self._interp, self._ctx.backend_device,
                                           _layout(inputs))
        self._programs.append(p)
        return p.execute(inputs)


def _layout(inputs: Sequence[Any]) -> list[Any]:
    """One execution's inputs with tensors as their `TensorMeta`: what a build may see."""
    return [TensorMeta(tuple(v.shape), tuple(v.stride()), v.dtype) if isinstance(v, torch.Tensor) else v
            for v in inputs]


def top_tier(ctx: Any) -> str | None:
    """The tier this device's graphs move to, or None (tiering off, or nothing above quick)."""
    tiers = [t for t in config.tiers if t in ctx.backend.tiers]
    return tiers[1] if len(tiers) > 1 and tiers[0] == ctx.backend.tiers[0] else None


_set_up: set = set()   # (backend type, device type) whose top tier was set up on a tracing thread


def set_up_here(ctx: Any) -> None:
    """Called by `graph_executor.schedule` on the thread that cuts, before it takes the device
    locks (once per backend and device type):
    ask the backend about the top tier with an empty graph, so that its one-time setup runs on
    this thread.  Inductor's is `import torch._inductor` (~0.9 s, Dynamo with it).  Made by the
    compiler thread at the first graph's lookup, it raced with the tracing thread's own first
    `import torch._dynamo` (PyTorch's reference kernels import it on first use, during shape
    inference) over the two packages' circular imports, and one of the threads failed with
    "cannot import name 'IndentedBuffer' from partially initialized module
    'torch._inductor.utils'" (2 runs in 3 of a two-device program).  One thread importing both
    first cannot race.  (A trio task's first `mark_step_async` pays the import on the event
    loop's thread, once, as its first traced ops pay their shape inference.)  `_set_up` is a
    plain set: a racing second call asks again (the answer is cached by the backend)."""
    key = (type(ctx.backend), ctx.backend_device.type)
    if key in _set_up:   # every cut asks: the set first, the tier list only once
        return
    tier = top_tier(ctx)   # (tiering may be turned on later: asked again until it is)
    if tier is not None:
        ctx.backend.tier_refuses(tier, [], ctx.backend_device)
        _set_up.add(key)


def wrap(ctx: Any, plan: Any, comp: Computation, label: str, lifted: Sequence[Any] = (),
         generic: bool = False) -> Computation:
    """`comp` (a freshly compiled quick-tier program for `plan`) as a tiered one, or unchanged
    when there is no top tier for this device or the backend will not build this graph.
    `generic`: `comp` is the program of `plan`'s skeleton (`generic.py`), taking the ints at
    `lifted` as inputs, and runs every graph of that skeleton: its build follows what varied."""
    tier = top_tier(ctx)
    if tier is None or type(comp) is Tiered:
        return comp
    if ctx.backend.tier_refuses(tier, plan.order, ctx.backend_device) is not None:
        return comp
    interp = Interpreter(plan.order, plan.roots, ctx.backend_device)
    if lifted:
        try:
            interp = interp.with_lifted_ints(plan.order, lifted)
        except ValueError:      # ints of a captured graph: not built
            return comp
    return Tiered(comp, ctx, interp, tier, label, generic)


class Tiered(Computation):
    """A graph's quick program, and its top-tier program once built (see the module note)."""

    def __init__(self, quick: Computation, ctx: Any, interp: Interpreter, tier: str, label: str,
                 generic: bool = False) -> None:
        self.quick = quick
        self.backend_text = quick.backend_text
        self.reused_program = quick.reused_program
        self._ctx = ctx
        self._interp = interp
        self._key = ctx.backend.tier_specialization(tier, interp)
        self._tier = tier
        self._label = label
        self._state = _IDLE
        self._streak = 0
        self._last: tuple | None = None
        self._top: Any = None
        self._trial: _Trial | None = None
        self._dropped: Any = None    # a top tier its trial dropped, until it is tried again
        self._again_in = 0           # executions until then
        self._trials = 0             # trials decided
        # a skeleton's program (`generic`): the tensor shapes of the first execution of the
        # streak, and the (input position, dim) pairs that differed from them since (`_count`)
        self._generic = generic
        self._shapes: list[Any] = []
        self._varying: set[tuple[int, int]] = set()

    @property
    def tier(self) -> str:
        """The tier the next execution with the same scalars runs on."""
        return self._tier if self._top is not None else "quick"

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        top = self._top
        if top is not None and top.accepts(inputs):
            trial = self._trial
            if trial is not None and not trial.holds():
                return self.quick.execute(inputs)   # another graph of the device is in its trial
            if trial is not None:
                trial.begin()      # the previous trial run's period ends here
                self._settle(trial)
                trial, top = self._trial, self._top
            if top is not None:
                if trial is not None and trial.quick_next():
                    return trial.run("quick", self.quick, inputs)
                try:
                    out = top.execute(inputs) if trial is None else trial.run("top", top, inputs)
                except Exception as e:  # noqa: BLE001 - the quick tier still computes the step
                    out = self.quick.execute(inputs)    # raising too: the inputs' fault (an index
                    self._fail(e)                        # out of range), the top tier stays
                    return out
                counters.counter("TierUpRun")
                return out
        elif self._state is _IDLE:
            self._count(inputs)
        elif self._dropped is not None:
            self._again_in -= 1
            if self._again_in <= 0:
                self._try_again()
        return self.quick.execute(inputs)

    def _try_again(self) -> None:
        """Give a dropped top tier another trial (module note); its next execution starts it."""
        counters.counter("TierTrialAgain")
        self._trial = _Trial(self._ctx, max(1, config.tier_trial))
        self._top, self._dropped, self._state = self._dropped, None, _READY

    def _settle(self, trial: _Trial) -> None:
        """Before a trial execution: once both tiers are timed, keep the faster."""
        verdict = trial.verdict()
        if verdict is not None:     # what decided it, for `ltc.metrics` (module note)
            trial.release()
            run, period = trial.ratios()
            counters.add_sample("TierTrialRun", run)
            counters.add_sample("TierTrialPeriod", period)
            self._trials += 1
        if verdict == "quick":
            if self._trials <= _TRIALS_AGAIN:   # kept, to be tried again later
                self._dropped, self._again_in = self._top, _TRIAL_AGAIN_AFTER * 10 ** (self._trials - 1)
            self._top, self._trial, self._state = None, None, _SLOWER
            counters.counter("TierUpSlower")
        elif verdict == "top":
            self._trial = None

    def _count(self, inputs: Sequence[Any]) -> None:
        scalars = self._key(inputs)   # what a program built now would be specialized on
        if scalars == self._last:
            self._streak += 1
            if self._generic:
                for i, v in enumerate(inputs):
                    if isinstance(v, torch.Tensor) and v.shape != self._shapes[i]:
                        self._varying.update((i, d) for d, (a, b) in enumerate(zip(v.shape, self._shapes[i]))
                                             if a != b)
        else:
            self._last, self._streak = scalars, 1
            if self._generic:
                self._shapes = [v.shape if isinstance(v, torch.Tensor) else None for v in inputs]
                self._varying = set()
        if self._streak >= config.tier_up_after:
            self._state = _QUEUED
            layout = _layout(inputs)
            varying = frozenset(self._varying)
            job = lambda: self._build(layout, varying)
            if events.tier_up_job.on:   # the timeline: background builds as spans
                job = events.tier_up_job.wrap(job, self._ctx, self._label, self._tier)
            fut = worker.submit(job, cf.Future())
            with _lock:
                _builds[:] = [f for f in _builds if not f.done()]
                _builds.append(fut)

    def _build(self, layout: list, varying: frozenset) -> None:
        global _building
        if _exiting:
            return
        t0 = time.perf_counter()
        _building = threading.get_ident()
        switch = _switch_often()
        try:
            top = self._ctx.backend.compile_tier(self._tier, self._interp, self._ctx.backend_device, layout,
                                                 *((varying,) if self._generic else ()))
        except _Cancelled:
            return
        except Exception as e:  # noqa: BLE001 - the graph stays on the quick tier
            if _exiting or "after shutdown" in str(e):   # the interpreter is exiting: no failure
                return
            if isinstance(e, ImportError) and "partially initialized module" in str(e):
                # another thread was importing the same modules (a user's first torch.compile):
                # not the graph's fault; built again at its next execution
                counters.counter("TierUpRetried")
                self._state = _IDLE
                return
            self._fail(e)
            return
        finally:
            _building = None
            _switch_back(switch)
            counters.add_sample("TierUpTime", time.perf_counter() - t0)
        self._interp = None     # structure no longer needed
        counters.counter("TierUpCompile")
        self._state = _READY
        if config.tier_trial:
            self._trial = _Trial(self._ctx, config.tier_trial)   # set before `_top`: the worker
        self._top = top                                           # reads them in that order

    def _fail(self, e: BaseException) -> None:
        self._top = self._dropped = None
        if self._trial is not None:
            self._trial.release()
        self._trial = None
        self._state = _FAILED
        self._interp = None
        counters.counter("TierUpFailed")
        warnings.warn(f"ltc_async: the {self._tier} tier could not take the graph scheduled at "
                      f"{self._label} ({type(e).__name__}: {str(e)[:300]}{_raised_at(e)}); it stays on "
                      "the quick tier", RuntimeWarning, stacklevel=1)


def _raised_at(e: BaseException) -> str:
    """Where `e` was raised (its innermost frame): a compiler's bare `assert` has no message."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f", raised in {f.name} at {os.path.basename(os.path.dirname(f.filename))}/{os.path.basename(f.filename)}:{f.lineno}"


# While a build runs, Python switches threads every 0.05 ms instead of every 5 ms.  The build is
# CPU-bound Python (make_fx, Inductor's passes); the user's thread gives the GIL up at every C++
# call (the autograd engine, each dispatched op) and then waits for the build's thread to hand
# it back: up to one switch interval per op, thousands per training step.  With 5 ms, GPT-2's
# steps took up to 4.6 s while its step's program was built (`benchmarks/tier_timeline.py`);
# with 0.2 ms up to 1.2 s, with 0.05 ms up to 0.44 s, the build taking as long.  The user's own
# setting is restored afterwards (unless they changed it meanwhile).
_BUILD_SWITCH_INTERVAL = 0.00005


def _switch_often() -> float | None:
    before = sys.getswitchinterval()
    if before <= _BUILD_SWITCH_INTERVAL:
        return None
    sys.setswitchinterval(_BUILD_SWITCH_INTERVAL)
    return before


def _switch_back(before: float | None) -> None:
    # `getswitchinterval` reports the value rounded to microseconds
    if before is not None and abs(sys.getswitchinterval() - _BUILD_SWITCH_INTERVAL) < 1e-6:
        sys.setswitchinterval(before)


_MARGIN = 0.05   # a top tier this much slower than the quick one in the trial is still kept
_TRIAL_AGAIN_AFTER = 100   # executions on the quick tier before a dropped top tier's next trial
_TRIALS_AGAIN = 2          # ... and how many times (after 100, then 1000 executions)
# per device context, the trial now running (`_Trial.holds`): dict operations are atomic, and
# a device's graphs run on its worker or a reader of it, one execution at a time
_trial_holders: dict[Any, "_Trial"] = {}
_IDLE_TRIAL_S = 1.0   # a trial whose graph has not run for this long holds no turn


class _Trial:
    """The first executions after a build: the two tiers alternate, top first; each tier's
    first run warms up (allocations, first-call paths), the next `runs` are timed twice: the
    run itself (the device's work included: the backend's completion marker is waited for, so
    on CUDA a trial run waits for its kernels), and its *period*, from its start to the start
    of the graph's next execution -- the step as the program feels it, with what the run costs
    the threads tracing the next step meanwhile (sharing the cores and caches with Inductor's
    programs slowed the tracing of PyG's GAT by 7%, more than their faster kernels gained).
    The top tier must not lose on either: a period alone cannot see a graph that is a small
    part of a step (27 graphs per step of a neural ODE: each period is the whole step, and
    its noise is larger than the graph).  Touched only by the thread running the graph's
    executions, one at a time: the device worker, or a reader running it (`read_here.py`)."""

    def __init__(self, ctx: Any, runs: int) -> None:
        self._backend, self._device, self._runs = ctx.backend, ctx.backend_device, runs
        self._ctx = ctx
        self._holding = False
        self._owner_seen: tuple[Any, int] | None = None
        self._n = 0
        self._runs_s: dict[str, list[float]] = {"quick": [], "top": []}
        self._periods: dict[str, list[float]] = {"quick": [], "top": []}
        self._start = 0.0
        self._previous: tuple[str, float] | None = None   # the last timed run: tier, start

    def holds(self) -> bool:
        """Whether this trial may run now: one trial at a time per device.  A period is the
        whole step, so two graphs of one step in their trials at once timed each other's tiers
        (GPT-2's forward and backward graphs: a top tier whose runs took 0.55x the quick
        tier's lost on a period of 1.99x, the other graph's quick run in it).  A graph whose
        trial waits runs its quick tier; it takes the turn when the trial holding it has not
        run since this graph's last execution (that graph is not in this loop: it ended, or
        its inputs no longer suit its top tier), or for `_IDLE_TRIAL_S`."""
        if self._holding:
            return True
        owner = _trial_holders.setdefault(self._ctx, self)
        if owner is not self:
            seen, self._owner_seen = self._owner_seen, (owner, owner._n)
            if seen != self._owner_seen and time.perf_counter() - owner._start < _IDLE_TRIAL_S:
                return False
            _trial_holders[self._ctx] = self
        self._holding = True
        return True

    def release(self) -> None:
        if _trial_holders.get(self._ctx) is self:
            _trial_holders.pop(self._ctx, None)

    def begin(self) -> None:
        """An execution of the graph starts: the period of the previous timed run ends."""
        self._start = time.perf_counter()
        if self._previous is not None:
            tier, start = self._previous
            self._periods[tier].append(self._start - start)
            self._previous = None

    def quick_next(self) -> bool:
        return self._n % 2 == 1

    def run(self, tier: str, program: Computation, inputs: Sequence[Any]) -> list[Any]:
        self._n += 1
        out = program.execute(inputs)
        marker = self._backend.completion_marker(self._device)
        if marker is not None:
            self._backend.wait_marker(marker)
        if self._n > 2:   # each tier's first run warms up
            self._runs_s[tier].append(time.perf_counter() - self._start)
            self._previous = (tier, self._start)
        return out

    def ratios(self) -> tuple[float, float]:
        """The top tier's shortest run and period over the quick tier's (below 1: faster)."""
        return tuple(min(t["top"]) / max(min(t["quick"]), 1e-9) for t in (self._runs_s, self._periods))

    def verdict(self) -> str | None:
        """"top" or "quick" once both tiers have their timed periods, else None.  Each tier's
        shortest run and period are compared (what other threads and processes add is noise,
        never a speed-up), and the top tier is kept unless it is slower by more than `_MARGIN`
        in either."""
        if min(len(p) for p in self._periods.values()) < self._runs:
            return None
        for times in (self._runs_s, self._periods):
            if min(times["top"]) > min(times["quick"]) * (1 + _MARGIN):
                return "quick"
        return "top"


def wait_compiles(timeout: float | None = None) -> bool:
    """Block until every background build queued so far has finished; False on timeout."""
    with _lock:
        builds = list(_builds)
    done, not_done = cf.wait(builds, timeout=timeout)
    return not not_done


_exiting = False
_building: int | None = None     # the tier-up thread's ident while a build runs


class _Cancelled(BaseException):
    """Raised inside a running build at exit (between two Python bytecodes, never inside C++):
    the build unwinds, and a compiler subprocess it waits for is killed by `subprocess.run`."""


def _exit() -> None:
    """At exit, before device workers stop: builds not started yet are skipped."""
    global _exiting
    _exiting = True


def _stop() -> None:
    """At exit: queued builds are dropped and a running one is cancelled, so that exiting waits
    for at most the C++ compile or Python bytecode it is in, not for the whole build."""
    tid = _building
    if tid is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(_Cancelled))
    worker.stop(timeout=None, cancel_queued=True)


events.exit_drain.subscribe(_exit)
events.exit_stop.subscribe(_stop)
