"""The per-op path, measured layer by layer (issue 11; results in benchmarks/README.md,
"Per-op path profile").

    python -m benchmarks.profile_per_op [--only chain,layers,inplace,models] [--models gpt2,bert,mobilenet_v2]
                                        [--rounds 15] [--steps 16]

Every figure is a median, and also given in CPU time of the tracing thread
(`time.thread_time()`), which other processes on a shared machine do not inflate the way they
inflate wall time.  The script measures whichever `ltc_async` is imported (its folder is
printed first), so an older tree can be measured side by side: from the old tree's root,
`PYTHONPATH=/path/to/this/tree python -m benchmarks.profile_per_op` (the working directory
comes first on the path: `ltc_async` and the model cases are the old tree's, `benchmarks` is
this tree's package where the old tree's `benchmarks/` has no `__init__.py`).

* `chain`: bench_lazy.py's `trace` workload (2000 ops on a 16x16 tensor, alternating
  `y * 1.0001` and `y + x`, inputs materialized, only the Python loop timed), for torch._lazy,
  ltc_async and two references: eager CPU, and the *floor* of any Python lazy engine built on
  PyTorch's functionalization and a `__torch_dispatch__` subclass -- the same chain on a
  functional wrapper of a subclass whose `__torch_dispatch__` only makes the output tensor.
  Rounds of all four interleaved.
* `layers`: one traced `add` on 16x16 lazy tensors, and its parts, timed alone in loops.
* `inplace`: in-place ops against their functional forms, eager beside (functionalization's
  meta check of each in-place call, cached per signature: `patches/meta_checks.py`).
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
import time
from typing import Any, Callable

import torch

torch.set_num_threads(1)   # before ltc_async sizes its device workers (see `models`)

from benchmarks import engines  # noqa: E402  (imports ltc_async)
from benchmarks.cases import chain as chain_ops, suite_cases, to_device  # noqa: E402
from benchmarks.engines import EAGER, LAZY, LTC  # noqa: E402
from benchmarks.harness import Runner, md_header, md_row, median as _med  # noqa: E402

engines.torch_lazy()

import ltc_async as ltc  # noqa: E402
from ltc_async.tensor import lazy_tensor  # noqa: E402

_cpu = time.thread_time


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


FLOOR = "floor (functionalization + __torch_dispatch__)"


def chain(rounds: int, n_ops: int = 2000) -> None:
    base = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    names = [EAGER, FLOOR, LAZY, LTC]
    cpu: dict[str, list[float]] = {k: [] for k in names}

    def make(name: str):
        if name == FLOOR:
            inputs, sync = (lambda: (_floor_tensor(), _floor_tensor())), (lambda: None)
        else:
            eng = engines.get(name)
            inputs, sync = (lambda: (base.clone().to(eng.device), base.clone().to(eng.device))), eng.sync

        def one() -> float:
            x, y = inputs()
            sync()
            y, w, c = chain_ops(x, y, n_ops)
            sync()
            cpu[name].append(c / n_ops * 1e6)
            return w / n_ops * 1e6

        def warmup() -> None:   # compiles, caches
            one()
            one()
            cpu[name].clear()
        return warmup, one

    res = Runner("chain", "us/op", False).run(names, make, rounds)
    failed = [f"{r.engine}: {r.error}" for r in res.values() if r.error]
    if failed:
        raise RuntimeError(f"chain failed: {failed}")
    lazy_w, lazy_c = res[LAZY].median, _med(cpu[LAZY])
    print(f"\nchain: {n_ops} ops on 16x16, median of {rounds} interleaved rounds\n")
    print(md_header(["engine", "wall us/op", "cpu us/op", "vs torch._lazy (wall)",
                     "vs torch._lazy (cpu)"], "lrrrr"))
    for name in names:
        w, c = res[name].median, _med(cpu[name])
        print(md_row([name, f"{w:.2f}", f"{c:.2f}", f"{w / lazy_w:.2f}x", f"{c / lazy_c:.2f}x"]))


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
    print(md_header(["layer", "cpu us"], "lr"))
    for name, v in res.items():
        print(md_row([name, f"{_med(v):.2f}"]))


def inplace(rounds: int, n: int = 200) -> None:
    """In-place ops against their functional forms (cpu us per call, eager beside): before its
    functional op, functionalization checks each in-place call on meta tensors, with Python
    reference kernels for ~700 ops (`patches/meta_checks.py` caches the verdict)."""
    def ops(d: str) -> dict[str, Callable[[], Any]]:
        x = torch.rand(64, 64).to(d) + 0.5
        y = torch.rand(64, 64).to(d)
        idx = torch.tensor([1, 2]).to(d)
        return {"clamp_(0.1, 10)": lambda: x.clamp_(0.1, 10), "clamp(0.1, 10)": lambda: y.clamp(0.1, 10),
                "pow_(1.0)": lambda: x.pow_(1.0), "pow(1.0)": lambda: y.pow(1.0),
                "add_(y, alpha=0)": lambda: x.add_(y, alpha=0.0), "add(y)": lambda: y.add(y),
                "neg_()": lambda: x.neg_(), "neg()": lambda: y.neg(),
                "addcmul_(y, y, value=0)": lambda: x.addcmul_(y, y, value=0.0),
                "index_add_(0, idx, y[:2], alpha=0)": lambda: x.index_add_(0, idx, y[:2], alpha=0.0),
                "_foreach_mul_([x, y], 1.0)": lambda: torch._foreach_mul_([x, y], 1.0)}
    per: dict[str, dict[str, list[float]]] = {}
    for d in ("cpu", "ltc:0"):
        calls = ops(d)
        per[d] = {k: [] for k in calls}
        for _ in range(rounds):
            for name, f in calls.items():
                c = _cpu()
                for _ in range(n):
                    f()
                per[d][name].append((_cpu() - c) / n * 1e6)
                if d != "cpu":
                    ltc.mark_step()
                    ltc.wait_device_ops()
    print(f"\ninplace: 64x64 float32, cpu us per call, median of {rounds} rounds of {n}\n")
    print(md_header(["op", "eager", "ltc_async"], "lrr"))
    for name in per["cpu"]:
        print(md_row([name, f"{_med(per['cpu'][name]):.1f}", f"{_med(per['ltc:0'][name]):.1f}"]))


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
    cases = suite_cases(names)
    print(f"\nmodels: cpu ms per steady step (1 intra-op thread), median of {steps} steps\n")
    print(md_header(["model", "eager", "ltc_async host", "ratio", *_PHASES,
                     "ops to __torch_dispatch__", "gc", "device execute"], "l" + "r" * (len(_PHASES) + 6)))
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
        batches = [to_device(b, "ltc:0") for b in host]
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
        print(md_row([case.name, f"{eager_ms:.2f}", f"{host_ms:.2f}", f"{host_ms / eager_ms:.2f}x",
                      *(f"{p:.2f}" for p in phases), calls[0],
                      f"{_med(gcs) * 1e3:.2f} ({sum(gcs) / steps * 1e3:.2f} mean)",
                      f"{_med(execs) * 1e3:.2f}"]), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="chain,layers,inplace,models")
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
    if "inplace" in only:
        inplace(max(3, args.rounds // 3))
    if "models" in only:
        models(args.models.split(","), args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
