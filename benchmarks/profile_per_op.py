"""The per-op path, measured layer by layer (issue 11; results in benchmarks/README.md,
"Per-op path profile").

    python benchmarks/profile_per_op.py [--only chain,layers,models] [--models gpt2,bert,mobilenet_v2]
                                        [--rounds 15] [--steps 16]

Every figure is a median, and also given in CPU time of the tracing thread
(`time.thread_time()`), which other processes on a shared machine do not inflate the way they
inflate wall time.  The script measures whichever `ltc_async` is imported, so an older tree can
be measured side by side: `PYTHONPATH=/path/to/old/tree python benchmarks/profile_per_op.py`.

* `chain`: bench_lazy.py's `trace` workload (2000 ops on a 16x16 tensor, alternating
  `y * 1.0001` and `y + x`, inputs materialized, only the Python loop timed), for torch._lazy,
  ltc_async and two references: eager CPU, and the *floor* of any Python lazy engine built on
  PyTorch's functionalization and a `__torch_dispatch__` subclass -- the same chain on a
  functional wrapper of a subclass whose `__torch_dispatch__` only makes the output tensor.
  Rounds of all four interleaved.
* `layers`: one traced `add` on 16x16 lazy tensors, and its parts, timed alone in loops.
* `models`: the real-workload suite's models (tests/models/test_models.py), steady training
  steps with one intra-op thread (`torch.set_num_threads(1)`: eager's whole step is then CPU
  time of this thread, and ltc_async's device worker gets one thread too): eager CPU per step,
  and ltc_async's host CPU per step by phase (zero_grad, forward, backward, optimizer step,
  mark_step; each step starts after `wait_device_ops`), ops reaching `__torch_dispatch__` per
  step, garbage-collection time per step and the device's `ExecuteTime` per step.
"""
from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch

torch.set_num_threads(1)   # before ltc_async sizes its device workers (see `models`)

import torch._lazy  # noqa: E402
import torch._lazy.ts_backend  # noqa: E402

torch._lazy.ts_backend.init()

import ltc_async as ltc  # noqa: E402
from ltc_async.tensor import lazy_tensor  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "models"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

_cpu = time.thread_time
_wall = time.perf_counter


def _med(values: list[float]) -> float:
    return statistics.median(values)


# -- chain ---------------------------------------------------------------------------------------

class _Floor(torch.Tensor):
    """A `__torch_dispatch__` subclass that only makes its output: the cost every Python lazy
    engine pays per op before doing any work of its own."""

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        return torch.Tensor._make_wrapper_subclass(_Floor, (16, 16), (16, 1), dtype=torch.float32,
                                                   device="cpu")


def _floor_tensor() -> torch.Tensor:
    inner = torch.Tensor._make_wrapper_subclass(_Floor, (16, 16), (16, 1), dtype=torch.float32,
                                                device="cpu")
    return torch._to_functional_tensor(inner)


