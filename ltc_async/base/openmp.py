"""ltc_async's threads give their OpenMP helper threads back when they go idle.

Design note.  PyTorch's CPU kernels run their parallel regions on OpenMP (libgomp in the pip
wheels), which keeps one pool of helper threads per thread that ever opened a parallel region.
libgomp's threads spin at barriers only while the process has no more OpenMP threads than
CPUs; past that they sleep almost at once (its "throttled" spin count), so every parallel
region of every thread pays futex wake-ups.  A CPU device worker with N intra-op threads adds
N - 1 helpers beside the pool of the user's own thread: from the device's first parallel
execution on, the process had more OpenMP threads than cores, for good, and the user's eager
CPU code beside an idle ltc device ran up to 3.6x slower (a mixture-of-experts training step on
`cpu`: 1.65 ms alone, 5.9 ms once an `ltc:0` model had taken a few steps; measured on 2 cores,
`benchmarks/README.md`, "OpenMP helpers of an idle device").

So a `Worker` thread that has been idle for `config.omp_idle_s` (20 ms; `LTC_ASYNC_OMP_IDLE`)
calls `release()`: OpenMP 5.0's `omp_pause_resource_all(omp_pause_soft)`, which in libgomp frees
the *calling* thread's pool (its helpers exit) and nothing else.  Why not at once: the next
parallel region starts the helpers again, and a new thread waits for the scheduler to give it
a slice (Linux starts new threads behind running ones); a generate() loop whose worker went idle
between tokens for ~3 ms and released each time took 4.8 ms per token in executions instead of
0.7 ms.  Gaps that short keep the pool; a device really done for now gives it back.  Only
libgomp: Intel's and LLVM's runtimes implement the call as a pause of the whole runtime, which
must not happen while another thread is inside a parallel region; there `release` does nothing.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

_OMP_PAUSE_SOFT = 1


@functools.lru_cache(maxsize=None)
def _pause() -> Any:
    """libgomp's `omp_pause_resource_all`, as loaded by torch, or None."""
    try:
        import torch  # noqa: F401 - loads the OpenMP runtime the kernels use
        # PyDLL: the call keeps the GIL (a few microseconds).  Through CDLL it let the GIL go,
        # and taking it back made the idle worker wait for the tracing thread's switch
        # interval (up to 5 ms) before it could start the next execution
        loaded = ctypes.PyDLL(None)
    except Exception:  # noqa: BLE001 - no process-wide symbol lookup here (Windows): nothing to do
        return None
    fn = getattr(loaded, "omp_pause_resource_all", None)
    if fn is None or not hasattr(loaded, "GOMP_parallel") or hasattr(loaded, "kmp_set_blocktime"):
        return None     # no OpenMP, or not libgomp (Intel / LLVM libomp also export GOMP_*)
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def release() -> None:
    """Free the calling thread's OpenMP helper threads (see the module note); never raises."""
    fn = _pause()
    if fn is not None:
        fn(_OMP_PAUSE_SOFT)
