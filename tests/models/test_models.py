"""Real workloads: third-party model code trained on eager CPU and on `ltc:0` side by side.

Models come from tiny `transformers` configs and PyTorch's own `nn` modules (no downloads, data
generated here).  Each case trains an eager copy and a lazy copy of the same model on the same
batches and compares the parameters at the end (dropout is off where values are compared: the
lazy device's random stream differs from the host's by contract).  A second test counts eager
fallbacks in the training step (must be 0) and graph compiles after warm-up (must be 0).
Each case prints one row (`-s` shows them): fallbacks, steady compiles, step time vs eager.

Cases that still fail are marked `xfail(strict=True)` naming the bug (issue 9): the mark must go
when the bug is fixed, or the suite fails.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ltc_async as ltc
from ltc_async.base.config import config
from ltc_async.executor import arena

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

G = torch.Generator().manual_seed(1234)

# ltc:0 backed by a GPU (LTC_ASYNC_DEVICES=cuda:0,... on a GPU machine).  (Not imported from
# conftest: the benchmarks import this module outside pytest.)
ON_CUDA = "cuda" in os.environ.get("LTC_ASYNC_DEVICES", "")


def against_cpu(rtol: float, atol: float) -> dict:
    """Tolerances for ltc:0 trained against eager *CPU* (eager CUDA's backward cannot run in a
    process that imported ltc_async: README, Known limitations).  On a CUDA-backed device the
    kernels differ from the CPU's in the last bits (other convolution algorithms, atomics in
    scatter-adds; the suite turns TF32 off: tests/conftest.py), and training steps grow that."""
    return {"rtol": max(rtol, 2e-3), "atol": max(atol, 2e-3)} if ON_CUDA else {"rtol": rtol, "atol": atol}


def _tokens(batch: int = 2, length: int = 16, vocab: int = 128) -> dict:
    ids = torch.randint(0, vocab, (batch, length), generator=G)
    return {"input_ids": ids}


def _images(classes: int = 5) -> dict:
    # a batch of 8: BatchNorm over 2 images is so ill-conditioned that eager's own result moves
    # beyond the tolerances with the number of intra-op threads
    return {"pixel_values": torch.randn(8, 3, 32, 32, generator=G),
            "labels": torch.randint(0, classes, (8,), generator=G)}


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=128, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(cfg)


def _mixtral() -> torch.nn.Module:
    # transformers' mixture of experts: its default experts path is F.grouped_mm (float32 on a
    # CPU-backed device, which PyTorch's meta kernel refuses as CUDA's does) and its router
    # counts tokens per expert with an integer torch.histc off the CPU (CUDA has it, the CPU not)
    cfg = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                     num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                                     output_router_logits=True, router_aux_loss_coef=0.02)
    return transformers.MixtralForCausalLM(cfg)


def _resnet() -> torch.nn.Module:
    cfg = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5)
    return transformers.ResNetForImageClassification(cfg)


def _mobilenet() -> torch.nn.Module:
    cfg = transformers.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=5,
                                         classifier_dropout_prob=0.0)
    return transformers.MobileNetV2ForImageClassification(cfg)


class _RNNHead(torch.nn.Module):
    def __init__(self, cell: type, bidirectional: bool, packed: bool = False) -> None:
        super().__init__()
        self.rnn = cell(8, 16, num_layers=2, bidirectional=bidirectional, batch_first=True)
        self.head = torch.nn.Linear(32 if bidirectional else 16, 3)
        self.packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            lengths = torch.tensor([5, 3, 2])
            x = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
            out, _ = self.rnn(x)
            out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        else:
            out, _ = self.rnn(x)
        return self.head(out).mean()


class _CellLoop(torch.nn.Module):
    """An LSTMCell feeding a GRUCell, stepped by hand over the sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTMCell(8, 16)
        self.gru = torch.nn.GRUCell(16, 12)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hc, g = None, None
        for t in range(x.shape[1]):
            hc = self.lstm(x[:, t], hc)
            g = self.gru(hc[0], g)
        return self.head(g).mean()


