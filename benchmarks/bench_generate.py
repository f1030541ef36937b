"""Token-by-token inference: greedy `generate()` of tiny transformers decoders, ms per token,
eager vs ltc_async's lazy path vs its compile path, cold and warm (issue 18).

    python -m benchmarks.bench_generate [--rounds 5] [--new 32] [--only llama,gpt2] [--no-compile] [--inductor]

Models: a tiny Llama (grouped-query attention, RoPE) and a tiny GPT-2, random weights, a batch of
one 8-token prompt, `max_new_tokens=new`, `do_sample=False`.  Engines:

* `eager`: the model on `cpu` (`cuda` with `BENCH_EAGER_DEVICE=cuda`, where `ltc:0` is `cuda:0`:
  inference only, so eager CUDA runs beside ltc_async in one process);
* `ltc`: the model on `ltc:0`, traced op by op (transformers' dynamic KV cache);
* `ltc+compile`: the recipe transformers gives for torch.compile -- a static KV cache
  (`generation_config.cache_implementation = "static"`) and
  `model.forward = torch.compile(model.forward, backend="ltc")` -- on `ltc:0`;
* `inductor` (with `--inductor`): the same recipe with PyTorch's own backend on `cpu`, the
  anchor for `ltc+compile` (its first call builds C++ kernels: tens of seconds cold), on the
  eager anchor's device.

`cold` is the first `generate()` call of a fresh model copy (graph compiles included, per
token); `warm` the median over `rounds` later calls with the same prompt length, rounds of the
engines interleaved, after the ltc engines' graphs have settled on their tiers
(`engines.settle_tiers`: calls past the tier-up threshold, background builds waited for).  Also: graphs compiled by the warm calls (must be 0) and by a call with
another prompt length, and whether every engine's tokens equal eager's.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch

import ltc_async as ltc
from benchmarks.engines import EAGER_DEVICE, settle_tiers
from benchmarks.harness import log, md_header, md_row

DEV = "ltc:0"


def llama() -> torch.nn.Module:
    import transformers
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg)


def gpt2() -> torch.nn.Module:
    import transformers
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=128)
    return transformers.GPT2LMHeadModel(cfg)


MODELS = {"llama": llama, "gpt2": gpt2}


def generate(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)


def engine(name: str, base: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    model = copy.deepcopy(base)
    if name == "eager":
        return model.to(EAGER_DEVICE), EAGER_DEVICE
    if name == "inductor":
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward)
        return model.to(EAGER_DEVICE), EAGER_DEVICE
    model = model.to(DEV)
    if name == "ltc+compile":
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, backend="ltc")
    return model, DEV


def compiles() -> int:
    return sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--only", default=",".join(MODELS))
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--inductor", action="store_true", help="also PyTorch's own torch.compile recipe on cpu")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    names = ["eager", "ltc"] + ([] if args.no_compile else ["ltc+compile"]) + (["inductor"] if args.inductor else [])
    rows = []
    for model_name in args.only.split(","):
        torch.manual_seed(0)
        base = MODELS[model_name]().eval()
        prompt = torch.randint(1, 128, (1, 8), generator=torch.Generator().manual_seed(3))
        other = torch.randint(1, 128, (1, 11), generator=torch.Generator().manual_seed(4))
        runs, cold, tokens = {}, {}, {}
        for name in names:
            model, dev = engine(name, base)
            ltc.metrics.reset()
            t0 = time.perf_counter()
            with torch.no_grad():
                tokens[name] = generate(model, prompt.to(dev), args.new).cpu()
            cold[name] = (time.perf_counter() - t0) / args.new * 1e3
            runs[name] = (model, dev, [], compiles())
            log(f"{model_name} {name}: cold {cold[name]:.2f} ms/token")
            if name.startswith("ltc"):   # the steady state: past tier-ups and their trials
                with torch.no_grad():
                    settle_tiers(lambda: generate(model, prompt.to(dev), args.new), 1)
            elif name == "inductor":      # past Dynamo's recompiles of the first calls
                with torch.no_grad():
                    for _ in range(2):
                        generate(model, prompt.to(dev), args.new)
        for _ in range(args.rounds):
            for name in names:
                model, dev, times, _ = runs[name]
                ltc.metrics.reset()
                t0 = time.perf_counter()
                with torch.no_grad():
                    out = generate(model, prompt.to(dev), args.new).cpu()
                times.append((time.perf_counter() - t0) / args.new * 1e3)
                assert torch.equal(out, tokens[name])
                runs[name] = (model, dev, times, compiles() if name.startswith("ltc") else 0)
        eager_warm = statistics.median(runs["eager"][2])
        for name in names:
            model, dev, times, warm_compiles = runs[name]
            ltc.metrics.reset()
            with torch.no_grad():
                generate(model, other.to(dev), args.new)
            other_compiles = compiles() if name.startswith("ltc") else 0
            warm = statistics.median(times)
            rows.append(md_row([model_name, name, f"{cold[name]:.2f}", f"{warm:.2f}",
                                f"{warm / eager_warm:.2f}x", warm_compiles if name.startswith("ltc") else "-",
                                other_compiles if name.startswith("ltc") else "-",
                                "yes" if torch.equal(tokens[name], tokens["eager"]) else "NO"]))
            log(rows[-1])
    print(md_header(["model", "engine", "cold ms/token", "warm ms/token", "warm vs eager",
                     "compiles (warm call)", "compiles (other prompt length)", "tokens = eager"],
                    "llrrrrrl"))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
