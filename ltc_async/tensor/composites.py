"""Composite ops traced whole when autograd has nothing to record.

Design note.  `linear`, `matmul` and `scaled_dot_product_attention` have no kernels of their
own in PyTorch: they are *composite* (`CompositeImplicitAutograd`), and the dispatcher runs
their decomposition at the autograd key, so a lazy tensor receives its parts.  That is what
autograd needs (it records each part's derivative), but where nothing is recorded it only
costs: every part is one more traced op, with its own output tensor, shape lookup and node.
On tiny Llama's token-by-token `generate()` (no grad), measured per call on the tracing thread:

| op (a 1-token step) | parts traced | us per call, decomposed | traced whole |
|---|---|---:|---:|
| `F.linear` of a 3-d input | `view_copy`, `t_copy`, `mm`, `_unsafe_view` | 37 | 9 |
| `F.scaled_dot_product_attention` | 15 (the math path: `mul`, `expand_copy`, `view_copy`, `bmm`, `_safe_softmax`, ...) | 119 | 17 |

(an elementwise `x + x` costs 6; `benchmarks/README.md`, "Composite ops traced whole").  And
the attention's whole node runs as eager runs it: the device's own kernel (CPU's flash
attention, CUDA's choice of kernels), where its parts were the math path that no device picks
for eager.

So these ops get a kernel for `AutogradPrivateUse1` (only ltc tensors reach it): when autograd
has nothing to record (no grad mode or no input requiring grad, no forward-AD level, no
`torch.func` transform), the op goes below autograd whole -- through functionalization to the
op path, one node.  Otherwise, and under a Python dispatch mode (which must see what it sees
in eager: `FlopCounterMode` counts `mm`, selective checkpointing records the parts), it takes
PyTorch's decomposition, as before.  An attention with dropout draws random numbers inside the
device's kernel, which the lazy RNG could not replay: it is decomposed too.  The Inductor tier
gets the parts anyway: its `make_fx` trace decomposes composite ops as `torch.compile`'s would.

An attention autograd records takes, on a CPU-backed device, the op eager's CPU takes: ATen
asks the device for its fused kernel (`_fused_sdp_choice`), and on the CPU that is
`_scaled_dot_product_flash_attention_for_cpu` for most calls, an op with its own derivative
(one backward op).  A lazy device has no such choice, so eager's path was the math
decomposition's ~15 forward and ~20 backward ops, and values that drift from eager's in
training (a causal attention block under AdamW: 7e-4 after 3 steps).  Here the CPU's own
choice is asked on CPU stand-ins of the call (cached per signature, with the user's
`sdpa_kernel` switches), and where it picks flash attention the call becomes that op with the
mask converted as ATen converts it.  (`_choices` is a plain dict: two threads meeting a new
signature at once both ask, and store the same answer.)  On a CUDA-backed device the choice
(flash, memory-efficient or cuDNN kernels, with their RNG state outputs) is not mirrored:
autograd gets the decomposition.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..base import counters
from ..executor import arena
from ..ir.schema import op_info
from .decompositions import records_autograd
from .dispatch import register_handlers
from .trace import trace

_fwd_ad = torch.autograd.forward_ad
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_level = torch._C._functorch.peek_interpreter_stack   # `torch.func` transforms
_below_autograd = torch._C._AutoDispatchBelowAutograd
aten = torch.ops.aten


def _decomposition(op: Any) -> Callable[..., Any]:
    """`op.decompose`, bound once: the op's composite kernel (what the dispatcher runs for it
    without this module).  `OpOverload.decompose` looks the kernel up by name every call: 3 us."""
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    if key in op.py_kernels:
        return op.py_kernels[key]
    return functools.partial(op._op_dk, key)


def _seen_in_parts() -> bool:
    """A Python dispatch mode, a forward-AD level or a `torch.func` transform: the call takes
    PyTorch's decomposition, as in eager (module note)."""
    return bool(_dispatch_modes()) or _fwd_ad._current_level >= 0 or _functorch_level() is not None