class _Checkpointed(torch.nn.Module):
    """Activation checkpointing around blocks with dropout (recomputation must redraw the
    same mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Dropout(0.0))
            for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return x.pow(2).mean()


def _autocast_loss(m: torch.nn.Module, b: dict) -> torch.Tensor:
    """The same program on both: autocast on the batch's own device type (cpu or ltc)."""
    with torch.autocast(b["x"].device.type, dtype=torch.bfloat16):
        return torch.nn.functional.cross_entropy(m(b["x"]), b["y"])


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[], dict]
    loss: Callable[[torch.nn.Module, dict], torch.Tensor]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    steps: int = 4
    accumulate: int = 1
    atol: float = 1e-5
    values_bug: str | None = None     # why the values do not match yet (strict xfail)
    steady_bug: str | None = None     # why the step still falls back or recompiles
    # On a CUDA backing, the steps whose weights are compared with eager CPU's: BatchNorm CNNs
    # amplify CUDA's last-bit differences, and after 4 steps eager CUDA's own MobileNetV2 ends
    # 0.19 from eager CPU's (`python -m benchmarks.cuda_vs_eager --all`, H200; ResNet 2e-7)
    cuda_steps: int | None = None
    # ... and its float32 tolerance there: after that one step, one conv weight of 384 ended
    # 2.4e-3 from eager CPU's (H200, fourth loan), past against_cpu's 2e-3
    cuda_tol: float | None = None
    # With the Inductor tier on (`make test-tiered`), the float32 tolerance of a model that
    # amplifies last-bit differences over its steps: Inductor rounds differently from eager
    # (MobileNetV2's first conv ended 2.6e-4 from eager after 4 steps, ResNet within 1e-5)
    tiered_tol: float | None = None


def _sgd(p: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(p, lr=0.005, momentum=0.9)   # stable: values stay comparable


def _adamw(p: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(p, lr=1e-3)


# Adam divides by sqrt(v): where a gradient is about 0, the size of its update depends on the
# last bits of the gradient (attention kernels round differently from eager's); 5e-5 is 5% of
# one step at lr 1e-3.
_ADAM_ATOL = 5e-5

CASES = [
    Case("resnet", _resnet, _images, lambda m, b: m(**b).loss, _sgd),
    Case("mobilenet_v2", _mobilenet, _images, lambda m, b: m(**b).loss, _sgd, cuda_steps=1, tiered_tol=2e-3,
         cuda_tol=5e-3),
    Case("gpt2", _gpt2, _tokens, lambda m, b: m(input_ids=b["input_ids"], labels=b["input_ids"]).loss,
         _adamw, atol=_ADAM_ATOL),
    Case("mixtral", _mixtral, _tokens,
         lambda m, b: m(input_ids=b["input_ids"], labels=b["input_ids"]).loss, _adamw, atol=_ADAM_ATOL),
    Case("bert", _bert,
         lambda: {**_tokens(), "labels": torch.randint(0, 3, (2,), generator=G)},
         lambda m, b: m(**b).loss, _adamw, atol=_ADAM_ATOL),
    Case("lstm_bidirectional", lambda: _RNNHead(torch.nn.LSTM, True),
         lambda: {"x": torch.randn(3, 5, 8, generator=G)}, lambda m, b: m(b["x"]), _sgd),
    Case("gru", lambda: _RNNHead(torch.nn.GRU, False),
         lambda: {"x": torch.randn(3, 5, 8, generator=G)}, lambda m, b: m(b["x"]), _sgd),
    Case("lstm_packed", lambda: _RNNHead(torch.nn.LSTM, False, packed=True),
         lambda: {"x": torch.randn(3, 5, 8, generator=G)}, lambda m, b: m(b["x"]), _sgd),
    Case("gru_bidirectional_packed", lambda: _RNNHead(torch.nn.GRU, True, packed=True),
         lambda: {"x": torch.randn(3, 5, 8, generator=G)}, lambda m, b: m(b["x"]), _sgd),
    Case("lstm_gru_cells", _CellLoop,
         lambda: {"x": torch.randn(3, 5, 8, generator=G)}, lambda m, b: m(b["x"]), _sgd),
    Case("grad_accumulation", _mlp,
         lambda: {"x": torch.randn(8, 16, generator=G), "y": torch.randint(0, 4, (8,), generator=G)},
         lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]), b["y"]), _sgd, accumulate=4),
    Case("autocast_bf16", _mlp,
         lambda: {"x": torch.randn(8, 16, generator=G), "y": torch.randint(0, 4, (8,), generator=G)},
         _autocast_loss, _sgd),
    Case("bf16_model", lambda: _mlp().to(torch.bfloat16),
         lambda: {"x": torch.randn(8, 16, generator=G).to(torch.bfloat16),
                  "y": torch.randint(0, 4, (8,), generator=G)},
         lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]).float(), b["y"]), _sgd),
]


