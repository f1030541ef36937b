#!/usr/bin/env python
"""Steady training step with `torch.compile(..., backend="ltc")` vs eager, uncompiled ltc_async
and Inductor (`torch.compile` default backend), in one process.

Cases (select with --only, repeatable; default: all):
  mlp   64-256-256-10, batch 64, cross entropy, SGD(lr=0.01, momentum=0.9) (bench_lazy's case)
  gpt2  tiny GPT-2 from a transformers config (2 layers, width 64, 4 heads, vocab 128),
        batch 2 x 16 tokens, LM loss, AdamW(lr=1e-3) (--optimizer sgd: SGD with momentum;
        --optimizer adamw-fused: AdamW(fused=True), one `_fused_adamw_` kernel per step)
  bert  tiny BERT for sequence classification (2 layers, width 64), batch 2 x 16, AdamW

Engines:
  eager        the model on the CPU, nothing compiled
  ltc          the model on ltc:0, nothing compiled (one Python dispatch per op)
  ltc+compile  torch.compile(model, backend="ltc") and torch.compile(opt.step, backend="ltc")
  inductor     torch.compile(model) on the CPU (the optimizer uncompiled, as usually run)
  inductor+opt torch.compile(model) and torch.compile(opt.step) on the CPU (--inductor-opt:
               compiling the optimizer takes minutes here)

A step is `zero_grad(); loss = ...; loss.backward(); step(); mark_step()` (no mark_step on the
CPU); a round runs N steps back to back and waits for the device once at the end: wall time /
N, so for ltc_async it is pipelined throughput (tracing step N+1 while step N runs).  Rounds
of the engines are interleaved so that a noisy machine slows them alike; medians are reported
(min in brackets).  Eager runs with as many intra-op threads as the ltc device worker.

Usage:
  python benchmarks/bench_compile.py                 # all cases
  python benchmarks/bench_compile.py --only mlp --rounds 9 --steps 100
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import ltc_async as ltc
from ltc_async.executor import arena

ENGINES = ["eager", "ltc", "ltc+compile", "inductor", "inductor+opt"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- cases ------------------------------------------------------------------------------------

def _mlp_case() -> tuple[Callable[[], nn.Module], Callable[[], dict], Callable, Callable]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, 10))

    def batch() -> dict:
        g = torch.Generator().manual_seed(1)
        return {"x": torch.randn(64, 64, generator=g), "y": torch.randint(0, 10, (64,), generator=g)}

    def loss(model: Any, b: dict) -> torch.Tensor:
        return nn.functional.cross_entropy(model(b["x"]), b["y"])

    def opt(params: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return build, batch, loss, opt


OPTIMIZER = "adamw"   # --optimizer: what the transformer cases train with


def _transformers_case(name: str) -> tuple:
    import transformers
    transformers.logging.set_verbosity_error()

    def build() -> nn.Module:
        torch.manual_seed(0)
        if name == "gpt2":
            cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
            model = transformers.GPT2LMHeadModel(cfg)
            # named: transformers otherwise logs a warning inside forward, a graph break for
            # every torch.compile backend
            model.loss_type = "ForCausalLM"
            return model
        cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=128, num_labels=3,
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return transformers.BertForSequenceClassification(cfg)

    def batch() -> dict:
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 128, (2, 16), generator=g)
        return {"input_ids": ids, "labels": ids if name == "gpt2" else torch.randint(0, 3, (2,), generator=g)}

    def loss(model: Any, b: dict) -> torch.Tensor:
        return model(**b).loss

    def opt(params: Any) -> torch.optim.Optimizer:
        if OPTIMIZER == "sgd":
            return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
        if OPTIMIZER == "adamw-fused":
            return torch.optim.AdamW(params, lr=1e-3, fused=True)
        return torch.optim.AdamW(params, lr=1e-3)   # fused=False would also turn foreach off
    return build, batch, loss, opt


CASES = {"mlp": _mlp_case, "gpt2": lambda: _transformers_case("gpt2"),
         "bert": lambda: _transformers_case("bert")}


# -- engines ----------------------------------------------------------------------------------

def make(engine: str, case: tuple) -> tuple[Callable[[], torch.Tensor], Callable[[], None]]:
    """(step, wait) for one engine on one case."""
    build, batch, loss_fn, make_opt = case
    on_ltc = engine.startswith("ltc")
    device = "ltc:0" if on_ltc else "cpu"
    model = build().to(device)
    opt = make_opt(model.parameters())
    fwd: Any = model
    opt_step = opt.step
    if engine == "ltc+compile":
        fwd = torch.compile(model, backend="ltc")
        opt_step = torch.compile(opt.step, backend="ltc")
    elif engine.startswith("inductor"):
        fwd = torch.compile(model)
        if engine == "inductor+opt":
            opt_step = torch.compile(opt.step)
    b = {k: v.to(device) for k, v in batch().items()}
    mark = ltc.mark_step if on_ltc else (lambda: None)
    wait = ltc.wait_device_ops if on_ltc else (lambda: None)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(fwd, b)
        loss.backward()
        opt_step()
        mark()
        return loss
    return step, wait


def run_case(name: str, engines: list[str], rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    case = CASES[name]()
    ready: dict[str, tuple] = {}
    losses: dict[str, float] = {}
    for e in engines:
        try:
            step, wait = make(e, case)
            t0 = time.perf_counter()
            for _ in range(warmup):
                loss = step()
            wait()
            losses[e] = float(loss.detach().cpu())
            _log(f"[{name}] {e}: warm-up {time.perf_counter() - t0:.1f}s, loss {losses[e]:.6f}")
            ready[e] = (step, wait)
        except Exception as exc:  # noqa: BLE001 - report, go on with the other engines
            _log(f"[{name}] {e} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    ref = losses.get("eager")
    for e, v in losses.items():
        if ref is not None and abs(v - ref) > 1e-3 * max(1.0, abs(ref)):
            _log(f"[{name}] WARNING: {e}'s loss after warm-up {v} differs from eager's {ref}")
    samples: dict[str, list[float]] = {e: [] for e in ready}
    compiles = ltc.metrics.counter_value("UncachedCompile") or 0
    for r in range(rounds):
        for e, (step, wait) in ready.items():
            wait()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            wait()
            samples[e].append((time.perf_counter() - t0) / steps * 1e3)
        _log(f"[{name}] round {r + 1}/{rounds}: " + ", ".join(f"{e}={s[-1]:.3f}" for e, s in samples.items()))
    new = (ltc.metrics.counter_value("UncachedCompile") or 0) - compiles
    if new:
        _log(f"[{name}] WARNING: {new} ltc compiles during the timed rounds")
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=sorted(CASES))
    p.add_argument("--engine", action="append", choices=ENGINES, help="default: all but inductor+opt")
    p.add_argument("--inductor-opt", action="store_true", help="also compile the optimizer with Inductor")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--optimizer", choices=["adamw", "adamw-fused", "sgd"], default="adamw",
                   help="the transformer cases' optimizer (the MLP always uses SGD with momentum)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval(s) first (CPython's default: 0.005)")
    args = p.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    global OPTIMIZER
    OPTIMIZER = args.optimizer
    engines = args.engine or [e for e in ENGINES if e != "inductor+opt" or args.inductor_opt]
    torch.set_num_threads(arena.get("ltc:0").threads)   # eager and Inductor: the worker's threads
    results = {name: run_case(name, engines, args.rounds, args.steps, args.warmup)
               for name in (args.only or list(CASES))}
    print(f"\nms/step, median of {args.rounds} rounds of {args.steps} steps [min]; "
          f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print("| case | " + " | ".join(engines) + " | ltc+compile / eager |")
    print("|---|" + "---:|" * (len(engines) + 1))
    for name, samples in results.items():
        cells = []
        for e in engines:
            s = samples.get(e)
            cells.append(f"{statistics.median(s):.3f} [{min(s):.3f}]" if s else "failed")
        ratio = ""
        if samples.get("ltc+compile") and samples.get("eager"):
            ratio = f"{statistics.median(samples['ltc+compile']) / statistics.median(samples['eager']):.2f}x"
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
