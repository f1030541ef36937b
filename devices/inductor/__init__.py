"""The Inductor tier: a cut ltc graph compiled by `torch._inductor` (issue 19).

Design note.  A backend's quick tier (TorchScript) compiles a graph in milliseconds; Inductor
takes seconds (it generates and builds C++/OpenMP kernels on CPU, Triton on CUDA) and its
programs run the graph's small ops fused.  The executor (`ltc_async/executor/tiers.py`) builds
this tier in the background for graphs that have run often, and swaps it in when ready.

How a graph becomes an Inductor program:

1. the IR interpreter over the cut graph (`Interpreter(order, roots, device)`: structure and
   constants only, no node objects kept) is traced by `make_fx` in fake mode, on stand-ins
   with the graph inputs' shapes, strides and dtypes: an FX graph of exactly the aten ops the
   IR holds (captured `torch.compile` bodies included: they run through their own
   interpreter);
2. the graph's runtime scalars (an optimizer's learning rate, a loss scale) are Python numbers,
   which `make_fx` bakes into the FX graph as constants; the program therefore serves the
   executions whose scalars equal those it was built with (`InductorProgram.accepts`), and the
   executor only builds it for a graph whose scalars were the same over the runs that made it
   hot;
3. `torch._inductor.compile(gm, example_inputs)` builds it, in-process
   (`compile_threads=1`: no compiler worker processes to orphan at exit; C++ builds are
   `g++` subprocesses that end with their build).

Graphs drawing random numbers are not built (their seeds are runtime inputs that `make_fx`
cannot take; Inductor would also draw other numbers): they stay on the quick tier.
Inductor's own on-disk caches (`TORCHINDUCTOR_CACHE_DIR`, FX graph cache) make a second process
build the same graphs quickly.

Threads: `build` runs on the executor's tier-up thread, never on a tracing thread or a device
worker; `InductorProgram.execute` runs on the device worker, like any `Computation`.
"""
from __future__ import annotations

import functools
import shutil
from typing import Any, Sequence

import torch

from ltc_async.backend import Computation
from ltc_async.ir.interpreter import Interpreter
from ltc_async.ir.node import DEVICE_DATA, RNG, Node, Tag, TensorMeta


@functools.lru_cache(maxsize=None)
def available(device_type: str) -> str | None:
    """None when Inductor can build kernels for `device_type` here, else why not."""
    try:
        import torch._inductor  # noqa: F401 - the import is the check
    except Exception as e:  # noqa: BLE001 - any import failure means no Inductor
        return f"torch._inductor does not import ({type(e).__name__}: {e})"
    if device_type == "cpu":
        if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
            return "no C++ compiler on PATH"
        return None
    if device_type == "cuda":
        try:
            import triton  # noqa: F401
        except Exception:  # noqa: BLE001
            return "triton is not installed"
        return None
    return f"no Inductor target for {device_type!r}"


def eligible(order: list[Node]) -> str | None:
    """None when the graph can be built by this tier, else why not (stays on the quick tier)."""
    for n in order:
        if n.op is DEVICE_DATA:
            continue
        if any(type(e) is tuple and e and type(e[0]) is Tag and e[0] is RNG for e in n.template):
            return "draws random numbers"
        sub = getattr(n.op, "ops", None)        # a captured torch.compile body
        if sub is not None and eligible(sub) is not None:
            return "draws random numbers"
    return None


class InductorProgram(Computation):
    """A graph's Inductor program; takes the graph's inputs in the quick tier's order."""

    def __init__(self, fn: Any, tensor_slots: list[int], scalars: tuple, text: str) -> None:
        self.fn = fn
        self.tensor_slots = tensor_slots    # positions of the tensor inputs among all inputs
        self.scalars = scalars              # the non-tensor inputs it was built with (baked)
        self.backend_text = text

    def accepts(self, inputs: Sequence[Any]) -> bool:
        return scalars_of(inputs, self.tensor_slots) == self.scalars

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        return list(self.fn([inputs[i] for i in self.tensor_slots]))


def scalars_of(inputs: Sequence[Any], tensor_slots: list[int]) -> tuple:
    slots = set(tensor_slots)
    return tuple((type(v), v) for i, v in enumerate(inputs) if i not in slots)


def build(interp: Interpreter, device: torch.device, inputs: Sequence[Any]) -> InductorProgram:
    """Compile the graph `interp` replays (see the module note).  `inputs`: one execution's
    inputs, where tensors may be replaced by their `TensorMeta` (only their layout is used)."""
    from torch._inductor import config as inductor_config
    from torch.fx.experimental.proxy_tensor import make_fx

    slots = [i for i, v in enumerate(inputs) if isinstance(v, (torch.Tensor, TensorMeta))]
    scalars = scalars_of(inputs, slots)
    values = list(inputs)

    def graph(*tensors: torch.Tensor) -> list[torch.Tensor]:
        vals = list(values)
        for i, t in zip(slots, tensors):
            vals[i] = t
        return interp.execute(vals)

    examples = [_example(inputs[i], device) for i in slots]
    with torch.no_grad():
        gm = make_fx(graph, tracing_mode="fake")(*examples)
        with inductor_config.patch(compile_threads=1):
            fn = torch._inductor.compile(gm, examples)
    return InductorProgram(_boxed(fn), slots, scalars, gm.code)


def _example(v: Any, device: torch.device) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    m: TensorMeta = v
    return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=device)


def _boxed(fn: Any) -> Any:
    """Inductor's callable takes positional tensors; the program calls it with a list."""
    return lambda tensors: fn(*tensors)