def _to(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _train(case: Case, model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[dict],
           device: str | None) -> float:
    """Run the steps; returns seconds per step over the last half (steady state).

    Eager runs with the intra-op thread count of the lazy device's worker: kernels round
    differently with other thread counts, and some of these models amplify that."""
    if device is None:
        threads = torch.get_num_threads()
        torch.set_num_threads(arena.get("ltc:0").threads)
        try:
            return _train(case, model, opt, batches, "eager")
        finally:
            torch.set_num_threads(threads)
    device = None if device == "eager" else device
    times = []
    for step, batch in enumerate(batches):
        t0 = time.perf_counter()
        if step % case.accumulate == 0:
            opt.zero_grad()
        loss = case.loss(model, _to(batch, device) if device else batch) / case.accumulate
        loss.backward()
        if (step + 1) % case.accumulate == 0:
            opt.step()
        if device:
            ltc.mark_step()
            ltc.wait_device_ops()
        times.append(time.perf_counter() - t0)
    half = times[len(times) // 2:]
    return sum(half) / len(half)


def _pair(case: Case) -> tuple:
    torch.manual_seed(0)
    eager = case.build()
    lazy = copy.deepcopy(eager).to("ltc:0")
    batches = [case.batch() for _ in range(case.steps * case.accumulate)]
    return eager, lazy, batches


def _xfail(reason: str | None) -> Any:
    return pytest.mark.xfail(reason=f"issue 9: {reason}", strict=True) if reason else []


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=_xfail(c.values_bug)) for c in CASES])
def test_training_matches_eager(case: Case):
    eager, lazy, batches = _pair(case)
    if ON_CUDA and case.cuda_steps:
        batches = batches[:case.cuda_steps]
    _train(case, eager, case.optimizer(eager.parameters()), batches, None)
    tier_ups = [ltc.metrics.counter_value(c) or 0 for c in ("TierUpRun", "TierUpFailed")]
    _train(case, lazy, case.optimizer(lazy.parameters()), batches, "ltc:0")
    if "inductor" in config.tiers:   # `make test`'s tiered pass: the last steps ran on Inductor
        runs, failed = [(ltc.metrics.counter_value(c) or 0) - n
                        for c, n in zip(("TierUpRun", "TierUpFailed"), tier_ups)]
        assert runs > 0 and failed == 0, f"{case.name}: {runs} executions on the top tier, {failed} failed builds"
    tiered = bool(case.tiered_tol) and "inductor" in config.tiers
    params_tol = (case.tiered_tol, case.tiered_tol) if tiered else (1e-4, case.atol)
    buffers_tol = (case.tiered_tol, case.tiered_tol) if tiered else (1e-4, 1e-5)
    if ON_CUDA and case.cuda_tol:
        params_tol = buffers_tol = (case.cuda_tol, case.cuda_tol)
    for (name, p), q in zip(eager.named_parameters(), lazy.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **_tolerance(p, *params_tol),
                                   msg=lambda m, name=name: f"{case.name}.{name}: {m}")
    for (name, b), c in zip(eager.named_buffers(), lazy.buffers()):
        torch.testing.assert_close(c.cpu(), b, **_tolerance(b, *buffers_tol),
                                   msg=lambda m, name=name: f"{case.name}.{name}: {m}")


def _tolerance(t: torch.Tensor, rtol: float, atol: float) -> dict:
    """TorchScript runs eager's own kernels, so values match closely in every dtype.  With the
    Inductor tier on (`make test`'s tiered pass), low-precision tensors get their dtype's usual
    tolerance (torch.testing's defaults): Inductor computes bf16 / fp16 ops in float32 and
    rounds once, eager rounds after every op -- a last-bit difference, not an error."""
    if "inductor" in config.tiers and t.dtype in (torch.bfloat16, torch.float16):
        return {}
    if ON_CUDA and t.dtype in (torch.bfloat16, torch.float16):
        return {}          # CUDA's low-precision kernels round differently from the CPU's
    return against_cpu(rtol, atol)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=_xfail(c.steady_bug)) for c in CASES])