def chain(rounds: int, n_ops: int = 2000) -> None:
    base = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    engines: dict[str, tuple[Callable[[], tuple], Callable[[], None]]] = {
        "eager": (lambda: (base.clone(), base.clone()), lambda: None),
        "floor (functionalization + __torch_dispatch__)": (lambda: (_floor_tensor(), _floor_tensor()),
                                                           lambda: None),
        "torch._lazy": (lambda: (base.to("lazy"), base.to("lazy")),
                        lambda: (torch._lazy.mark_step(), torch._lazy.wait_device_ops())),
        "ltc_async": (lambda: (base.to("ltc:0"), base.to("ltc:0")),
                      lambda: (ltc.mark_step(), ltc.wait_device_ops())),
    }
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in engines}

    def one(name: str) -> tuple[float, float]:
        make, sync = engines[name]
        x, y = make()
        sync()
        w, c = _wall(), _cpu()
        for _ in range(n_ops // 2):
            y = y * 1.0001
            y = y + x
        w, c = _wall() - w, _cpu() - c
        sync()
        return w / n_ops * 1e6, c / n_ops * 1e6

    for name in engines:   # warm-up: compiles, caches
        one(name)
        one(name)
    for _ in range(rounds):
        for name in engines:
            gc.collect()
            res[name].append(one(name))
    lazy_w = _med([w for w, _ in res["torch._lazy"]])
    lazy_c = _med([c for _, c in res["torch._lazy"]])
    print(f"\nchain: {n_ops} ops on 16x16, median of {rounds} interleaved rounds\n")
    print("| engine | wall us/op | cpu us/op | vs torch._lazy (wall) | vs torch._lazy (cpu) |")
    print("|---|---:|---:|---:|---:|")
    for name, v in res.items():
        w, c = _med([w for w, _ in v]), _med([c for _, c in v])
        print(f"| {name} | {w:.2f} | {c:.2f} | {w / lazy_w:.2f}x | {c / lazy_c:.2f}x |")


# -- layers --------------------------------------------------------------------------------------

def layers(rounds: int, n: int = 4000) -> None:
    from ltc_async.ir.node import Node
    from ltc_async.tensor.dispatch import dispatch
    from ltc_async.tensor.lazy_tensor import make_tensor, unwrap
    aten = torch.ops.aten
    x = torch.randn(16, 16).to("ltc:0")
    ltc.mark_step()
    ltc.wait_device_ops()
    xi = unwrap(x)
    y = dispatch(aten.add.Tensor, (xi, xi), {})
    node, meta = y._v[0], y._m
    ctx = xi._ctx
    fx, fy = _floor_tensor(), _floor_tensor()
    parts: dict[str, Callable[[], Any]] = {
        "user op `x + x` (everything)": lambda: x + x,
        "floor: the same on the do-nothing subclass": lambda: fx + fy,
        "ltc_async's own part: `dispatch(aten.add.Tensor, ...)` called directly": (
            lambda: dispatch(aten.add.Tensor, (xi, xi), {})),
        "  of which: make the output (`make_tensor`)": lambda: make_tensor(ctx, node, 0, meta),
        "  of which: `_make_wrapper_subclass` alone": (
            lambda: torch.Tensor._make_wrapper_subclass(type(xi), meta.shape, meta.stride,
                                                        dtype=meta.dtype, device=ctx.device)),
        "  of which: the IR node (`Node(...)`)": (
            lambda: Node(aten.add.Tensor, (xi._v, xi._v), node.template, node.scalars,
                         node.outputs, node.out_spec, None, None, "aten::add.Tensor")),
    }
    res: dict[str, list[float]] = {k: [] for k in parts}
    for r in range(rounds):
        for name, f in parts.items():
            c = _cpu()
            for _ in range(n):
                f()
            res[name].append((_cpu() - c) / n * 1e6)
        ltc.mark_step()
        ltc.wait_device_ops()
    print(f"\nlayers: one traced add on 16x16, cpu us per call, median of {rounds} rounds of {n}\n")
    print("| layer | cpu us |")
    print("|---|---:|")
    for name, v in res.items():
        print(f"| {name} | {_med(v):.2f} |")


# -- models --------------------------------------------------------------------------------------

_PHASES = ("zero_grad", "forward", "backward", "optimizer step", "mark_step")


def _step(case: Any, model: Any, opt: Any, batch: dict, lazy: bool) -> list[float]:
    t = [_cpu()]
    opt.zero_grad()
    t.append(_cpu())
    loss = case.loss(model, batch)
    t.append(_cpu())
    loss.backward()
    t.append(_cpu())
    opt.step()
    t.append(_cpu())
    if lazy:
        ltc.mark_step()
    t.append(_cpu())
    return [b - a for a, b in zip(t, t[1:])]


def models(names: list[str], steps: int) -> None:
    import test_models
    cases = [c for c in test_models.CASES if c.name in names]
    print(f"\nmodels: cpu ms per steady step (1 intra-op thread), median of {steps} steps\n")
    print("| model | eager | ltc_async host | ratio | " + " | ".join(_PHASES)
          + " | ops to __torch_dispatch__ | gc | device execute |")
    print("|---|---:|---:|---:|" + "---:|" * (len(_PHASES) + 3))
    for case in cases:
        torch.manual_seed(0)
        base = case.build()
        host = [case.batch() for _ in range(4)]
        eager = copy.deepcopy(base)
        opt = case.optimizer(eager.parameters())
        for i in range(4):
            _step(case, eager, opt, host[i % 4], False)
        e = [sum(_step(case, eager, opt, host[i % 4], False)) for i in range(steps)]

        model = copy.deepcopy(base).to("ltc:0")
        opt = case.optimizer(model.parameters())
        batches = [{k: v.to("ltc:0") for k, v in b.items()} for b in host]
        for i in range(4):
            _step(case, model, opt, batches[i % 4], True)
        ltc.wait_device_ops()

        gc_time, gc_start = [0.0], [0.0]

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                gc_start[0] = _cpu()
            else:
                gc_time[0] += _cpu() - gc_start[0]
        gc.callbacks.append(on_gc)
        rows, gcs, execs = [], [], []
        try:
            for i in range(steps):
                gc_time[0] = 0.0
                ltc.metrics.reset()
                rows.append(_step(case, model, opt, batches[i % 4], True))
                gcs.append(gc_time[0])
                ltc.wait_device_ops()
                data = ltc.metrics.metric_data("ExecuteTime")
                execs.append(data[1] if data else 0.0)
        finally:
            gc.callbacks.remove(on_gc)

        calls = [0]   # one more step, counting what reaches __torch_dispatch__
        original = lazy_tensor.LtcTensor.__dict__["__torch_dispatch__"]

        def counting(cls: Any, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            calls[0] += 1
            return original.__func__(cls, func, types, args, kwargs)
        lazy_tensor.LtcTensor.__torch_dispatch__ = classmethod(counting)
        try:
            _step(case, model, opt, batches[0], True)
            ltc.wait_device_ops()
        finally:
            lazy_tensor.LtcTensor.__torch_dispatch__ = original

        phases = [_med([r[j] for r in rows]) * 1e3 for j in range(len(_PHASES))]
        eager_ms, host_ms = _med(e) * 1e3, _med([sum(r) for r in rows]) * 1e3
        print(f"| {case.name} | {eager_ms:.2f} | {host_ms:.2f} | {host_ms / eager_ms:.2f}x | "
              + " | ".join(f"{p:.2f}" for p in phases)
              + f" | {calls[0]} | {_med(gcs) * 1e3:.2f} ({sum(gcs) / steps * 1e3:.2f} mean)"
              f" | {_med(execs) * 1e3:.2f} |", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="chain,layers,models")
    p.add_argument("--models", default="gpt2,bert,mobilenet_v2")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    only = args.only.split(",")
    print(f"ltc_async from {os.path.dirname(ltc.__file__)}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op thread(s)")
    if "chain" in only:
        chain(args.rounds)
    if "layers" in only:
        layers(args.rounds)
    if "models" in only:
        models(args.models.split(","), args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
