#!/usr/bin/env python
"""Side-by-side benchmark: eager PyTorch vs torch._lazy (C++ LTC, TorchScript backend) vs
ltc_async (this project) [vs torch.compile for the MLP step].

Everything runs in ONE process so that all engines see the same machine state; rounds of the
different engines are interleaved (round-robin) so slow drifts of a noisy machine hit every
engine alike. Reported figures are medians over rounds.

Sections (select with --only, repeatable; default: all):
  trace  trace cost in microseconds per op of a 2000-op elementwise chain on a 16x16 tensor
         (only the Python tracing loop is timed; mark_step + wait run outside the timed region
         and their result is discarded). For eager this is the plain per-op execution time.
  mlp    throughput of a small MLP training step (64->256->256->10, batch 64, CrossEntropyLoss,
         SGD(lr=0.01, momentum=0.9)): N steps back to back with mark_step after each, one
         wait_device_ops at the end, wall time / N.  Also torch.compile (default backend).
  big    compute-bound case: 4 Linear layers of width 2048, batch 512, same step; steps/s.
  overlap  the same compute-bound step on ltc_async, decomposed: host trace time per step
         (zero_grad..mark_step on the Python thread, device idle), device execute time per step
         (ExecuteTime metric), steady-state step time (N steps + wait_device_ops, / N); reports
         step / max(trace, execute) and the fraction of the shorter one that is hidden.
         eager and torch._lazy steps/s of the same model beside it, rounds interleaved.
  devices  in a subprocess with LTC_ASYNC_DEVICES=cpu,cpu: (a) a heavy graph (10x
         tanh(x @ x), 768x768) on ltc:0 alone vs on ltc:0 and ltc:1 at once; (b) DataParallel
         training (MLP 256-1024-1024-10, batch 512) on [ltc:0] vs [ltc:0, ltc:1].

Usage (from the repository root):
  python -m benchmarks.bench_lazy            # full run
  python -m benchmarks.bench_lazy --quick    # CI smoke run (few repetitions)
  python -m benchmarks.bench_lazy --only trace --only mlp
  python -m benchmarks.bench_lazy --only overlap --only devices
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time

import torch

from benchmarks import engines
from benchmarks.cases import MLPStep, chain, mlp, sgd
from benchmarks.engines import COMPILE, EAGER, LAZY, LTC
from benchmarks.harness import (Result, Runner, fail, log, machine_info, md_header, md_row, median,
                                rerun, short_error, time_steps, trace_and_mark)

# Both lazy engines live side by side in this process: torch._lazy owns device "lazy",
# ltc_async owns device "ltc".
engines.torch_lazy()

import ltc_async as ltc  # noqa: E402


# --------------------------------------------------------------------------------------------
# (a) trace cost per op
# --------------------------------------------------------------------------------------------
def bench_trace(args) -> dict[str, Result]:
    n_ops = args.trace_ops
    base_x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))

    def make(name: str):
        eng = engines.get(name)

        def one_round() -> float:
            x = base_x.to(eng.device)
            y = x.clone()
            eng.sync()               # materialize the inputs: the chain starts from device data
            y, wall, _ = chain(x, y, n_ops)
            eng.sync()               # outside the timed region; result discarded
            del x, y
            return wall / n_ops * 1e6

        def warmup() -> None:
            for _ in range(2):       # first round compiles the 2000-op graph, second hits cache
                one_round()
            if name == LTC:          # the graph's background build (tiering) before the timed
                engines.settle_tiers(one_round, 2)   # rounds, not during them (it slowed every
                #                      engine's rounds 9-15 of a run by 3-100x)

        return warmup, one_round

    return Runner("trace", "us/op", False).run([EAGER, LAZY, LTC], make, args.trace_rounds)


# --------------------------------------------------------------------------------------------
# (b)/(c) MLP training step
# --------------------------------------------------------------------------------------------
def _train_case(widths: list[int], batch: int, steps: int, warmup_steps: int):
    """Returns make(engine name) -> (warmup, round) with round() = wall seconds per step."""

    def make(name: str):
        eng = engines.get(name)
        step = MLPStep(widths, batch, eng)
        return (lambda: _warmup(step, eng, warmup_steps)), lambda: time_steps(step, steps, eng.wait)

    return make


def _warmup(step: MLPStep, eng: engines.Engine, steps: int) -> None:
    # The loss is kept alive across mark_step everywhere (as a loop that logs it would), so the
    # warm-up compiles exactly the graph that the timed steps run.
    for _ in range(steps):
        loss = step()
    eng.wait()
    if eng.name == LTC:   # the timed steps in the tiers' steady state
        engines.settle_tiers(step, steps)
        loss = step()
        eng.wait()
    v = float(loss.detach().cpu())  # sanity check (a sync), outside any timed region
    if not math.isfinite(v):
        raise RuntimeError(f"non-finite loss after warm-up: {v}")


def bench_mlp(args) -> dict[str, Result]:
    make_s = _train_case([64, 256, 256, 10], 64, args.mlp_steps, args.mlp_warmup)

    def make(name):  # ms/step
        warmup, one_round = make_s(name)
        return warmup, lambda: one_round() * 1e3

    names = [EAGER, LAZY, LTC] + ([] if args.no_compile else [COMPILE])
    return Runner("mlp", "ms/step", False).run(names, make, args.mlp_rounds)


def bench_big(args) -> dict[str, Result]:
    h = 2048
    make_s = _train_case([h, h, h, h, 10], 512, args.big_steps, args.big_warmup)

    def make(name):  # steps/s
        warmup, one_round = make_s(name)
        return warmup, lambda: 1.0 / one_round()

    return Runner("big", "steps/s", True).run([EAGER, LAZY, LTC], make, args.big_rounds)


# --------------------------------------------------------------------------------------------
# (d) overlap: does tracing step N+1 hide behind executing step N?  (compute-bound case)
# --------------------------------------------------------------------------------------------
def _ms(v: float) -> float:
    return v * 1e3


def _ltc_overlap_case(widths: list[int], batch: int, warmup_steps: int):
    """ltc_async training step on ltc:0 with the host / device time split out."""
    eng = engines.get(LTC)
    step = MLPStep(widths, batch, eng)
    trace_step = step.trace  # everything but mark_step: pure tracing on the Python thread

    def warmup() -> None:
        _warmup(step, eng, warmup_steps)

    def _execute_samples() -> tuple[int, list[float]]:
        data = ltc.metrics.metric_data("ExecuteTime")
        return (0, []) if data is None else (data[0], list(data[2]))

    def steady_round(steps: int) -> dict:
        """N steps back to back (mark_step never waits except for a free queue slot)."""
        ltc.wait_device_ops()
        gc.collect()
        ltc.metrics.reset()
        tracing, marking = [], []
        t0 = time.perf_counter()
        for _ in range(steps):
            t, m = trace_and_mark(trace_step, ltc.mark_step)
            tracing.append(t)
            marking.append(m)
        ltc.wait_device_ops()
        wall = time.perf_counter() - t0
        n_exec, execs = _execute_samples()
        return dict(step=wall / steps, wall=wall, tracing=tracing, marking=marking,
                    execute=execs, n_exec=n_exec,
                    recompiles=engines.ltc_compiles())

    def isolated_round(steps: int) -> dict:
        """Each step starts with an idle device: host time and device time without overlap."""
        host, execs, n_exec, recompiles = [], [], 0, 0
        for _ in range(steps):
            ltc.wait_device_ops()
            gc.collect()
            ltc.metrics.reset()
            host.append(sum(trace_and_mark(trace_step, ltc.mark_step)))
            ltc.wait_device_ops()
            k, samples = _execute_samples()
            n_exec += k
            execs += samples
            recompiles += engines.ltc_compiles()
        return dict(host=host, execute=execs, n_exec=n_exec, recompiles=recompiles)

    return warmup, steady_round, isolated_round


def bench_overlap(args) -> dict[str, Result]:
    h = 2048
    widths, batch, steps = [h, h, h, h, 10], 512, args.overlap_steps
    detail = dict(steady=[], isolated=[])
    ref_make = _train_case(widths, batch, steps, args.overlap_warmup)

    def make(name: str):
        if name != LTC:
            warmup, one_round = ref_make(name)
            return warmup, lambda: 1.0 / one_round()
        warmup, steady, isolated = _ltc_overlap_case(widths, batch, args.overlap_warmup)

        def ltc_round() -> tuple[float, int]:
            s = steady(steps)
            detail["steady"].append(s)
            detail["isolated"].append(isolated(args.overlap_iso_steps))
            return 1.0 / s["step"], s["recompiles"]
        return warmup, ltc_round

    results = Runner("overlap", "steps/s", True).run([EAGER, LAZY, LTC], make, args.overlap_rounds)
    OVERLAP_DETAIL.clear()
    if detail["steady"] and detail["isolated"] and not results[LTC].error:
        OVERLAP_DETAIL.update(_overlap_summary(detail, steps))
    return results


OVERLAP_DETAIL: dict = {}


def _overlap_summary(detail: dict, steps: int) -> dict:
    med = median
    steady, iso = detail["steady"], detail["isolated"]
    trace = med([v for d in iso for v in d["host"]])
    execute = med([v for d in iso for v in d["execute"]])
    step = med([d["step"] for d in steady])
    loop_tracing = med([v for d in steady for v in d["tracing"]])
    loop_marking = med([v for d in steady for v in d["marking"]])
    loop_host = med([a + b for d in steady for a, b in zip(d["tracing"], d["marking"])])
    loop_execute = med([v for d in steady for v in d["execute"]])
    busy = med([sum(d["execute"]) / d["wall"] for d in steady])
    # device idle time per step in the same loop: the host time that was NOT hidden
    exposed = med([(d["wall"] - sum(d["execute"])) / len(d["tracing"]) for d in steady])
    n_steps = len(steady) * steps + sum(len(d["host"]) for d in iso)
    n_exec = sum(d["n_exec"] for d in steady) + sum(d["n_exec"] for d in iso)
    return dict(
        trace=trace, execute=execute, step=step,
        ratio=step / max(trace, execute),
        hidden=(trace + execute - step) / min(trace, execute),
        loop_tracing=loop_tracing, loop_marking=loop_marking, loop_host=loop_host,
        loop_execute=loop_execute, busy=busy, exposed=exposed,
        hidden_loop=1.0 - exposed / trace, exec_per_step=n_exec / max(1, n_steps),
        n_steady=len(steady) * steps, n_iso=sum(len(d["host"]) for d in iso),
        iso_recompiles=sum(d["recompiles"] for d in iso))


# --------------------------------------------------------------------------------------------
# (e) devices: two virtual CPU devices (subprocess with LTC_ASYNC_DEVICES=cpu,cpu)
# --------------------------------------------------------------------------------------------
_CHILD_MARK = "@@bench_lazy_devices_json "


def bench_devices(args) -> dict[str, Result]:
    """Runs the devices section in a child process (the device set is fixed per process)."""
    env = dict(os.environ, LTC_ASYNC_DEVICES="cpu,cpu")
    cmd = rerun(__spec__, "--devices-child",
                "--devices-rounds", str(args.devices_rounds),
                "--devices-graph-iters", str(args.devices_graph_iters),
                "--dp-steps", str(args.dp_steps), "--dp-warmup", str(args.dp_warmup))
    log(f"[devices] child: LTC_ASYNC_DEVICES=cpu,cpu {' '.join(cmd[1:])}")
    results: dict[str, Result] = {}
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=None, text=True,
                              timeout=3600)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_CHILD_MARK)]
        if not lines:
            raise RuntimeError(f"devices child exited with status {proc.returncode} and no result"
                               f" (stdout tail: {proc.stdout[-300:]!r})")
        payload = json.loads(lines[-1][len(_CHILD_MARK):])
    except Exception as exc:
        res = Result("devices", LTC, "-", False)
        fail(res, exc)
        return {"devices": {LTC: res}}  # type: ignore[dict-item]
    DEVICES_INFO.clear()
    DEVICES_INFO.update(payload["info"])
    for sec, rows in payload["results"].items():
        results.setdefault(sec, {})
        for name, d in rows.items():
            results[sec][name] = Result(sec, name, d["unit"], d["hib"], d["samples"], d["error"],
                                        d["recompiles"])
    return results  # type: ignore[return-value]


DEVICES_INFO: dict = {}
DEV1, DEV2 = "ltc_async [ltc:0]", "ltc_async [ltc:0, ltc:1]"
EAGER_T1, EAGER_T2 = "eager, 1 host thread", "eager, 2 host threads at once"


def devices_child(args) -> int:
    devs = ltc.devices()
    threads = int(os.environ.get("LTC_ASYNC_CPU_THREADS") or 0) or max(
        1, torch.get_num_threads() // max(1, len(devs)))
    info = dict(devices=[str(d) for d in devs],
                backend=[str(ltc.backend_device(d)) for d in devs],
                torch_threads=torch.get_num_threads(), threads_per_device=threads)
    log(f"[devices] child: {info}")
    out: dict[str, dict[str, Result]] = {}
    if len(devs) < 2:
        err = RuntimeError(f"expected 2 lazy devices with LTC_ASYNC_DEVICES=cpu,cpu, got {devs}")
        for sec, unit, hib in (("devices.concurrent", "ms/graph", False),
                               ("devices.dp", "steps/s", True)):
            out[sec] = {DEV1: Result(sec, DEV1, unit, hib, error=short_error(err))}
    else:
        out["devices.concurrent"] = _bench_concurrent(args)
        out["devices.dp"] = _bench_dp(args)
    payload = dict(info=info, results={
        sec: {n: dict(unit=r.unit, hib=r.higher_is_better, samples=r.samples, error=r.error,
                      recompiles=r.recompiles_in_timing) for n, r in rows.items()}
        for sec, rows in out.items()})
    print(_CHILD_MARK + json.dumps(payload), flush=True)
    return 0


def _ltc_counter(name: str) -> int | None:
    return engines.ltc_compiles() if name in (DEV1, DEV2) else None


class _HostWorker:
    """A daemon thread running submitted functions in order, with `threads` intra-op threads."""

    def __init__(self, threads: int) -> None:
        import concurrent.futures
        self._pool = concurrent.futures.ThreadPoolExecutor(
            1, initializer=torch.set_num_threads, initargs=(threads,))

    def submit(self, fn):
        return self._pool.submit(fn)


def _bench_concurrent(args) -> dict[str, Result]:
    sec = "devices.concurrent"
    iters = args.devices_graph_iters
    torch.manual_seed(0)
    base = torch.randn(768, 768) / 768 ** 0.5
    inputs = {d: base.to(d) for d in ("ltc:0", "ltc:1")}
    ltc.mark_step()
    ltc.wait_device_ops()

    def run(devs: list[str]) -> float:
        """Trace the graph on every device in `devs`, schedule all, wait; wall seconds."""
        ltc.wait_device_ops()
        gc.collect()
        t0 = time.perf_counter()
        outs = []
        for d in devs:
            x = inputs[d]
            for _ in range(iters):
                x = torch.tanh(x @ x)
            outs.append(x)
        ltc.mark_step(devs)
        ltc.wait_device_ops(devs)
        dt = time.perf_counter() - t0
        del outs
        return dt

    def eager_work() -> None:
        x = base
        for _ in range(iters):
            x = torch.tanh(x @ x)

    # two long-lived host threads with one intra-op thread each, like the ltc CPU device workers
    host_workers = [_HostWorker(threads=1) for _ in range(2)]

    def run_eager(n_threads: int) -> float:
        """Machine reference: the same graph in eager mode on `n_threads` host threads at once."""
        gc.collect()
        t0 = time.perf_counter()
        done = [w.submit(eager_work) for w in host_workers[:n_threads]]
        for d in done:
            d.result()
        return time.perf_counter() - t0

    cases = {EAGER_T1: lambda: run_eager(1), EAGER_T2: lambda: run_eager(2),
             DEV1: lambda: run(["ltc:0"]), DEV2: lambda: run(["ltc:0", "ltc:1"])}
    warm = {EAGER_T1: [cases[EAGER_T1]], EAGER_T2: [cases[EAGER_T2]],
            DEV1: [lambda: run(["ltc:0"]), lambda: run(["ltc:1"])], DEV2: [cases[DEV2]]}

    def make(name: str):
        def warmup() -> None:  # compiles on both devices
            for _ in range(2):
                for fn in warm[name]:
                    fn()
        return warmup, lambda: cases[name]() * 1e3

    return Runner(sec, "ms/graph", False, collect=False, counter=_ltc_counter).run(
        list(cases), make, args.devices_rounds)


def _bench_dp(args) -> dict[str, Result]:
    from ltc_async.parallel import DataParallel

    sec = "devices.dp"
    torch.manual_seed(0)
    model = mlp([256, 1024, 1024, 10])
    x = torch.randn(512, 256)
    y = torch.randint(0, 10, (512,))
    loss_fn = torch.nn.functional.cross_entropy
    cases = {DEV1: ["ltc:0"], DEV2: ["ltc:0", "ltc:1"]}

    def make(name: str):
        dp = DataParallel(model, cases[name], make_optimizer=lambda p: sgd(p, lr=0.05))

        def warmup() -> None:
            for _ in range(args.dp_warmup):
                losses = dp.step(x, y, loss_fn)
            ltc.wait_device_ops()
            vals = [float(v.detach().cpu()) for v in losses]
            if not all(math.isfinite(v) for v in vals):
                raise RuntimeError(f"non-finite loss after warm-up: {vals}")
        return warmup, lambda: 1.0 / time_steps(lambda: dp.step(x, y, loss_fn), args.dp_steps,
                                                 ltc.wait_device_ops)

    return Runner(sec, "steps/s", True, counter=_ltc_counter).run(list(cases), make,
                                                                   args.devices_rounds)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
SECTION_TITLES = {
    "trace": "trace cost, 2000-op elementwise chain on 16x16",
    "mlp": "MLP 64-256-256-10 train step, batch 64 (throughput)",
    "big": "MLP 4x Linear width 2048 train step, batch 512",
    "overlap": "same compute-bound step (4x Linear 2048, batch 512): steady-state steps/s; "
               "ltc_async decomposition below",
    "devices.concurrent": "subprocess, LTC_ASYNC_DEVICES=cpu,cpu: graph of 10x tanh(x @ x) on "
                          "768x768, wall time from tracing to wait_device_ops, on ltc:0 alone "
                          "vs one copy on each of ltc:0 and ltc:1 at once; eager rows: the same "
                          "computation on 1 vs 2 host threads (torch.set_num_threads(1) in "
                          "each) as the machine's own concurrency reference",
    "devices": "subprocess with LTC_ASYNC_DEVICES=cpu,cpu",
    "devices.dp": "subprocess, LTC_ASYNC_DEVICES=cpu,cpu: DataParallel MLP 256-1024-1024-10, "
                  "batch 512 (split over the devices), SGD momentum, cross-entropy",
}


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if v >= 1 else f"{v:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def render(all_results: dict[str, dict[str, Result]]) -> str:
    lines = [md_header(["case", "engine", "median", "unit", "min..max", "rounds", "vs torch._lazy",
                        "vs eager", "recompiles while timed"], "llrllrrrr")]
    for section, results in all_results.items():
        lazy_med = results[LAZY].median if LAZY in results else None
        eager_med = results[EAGER].median if EAGER in results else None
        for name, res in results.items():
            better = "higher" if res.higher_is_better else "lower"
            if res.error:
                med, spread = f"n/a ({res.error})", "-"
            else:
                med = _fmt(res.median)
                spread = f"{_fmt(min(res.samples))}..{_fmt(max(res.samples))}"
            rc = "-" if res.recompiles_in_timing is None else str(res.recompiles_in_timing)
            lines.append(md_row([
                section, name, med, f"{res.unit} ({better} is better)", spread, len(res.samples),
                _ratio(res.median, lazy_med) if LAZY in results else "-",
                _ratio(res.median, eager_med) if EAGER in results else "-", rc]))
    out = ["", "Ratios are value / reference value of the same unit "
           "(for us/op and ms/step < 1 means faster; for steps/s > 1 means faster).", ""]
    out += [f"- **{s}**: {SECTION_TITLES[s]}" for s in all_results]
    out += [""] + lines
    if "big" in all_results:
        r = all_results["big"]
        out += ["", f"big case, ltc_async / torch._lazy steps/s: "
                    f"{_ratio(_med(r, LTC), _med(r, LAZY))}"]
    if "overlap" in all_results:
        out += _render_overlap(all_results["overlap"])
    if "devices.concurrent" in all_results or "devices.dp" in all_results:
        out += _render_devices(all_results)
    return "\n".join(out)


def _med(results: dict[str, Result], name: str) -> float | None:
    return results[name].median if name in results else None


def _render_overlap(r: dict[str, Result]) -> list[str]:
    out = ["", "overlap, ltc_async on ltc:0 (medians; times per training step):", ""]
    d = OVERLAP_DETAIL
    if not d:
        return out + ["(no ltc_async figures: see the error above)"]
    out += [
        md_header(["figure", "value"], "lr"),
        f"| host trace time, device idle: zero_grad+forward+backward+step+mark_step "
        f"({d['n_iso']} steps, each started after wait_device_ops) | {_fmt(_ms(d['trace']))} ms |",
        f"| device execute time, alone (ExecuteTime samples of those steps) "
        f"| {_fmt(_ms(d['execute']))} ms |",
        f"| steady-state step time: wall(N steps + wait_device_ops) / N "
        f"({d['n_steady']} steps in all) | {_fmt(_ms(d['step']))} ms |",
        f"| **step / max(trace, execute)** (goal <= 1.1) | **{d['ratio']:.2f}** |",
        f"| **trace hidden: (trace + execute - step) / min(trace, execute)** (100% = fully hidden) "
        f"| **{d['hidden'] * 100:.0f}%** |",
        f"| in the steady loop: host tracing (zero_grad..step) | {_fmt(_ms(d['loop_tracing']))} ms |",
        f"| in the steady loop: mark_step (incl. waiting for a free slot in the device queue) "
        f"| {_fmt(_ms(d['loop_marking']))} ms |",
        f"| in the steady loop: host total zero_grad..mark_step | {_fmt(_ms(d['loop_host']))} ms |",
        f"| in the steady loop: device execute time (ExecuteTime) "
        f"| {_fmt(_ms(d['loop_execute']))} ms |",
        f"| in the steady loop: device busy = sum(ExecuteTime) / wall | {d['busy'] * 100:.0f}% |",
        f"| in the steady loop: device idle per step = (wall - sum(ExecuteTime)) / N "
        f"| {_fmt(_ms(d['exposed']))} ms |",
        f"| trace hidden, same-loop estimate: 1 - device idle per step / trace "
        f"| {d['hidden_loop'] * 100:.0f}% |",
        f"| executions per step | {d['exec_per_step']:.2f} |",
    ]
    ltc_s, lazy_s, eager_s = _med(r, LTC), _med(r, LAZY), _med(r, EAGER)
    out += ["", f"overlap, steady-state steps/s: ltc_async / torch._lazy = {_ratio(ltc_s, lazy_s)}, "
                f"ltc_async / eager = {_ratio(ltc_s, eager_s)}"]
    return out


def _render_devices(all_results: dict[str, dict[str, Result]]) -> list[str]:
    info = DEVICES_INFO
    out = ["", "devices (subprocess, LTC_ASYNC_DEVICES=cpu,cpu): " + (
        f"lazy devices {info.get('devices')} -> {info.get('backend')}, torch threads "
        f"{info.get('torch_threads')}, intra-op threads per device worker "
        f"{info.get('threads_per_device')}" if info else "no device info (child failed)")]
    c = all_results.get("devices.concurrent", {})
    one, two = _med(c, DEV1), _med(c, DEV2)
    out.append(f"- concurrency: time(one graph on each of ltc:0 and ltc:1) / time(one graph on "
               f"ltc:0) = **{_ratio(two, one)}** (ideal 1.0, serialized 2.0); machine reference, "
               f"same graph in eager mode on 2 host threads at once / on 1 thread (one intra-op "
               f"thread each): {_ratio(_med(c, EAGER_T2), _med(c, EAGER_T1))}")
    dp = all_results.get("devices.dp", {})
    s1, s2 = _med(dp, DEV1), _med(dp, DEV2)
    out.append(f"- data parallel: steps/s on [ltc:0, ltc:1] / steps/s on [ltc:0] = "
               f"**{_ratio(s2, s1)}** speed-up (ideal 2.0 for two one-thread devices)")
    return out


SECTIONS = ["trace", "mlp", "big", "overlap", "devices"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=SECTIONS,
                   help="run only this section (repeatable); default: all")
    p.add_argument("--quick", action="store_true", help="few repetitions (CI smoke run)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile in mlp")
    p.add_argument("--trace-ops", type=int, default=2000)
    p.add_argument("--trace-rounds", type=int)
    p.add_argument("--mlp-steps", type=int, help="timed steps per round")
    p.add_argument("--mlp-rounds", type=int)
    p.add_argument("--mlp-warmup", type=int)
    p.add_argument("--big-steps", type=int, help="timed steps per round")
    p.add_argument("--big-rounds", type=int)
    p.add_argument("--big-warmup", type=int)
    p.add_argument("--overlap-steps", type=int, help="timed back-to-back steps per round")
    p.add_argument("--overlap-iso-steps", type=int,
                   help="steps per round measured one at a time on an idle device")
    p.add_argument("--overlap-rounds", type=int)
    p.add_argument("--overlap-warmup", type=int)
    p.add_argument("--devices-rounds", type=int)
    p.add_argument("--devices-graph-iters", type=int, help="tanh(x @ x) per graph")
    p.add_argument("--dp-steps", type=int, help="timed DataParallel steps per round")
    p.add_argument("--dp-warmup", type=int)
    p.add_argument("--plot", metavar="PNG", help="also draw the table (benchmarks/plot.py; "
                   "needs matplotlib: pip install -e '.[bench]')")
    p.add_argument("--devices-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    defaults = dict(trace_rounds=15, mlp_steps=50, mlp_rounds=15, mlp_warmup=30,
                    big_steps=5, big_rounds=4, big_warmup=10,
                    overlap_steps=10, overlap_iso_steps=4, overlap_rounds=4, overlap_warmup=5,
                    devices_rounds=5, devices_graph_iters=10, dp_steps=10, dp_warmup=3)
    if args.quick:
        defaults = dict(trace_rounds=3, mlp_steps=10, mlp_rounds=2, mlp_warmup=10,
                        big_steps=2, big_rounds=1, big_warmup=2,
                        overlap_steps=3, overlap_iso_steps=2, overlap_rounds=1, overlap_warmup=2,
                        devices_rounds=1, devices_graph_iters=10, dp_steps=3, dp_warmup=3)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.devices_child:
        return devices_child(args)

    sections = args.only or SECTIONS
    print(f"# bench_lazy ({'quick' if args.quick else 'full'}): {machine_info()}")
    print(f"# sections: {', '.join(sections)}; settings: " + ", ".join(
        f"{k}={getattr(args, k)}" for k in ["trace_ops", *defaults]))
    sys.stdout.flush()

    all_results: dict[str, dict[str, Result]] = {}
    bench = {"trace": bench_trace, "mlp": bench_mlp, "big": bench_big,
             "overlap": bench_overlap, "devices": bench_devices}
    for s in SECTIONS:
        if s in sections:
            t0 = time.perf_counter()
            if s == "devices":  # one child process, several sub-sections
                all_results.update(bench[s](args))
            else:
                all_results[s] = bench[s](args)
            log(f"[{s}] section took {time.perf_counter() - t0:.0f}s")
    table = render(all_results)
    print(table)
    if args.plot:
        from benchmarks.plot import plot, rows_from_markdown
        log(f"figure: {plot(rows_from_markdown(table), args.plot)}")
    failed = [f"{s}/{e}" for s, rs in all_results.items() for e, r in rs.items()
              if r.error and e != COMPILE]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