def test_training_step_has_no_fallbacks_or_recompiles(case: Case, capsys):
    eager, lazy, batches = _pair(case)
    warm = 2 * case.accumulate
    _train(case, lazy, opt := case.optimizer(lazy.parameters()), batches[:warm], "ltc:0")
    ltc.metrics.reset()
    lazy_s = _train(case, lazy, opt, batches[warm:], "ltc:0")
    fallbacks = ltc.metrics.counter_value("EagerFallback") or 0
    compiles = sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))
    eager_opt = case.optimizer(eager.parameters())
    _train(case, eager, eager_opt, batches[:warm], None)
    eager_s = _train(case, eager, eager_opt, batches[warm:], None)
    with capsys.disabled():
        print(f"\n  {case.name:20s} fallbacks {fallbacks:3d}  steady compiles {compiles:2d}  "
              f"step {lazy_s * 1e3:7.1f} ms  ({lazy_s / eager_s:5.1f}x eager, synced each step)")
    by_op = {n: ltc.metrics.counter_value(n) for n in ltc.metrics.counter_names()
             if n.startswith("EagerFallback::")}
    assert fallbacks == 0, f"{case.name}: eager fallbacks in the training step: {by_op}"
    assert compiles == 0, f"{case.name}: {compiles} compiles after warm-up"


def _generate(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0)


def test_gpt2_generate_matches_eager(capsys):
    torch.manual_seed(0)
    eager = _gpt2().eval()
    lazy = copy.deepcopy(eager).to("ltc:0")
    prompt = torch.randint(0, 128, (1, 6), generator=G)
    _generate(eager, prompt, 12)          # eager's first call warms up too
    t0 = time.perf_counter()
    want = _generate(eager, prompt, 12)
    eager_s = time.perf_counter() - t0
    ltc.metrics.reset()
    t0 = time.perf_counter()
    got = _generate(lazy, prompt.to("ltc:0"), 12)
    lazy_s = time.perf_counter() - t0
    compiles = sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))
    t0 = time.perf_counter()
    again = _generate(lazy, prompt.to("ltc:0"), 12)   # every graph cached now
    steady_s = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n  gpt2 generate 12 tokens: {compiles} compiles, {lazy_s / 12 * 1e3:.1f} ms/token "
              f"({lazy_s / eager_s:.1f}x eager); again, cached: {steady_s / 12 * 1e3:.1f} ms/token "
              f"({steady_s / eager_s:.1f}x eager, {eager_s / 12 * 1e3:.2f} ms/token)")
    assert torch.equal(got.cpu(), want)
    assert torch.equal(again.cpu(), want)


def test_gpt2_generate_compiles_a_bounded_number_of_graphs():
    torch.manual_seed(0)
    lazy = _gpt2().eval().to("ltc:0")
    # lengths 21-41: no other test compiles them (graph keys depend on shapes, not weights)
    prompt = torch.randint(0, 128, (1, 21), generator=G).to("ltc:0")
    _generate(lazy, prompt, 4)
    ltc.metrics.reset()
    _generate(lazy, prompt, 16)
    compiles = sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))
    assert compiles <= 4, f"{compiles} compiles for 12 more tokens"


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=128)     # GQA: 4 query heads, 2 KV heads
    return transformers.LlamaForCausalLM(cfg)


def _compiles() -> int:
    return sum(ltc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "CompileReuse"))


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_generate_tokens_equal_eager_and_graphs_are_reused(make):
    """Greedy decoding on the lazy path: the tokens of eager; a second call with the same prompt
    length compiles nothing; a longer prompt and as many new tokens -- cache lengths never seen
    -- compiles at most 2 graphs (its prefill, and the graph that sets up its cache positions):
    every decode graph runs the generic program of its skeleton (`executor/generic.py`), the
    last one too (the stopping criteria's `torch.full(..., is_done)` turning True is a runtime
    scalar, not a new graph)."""
    torch.manual_seed(0)
    eager = make().eval()
    lazy = copy.deepcopy(eager).to("ltc:0")
    prompt = torch.randint(1, 128, (1, 7), generator=G)
    longer = torch.randint(1, 128, (1, 9), generator=G)
    with torch.no_grad():
        assert torch.equal(_generate(lazy, prompt.to("ltc:0"), 10).cpu(), _generate(eager, prompt, 10))
        ltc.metrics.reset()
        assert torch.equal(_generate(lazy, prompt.to("ltc:0"), 10).cpu(), _generate(eager, prompt, 10))
        assert _compiles() == 0
        ltc.metrics.reset()
        assert torch.equal(_generate(lazy, longer.to("ltc:0"), 10).cpu(), _generate(eager, longer, 10))
        assert _compiles() <= 2, f"{_compiles()} compiles for a prompt of another length"
        assert (ltc.metrics.counter_value("EagerFallback") or 0) == 0


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_generate_compile_path_with_a_static_cache(make):
    """The recipe transformers gives for torch.compile (a static KV cache, `model.forward`
    compiled), with `backend="ltc"`: the tokens of eager, and a second call captures nothing new
    and compiles no graph."""
    torch.manual_seed(0)
    eager = make().eval()
    lazy = copy.deepcopy(eager).to("ltc:0")
    lazy.generation_config.cache_implementation = "static"
    lazy.forward = torch.compile(lazy.forward, backend="ltc")
    prompt = torch.randint(1, 128, (1, 6), generator=G)
    want = _generate(eager, prompt, 10)
    with torch.no_grad():
        assert torch.equal(_generate(lazy, prompt.to("ltc:0"), 10).cpu(), want)
        ltc.metrics.reset()
        assert torch.equal(_generate(lazy, prompt.to("ltc:0"), 10).cpu(), want)
    assert _compiles() == 0
    assert (ltc.metrics.counter_value("CompiledGraphCapture") or 0) == 0
    assert (ltc.metrics.counter_value("EagerFallback") or 0) == 0


