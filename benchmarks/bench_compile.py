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

Usage (from the repository root):
  python -m benchmarks.bench_compile                 # all cases
  python -m benchmarks.bench_compile --only mlp --rounds 9 --steps 100
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks import engines
from benchmarks.cases import mlp, sgd, to_device
from benchmarks.engines import COMPILE, EAGER, LTC, LTC_COMPILE
from benchmarks.harness import Runner, log, md_header, md_row, median, time_steps

# this benchmark's names for the engines (its CLI choices and columns); inductor+opt also
# compiles the optimizer's step
ENGINES = {"eager": EAGER, "ltc": LTC, "ltc+compile": LTC_COMPILE, "inductor": COMPILE,
           "inductor+opt": COMPILE}


# -- cases ------------------------------------------------------------------------------------

def _mlp_case() -> tuple[Callable[[], nn.Module], Callable[[], dict], Callable, Callable]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return mlp([64, 256, 256, 10])

    def batch() -> dict:
        g = torch.Generator().manual_seed(1)
        return {"x": torch.randn(64, 64, generator=g), "y": torch.randint(0, 10, (64,), generator=g)}

    def loss(model: Any, b: dict) -> torch.Tensor:
        return nn.functional.cross_entropy(model(b["x"]), b["y"])

    return build, batch, loss, sgd


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


def _suite_case(name: str) -> tuple:
    """A case of the real-workload suite (`tests/models/test_models.py`: its model, batch, loss
    and optimizer), e.g. its CNNs."""
    from benchmarks.cases import suite_cases
    case, = suite_cases([name])
    return case.build, case.batch, case.loss, case.optimizer


CASES = {"mlp": _mlp_case, "gpt2": lambda: _transformers_case("gpt2"),
         "bert": lambda: _transformers_case("bert"),
         "resnet": lambda: _suite_case("resnet"), "mobilenet_v2": lambda: _suite_case("mobilenet_v2")}


# -- engines ----------------------------------------------------------------------------------

def make(engine: str, case: tuple) -> tuple[Callable[[], torch.Tensor], Callable[[], None]]:
    """(step, wait) for one engine on one case."""
    build, batch, loss_fn, make_opt = case
    eng = engines.get(ENGINES[engine])
    model = build().to(eng.device)
    opt = make_opt(model.parameters())
    fwd = eng.compile(model)
    opt_step = eng.compile(opt.step) if engine in ("ltc+compile", "inductor+opt") else opt.step
    b = to_device(batch(), eng.device)
    mark = eng.mark_step

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(fwd, b)
        loss.backward()
        opt_step()
        mark()
        return loss
    return step, eng.wait


def run_case(name: str, names: list[str], rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    case = CASES[name]()
    losses: dict[str, float] = {}

    def make_round(e: str):
        step, wait = make(e, case)

        def warm() -> None:
            for _ in range(warmup):
                loss = step()
            wait()
            losses[e] = float(loss.detach().cpu())
            log(f"[{name}] {e}: loss {losses[e]:.6f}")
        return warm, lambda: time_steps(step, steps, wait) * 1e3

    results = Runner(name, "ms/step", False, collect=False,
                     counter=lambda e: engines.recompiles(ENGINES[e])).run(names, make_round, rounds)
    ref = losses.get("eager")
    for e, v in losses.items():
        if ref is not None and abs(v - ref) > 1e-3 * max(1.0, abs(ref)):
            log(f"[{name}] WARNING: {e}'s loss after warm-up {v} differs from eager's {ref}")
    new = sum(r.recompiles_in_timing or 0 for r in results.values())
    if new:
        log(f"[{name}] WARNING: {new} ltc compiles during the timed rounds")
    return {e: r.samples for e, r in results.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=sorted(CASES))
    p.add_argument("--engine", action="append", choices=list(ENGINES), help="default: all but inductor+opt")
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
    names = args.engine or [e for e in ENGINES if e != "inductor+opt" or args.inductor_opt]
    from ltc_async.executor import (
        arena,  # lazy: the eager anchors may run without ltc_async
    )
    torch.set_num_threads(arena.get("ltc:0").threads)   # eager and Inductor: the worker's threads
    results = {name: run_case(name, names, args.rounds, args.steps, args.warmup)
               for name in (args.only or list(CASES))}
    print(f"\nms/step, median of {args.rounds} rounds of {args.steps} steps [min]; "
          f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print(md_header(["case", *names, "ltc+compile / eager"], "l" + "r" * (len(names) + 1)))
    for name, samples in results.items():
        cells = []
        for e in names:
            s = samples.get(e)
            cells.append(f"{median(s):.3f} [{min(s):.3f}]" if s else "failed")
        ratio = ""
        if samples.get("ltc+compile") and samples.get("eager"):
            ratio = f"{median(samples['ltc+compile']) / median(samples['eager']):.2f}x"
        print(md_row([name, *cells, ratio]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
