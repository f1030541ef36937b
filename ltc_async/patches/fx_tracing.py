"""FX tracing is per thread: its flag (for Dynamo's nested-trace check) and its patches.

`torch.fx` marks "FX is tracing" with one process-wide flag (`_symbolic_trace._is_fx_tracing_flag`),
and a `torch.compile`d function called while it is set refuses to run ("Detected that you are
using FX to symbolically trace a dynamo-optimized function").  ltc_async traces on a thread of
its own: the tier-up thread turns hot graphs into FX graphs (`make_fx`, then Inductor's
AOTAutograd) while the user's thread keeps calling its compiled model.  So
`is_fx_symbolic_tracing()`, the check Dynamo reads when it wraps a compiled function, answers
for the calling thread only: true where `Tracer.trace` is running on this thread.  The flag
itself is left alone (other readers see what they always saw).

While it traces, FX also replaces functions for the whole process (`_Patcher`):
`nn.Module.__call__` and `__getattr__` (so module calls become graph nodes), and the globals
it wraps.  A module the user's thread called during a background build then ran FX's wrapper
of the *other* thread's tracer and failed ("module is not installed as a submodule": a
Qwen2 `generate()` crashed at random while a graph tiered up).  Each replacement is installed
bound to the thread that traces: on any other thread it calls what it replaced.  (Two threads
tracing at once share the first one's patches, as before; the second then traces through
module calls instead of recording them, which gives the same computation.)
"""
from __future__ import annotations

import builtins
import functools
import threading
from typing import Any, Callable

import torch
import torch.fx._symbolic_trace as _st

_tracing = threading.local()     # `depth`: Tracer.trace calls running on this thread
_patched = False


def _bound_to_this_thread(new_fn: Callable[..., Any], orig_fn: Any) -> Callable[..., Any]:
    """`new_fn` on the thread installing it, `orig_fn` on every other."""
    owner = threading.get_ident()

    @functools.wraps(new_fn)
    def on_tracing_thread(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == owner:
            return new_fn(*args, **kwargs)
        return orig_fn(*args, **kwargs)
    return on_tracing_thread


def _patch_per_thread() -> None:
    patcher = _st._Patcher
    patch_item, patch_method = patcher.patch, patcher.patch_method

    def patch(self: Any, frame_dict: dict, name: str, new_fn: Callable[..., Any], deduplicate: bool = True) -> None:
        orig = frame_dict[name] if name in frame_dict else getattr(builtins, name, None)
        if orig is not None and not getattr(orig, "__fx_already_patched", False):
            new_fn = _bound_to_this_thread(new_fn, orig)
        patch_item(self, frame_dict, name, new_fn, deduplicate)

    def method(self: Any, cls: type, name: str, new_fn: Callable[..., Any], deduplicate: bool = True) -> None:
        orig = getattr(cls, name)
        if not getattr(orig, "__fx_already_patched", False):
            new_fn = _bound_to_this_thread(new_fn, orig)
        patch_method(self, cls, name, new_fn, deduplicate)

    patcher.patch, patcher.patch_method = patch, method


def patch() -> None:
    global _patched
    if _patched:
        return
    _patch_per_thread()
    trace = _st.Tracer.trace

    def traced_on_this_thread(self: Any, *args: Any, **kwargs: Any) -> Any:
        _tracing.depth = getattr(_tracing, "depth", 0) + 1
        try:
            return trace(self, *args, **kwargs)
        finally:
            _tracing.depth -= 1

    def is_fx_symbolic_tracing() -> bool:
        return _st._is_fx_tracing_flag and getattr(_tracing, "depth", 0) > 0 \
            and not torch.compiler.is_compiling()

    _st.Tracer.trace = traced_on_this_thread
    _st.is_fx_symbolic_tracing = is_fx_symbolic_tracing
    _patched = True