# -- every model in bf16 and under autocast: forward and backward -----------------------------------
#
# A change to a shared mechanism (shape inference, decompositions, the backward pass) can break
# low precision alone (issue 16: a bf16 backward regressed with float32 runs green).  So every
# case also runs one forward and backward with its weights and float inputs in bf16, and one
# under `torch.autocast(..., dtype=torch.bfloat16)` on float32 weights, on eager CPU and on
# `ltc:0`: the loss and every gradient must agree within bf16's precision (a few units in the
# last place of bf16, relative to each gradient's scale).

def _bf16_batch(batch: dict) -> dict:
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}


def _low_precision_step(case: Case, model: torch.nn.Module, batch: dict, mode: str,
                        device: str | None) -> tuple[torch.Tensor, list]:
    if device:
        batch = _to(batch, device)
    if mode == "autocast":
        with torch.autocast(device.split(":")[0] if device else "cpu", dtype=torch.bfloat16):
            loss = case.loss(model, batch)
    else:
        loss = case.loss(model, batch)
    loss.float().backward()
    return loss.detach().float().cpu(), [p.grad for p in model.parameters()]


# eager CPU itself fails these (oneDNN has no bf16 primitive for them): nothing to compare with
_EAGER_CANNOT = {("lstm_bidirectional", "autocast"): "oneDNN: could not create a primitive "
                 "descriptor for the LSTM forward propagation primitive"}


@pytest.mark.parametrize("mode", ["bf16", "autocast"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES
                                  if c.name not in ("autocast_bf16", "bf16_model")])
def test_low_precision_forward_and_backward_match_eager(case: Case, mode: str):
    torch.manual_seed(0)
    eager = case.build()
    batch = case.batch()
    if mode == "bf16":
        eager = eager.to(torch.bfloat16)
        batch = _bf16_batch(batch)
    lazy = copy.deepcopy(eager).to("ltc:0")
    threads = torch.get_num_threads()
    torch.set_num_threads(arena.get("ltc:0").threads)
    try:
        try:
            want_loss, want = _low_precision_step(case, eager, batch, mode, None)
        except RuntimeError as e:
            # the entry must still be true with this PyTorch (another's oneDNN may have it)
            if (case.name, mode) not in _EAGER_CANNOT or "primitive descriptor" not in str(e):
                raise
            return
    finally:
        torch.set_num_threads(threads)
    got_loss, got = _low_precision_step(case, lazy, batch, mode, "ltc:0")
    torch.testing.assert_close(got_loss, want_loss, rtol=3e-2, atol=3e-2)
    for (name, _), g, w in zip(eager.named_parameters(), got, want):
        assert (g is None) == (w is None), name
        if w is None:
            continue
        assert g.dtype == w.dtype, f"{case.name}.{name}: grad dtype {g.dtype} vs eager {w.dtype}"
        scale = w.float().abs().max().item() + 1e-3
        torch.testing.assert_close(g.cpu().float(), w.float(), rtol=5e-2, atol=5e-2 * scale,
                                   msg=lambda m, name=name: f"{case.name}.{name} ({mode}): {m}")
