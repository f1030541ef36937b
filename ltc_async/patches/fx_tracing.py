"""FX tracing is per thread (for Dynamo's nested-trace check).

`torch.fx` marks "FX is tracing" with one process-wide flag (`_symbolic_trace._is_fx_tracing_flag`),
and a `torch.compile`d function called while it is set refuses to run ("Detected that you are
using FX to symbolically trace a dynamo-optimized function").  ltc_async traces on a thread of
its own: the tier-up thread turns hot graphs into FX graphs (`make_fx`, then Inductor's
AOTAutograd) while the user's thread keeps calling its compiled model.  So
`is_fx_symbolic_tracing()`, the check Dynamo reads when it wraps a compiled function, answers
for the calling thread only: true where `Tracer.trace` is running on this thread.  The flag
itself is left alone (other readers see what they always saw).
"""
from __future__ import annotations

import threading
from typing import Any

import torch
import torch.fx._symbolic_trace as _st

_tracing = threading.local()     # `depth`: Tracer.trace calls running on this thread
_patched = False


def patch() -> None:
    global _patched
    if _patched:
        return
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
