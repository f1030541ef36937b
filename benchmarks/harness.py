"""The benchmarks' shared harness: timing, the interleaved round-robin runner, results and their
medians, Markdown tables, machine info.  The engines are in `engines.py`, the workloads in
`cases.py`.  Standard library only (a launcher process need not import torch)."""
from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

median = statistics.median


def noop() -> None:
    pass


def log(msg: str) -> None:
    """Progress goes to stderr; results go to stdout."""
    print(msg, file=sys.stderr, flush=True)


# -- timing ------------------------------------------------------------------------------------

def timed(fn: Callable[[], Any], wait: Callable[[], None] = noop) -> float:
    """Wall seconds of `fn()` and the `wait()` after it (the device is waited for first too,
    outside the timed region)."""
    wait()
    t0 = time.perf_counter()
    fn()
    wait()
    return time.perf_counter() - t0


def time_steps(step: Callable[[], Any], n: int, wait: Callable[[], None] = noop) -> float:
    """Wall seconds per step of `n` steps back to back and one `wait()` at the end (one before,
    untimed): on a lazy device, pipelined throughput."""
    wait()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    wait()
    return (time.perf_counter() - t0) / n


def trace_and_mark(trace: Callable[[], Any], mark_step: Callable[[], None]) -> tuple[float, float]:
    """One lazy step split in two: wall seconds of `trace()` (the host's tracing) and of the
    `mark_step()` after it.  What `trace()` returns stays alive across `mark_step` (as a loop
    that logs the loss keeps it), so it is an output of the graph."""
    a = time.perf_counter()
    out = trace()
    b = time.perf_counter()
    mark_step()
    c = time.perf_counter()
    del out
    return b - a, c - b


# -- results and the round-robin runner --------------------------------------------------------

@dataclass
class Result:
    section: str
    engine: str
    unit: str                    # "us/op", "ms/step", "steps/s", ...
    higher_is_better: bool
    samples: list[float] = field(default_factory=list)
    error: str | None = None
    recompiles_in_timing: int | None = None

    @property
    def median(self) -> float | None:
        return median(self.samples) if self.samples and not self.error else None


def short_error(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ").replace("|", "\\|")
    return msg if len(msg) <= 160 else msg[:157] + "..."


def fail(res: Result, exc: BaseException) -> None:
    """Record `exc` as the result's error; log it with its traceback on stderr."""
    res.error = short_error(exc)
    log(f"[{res.section}] {res.engine} FAILED: {res.error}")
    traceback.print_exception(exc, file=sys.stderr)


def _engine_recompiles(name: str) -> int | None:
    from benchmarks import engines   # imports torch and ltc_async: only when a run needs it
    return engines.recompiles(name)


class Runner:
    """Interleaved rounds of several cases (round 1 of every case, then round 2, ...), so that
    slow drifts of a noisy machine hit them alike; `Result.median` is the figure.

    `make(name) -> (warmup, one_round)`: `warmup()` (or None) runs once before the first round,
    `one_round()` returns one sample in the section's unit, or `(sample, compiles)` when it
    counts its own compiles.  Otherwise `counter(name)` (a cumulative compile count or None;
    default: the engine's, `engines.recompiles`) is read around each round.  An exception
    disables that case for the rest of the section and is reported (traceback on stderr); the
    other cases go on.  `collect`: `gc.collect()` before each round (untimed).
    """

    def __init__(self, section: str, unit: str, higher_is_better: bool, *, collect: bool = True,
                 counter: Callable[[str], int | None] = _engine_recompiles):
        self.section, self.unit, self.hib = section, unit, higher_is_better
        self.collect, self.counter = collect, counter

    def run(self, names: list[str], make: Callable[[str], tuple], rounds: int) -> dict[str, Result]:
        results = {n: Result(self.section, n, self.unit, self.hib) for n in names}
        cases = {}
        for name in names:
            try:
                warmup, one_round = make(name)
                if warmup is not None:
                    log(f"[{self.section}] warming up {name} ...")
                    t0 = time.perf_counter()
                    warmup()
                    log(f"[{self.section}]   {name} warm-up took {time.perf_counter() - t0:.1f}s")
                cases[name] = one_round
            except Exception as exc:  # report, keep going with the other cases
                fail(results[name], exc)
        for r in range(rounds):
            for name in list(cases):
                res = results[name]
                before = self.counter(name)
                try:
                    if self.collect:
                        gc.collect()
                    sample = cases[name]()
                except Exception as exc:
                    fail(res, exc)
                    del cases[name]
                    continue
                after = self.counter(name)
                compiles = None if before is None or after is None else after - before
                if isinstance(sample, tuple):
                    sample, compiles = sample
                res.samples.append(sample)
                if compiles is not None:
                    res.recompiles_in_timing = (res.recompiles_in_timing or 0) + compiles
            log(f"[{self.section}] round {r + 1}/{rounds}: " + ", ".join(
                f"{n}={results[n].samples[-1]:.4g}" for n in cases if results[n].samples))
        return results


# -- output ------------------------------------------------------------------------------------

def md_row(cells: Iterable[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_header(columns: list[str], align: str) -> str:
    """A Markdown table's header and rule lines; `align`: a letter per column, `l` or `r`."""
    assert len(columns) == len(align), (columns, align)
    return md_row(columns) + "\n|" + "".join("---:|" if a == "r" else "---|" for a in align)


def machine_info() -> str:
    import torch

    import ltc_async as ltc
    return (f"python {platform.python_version()}, torch {torch.__version__}, "
            f"ltc_async {getattr(ltc, '__version__', '?')}, {platform.machine()}, "
            f"{os.cpu_count()} cpus, torch threads {torch.get_num_threads()}, "
            f"cuda available: {torch.cuda.is_available()}")


def rerun(spec: Any, *args: str) -> list[str]:
    """The command line that runs this module again in a fresh interpreter (`python -m`, from
    the same working directory, so that it imports what this process imports)."""
    return [sys.executable, "-m", spec.name, *args]