def _whole(op: Any) -> Callable[..., Any]:
    decompose = _decomposition(op)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if _seen_in_parts() or records_autograd(args) or records_autograd(kwargs.values()):
            return decompose(*args, **kwargs)
        with _below_autograd():
            return op(*args, **kwargs)
    return kernel


# -- attention recorded by autograd: the CPU's fused kernel --------------------------------------

_FLASH = 1   # `sdp::SDPBackend::flash_attention`
_NEG_INF = float("-inf")
_choices: dict[tuple, bool] = {}
_switches = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.math_sdp_enabled,
             torch.backends.cuda.mem_efficient_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)


def _layout(t: Any) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.requires_grad)


def _stand_in(layout: tuple | None) -> torch.Tensor | None:
    """A CPU tensor of `layout`'s sizes, dtype and last stride, over one row of memory: the
    choice reads no more (sizes, dtypes, the last dim's stride, requires_grad), and a full-size
    stand-in of a large model's attention would allocate hundreds of megabytes."""
    if layout is None:
        return None
    shape, stride, dtype, requires_grad = layout
    if not shape:
        return torch.empty((), dtype=dtype).requires_grad_(requires_grad)
    n, last = shape[-1], stride[-1]
    row = torch.empty((n - 1) * last + 1 if n else 0, dtype=dtype)
    return row.as_strided(shape, (0,) * (len(shape) - 1) + (last,)).requires_grad_(requires_grad)


def _cpu_picks_flash(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: Any, gqa: bool) -> bool:
    """Whether eager's CPU would run this call (dropout off) as its flash attention kernel."""
    key = (_layout(q), _layout(k), _layout(v), _layout(mask), is_causal, scale, gqa,
           tuple(f() for f in _switches))
    picks = _choices.get(key)
    if picks is None:
        with torch.no_grad():   # stand-ins on the CPU, where the choice's rules live
            choice = torch._fused_sdp_choice(*(_stand_in(x) for x in key[:4]), 0.0, is_causal,
                                             scale=scale, enable_gqa=gqa)
        picks = _choices[key] = choice == _FLASH
    return picks


def _attention() -> Callable[..., Any]:
    op = aten.scaled_dot_product_attention.default
    decompose = _decomposition(op)
    flash = aten._scaled_dot_product_flash_attention_for_cpu.default

    def kernel(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, *, scale: Any = None, enable_gqa: bool = False) -> Any:
        args = (query, key, value, attn_mask, dropout_p, is_causal)
        kwargs = {"scale": scale, "enable_gqa": enable_gqa}
        if _seen_in_parts() or dropout_p != 0.0:   # dropout: drawn by the lazy generator
            return decompose(*args, **kwargs)
        if not records_autograd(args):
            with _below_autograd():
                return op(*args, **kwargs)
        if query.device.type != "ltc" or arena.get(query.device).backend_device.type != "cpu" or \
                not _cpu_picks_flash(query, key, value, attn_mask, is_causal, scale, enable_gqa):
            return decompose(*args, **kwargs)
        if attn_mask is not None and attn_mask.dtype == torch.bool:   # ATen's conversion
            attn_mask = torch.where(attn_mask.logical_not(), _NEG_INF,
                                    torch.scalar_tensor(0.0, dtype=query.dtype, device=attn_mask.device))
        return flash(query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]
    return kernel


def _flash_for_cpu(func: Any, args: tuple, kwargs: dict) -> Any:
    """`_scaled_dot_product_flash_attention_for_cpu` traced as itself.  Tagged as drawing random
    numbers (for a dropout its CPU kernel refuses anyway), it would take PyTorch's decomposition
    of random ops, and that one (export's) returns the attention weights where the op returns
    its logsumexp: the backward op, which reads it, then computed wrong gradients."""
    info = op_info(func)
    counters.counter(info.counter)
    return trace(func, info, info.bind(args, kwargs))


register_handlers({aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_for_cpu})

_libs: list = []


def register() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("linear", _whole(aten.linear.default), "AutogradPrivateUse1")
    lib.impl("matmul", _whole(aten.matmul.default), "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", _attention(), "AutogradPrivateUse1")
    _libs.append(lib)
