"""ltc_async: an asynchronous, multi-device lazy tensor engine for PyTorch, in Python.

`import ltc_async as ltc` registers the `ltc` device; ordinary PyTorch code on `ltc:N` tensors
records IR, `ltc.mark_step()` queues the graph on the device and returns while it runs.
See README.md and API.md for the contract.
"""
from __future__ import annotations

from . import debug, metrics
from .aio import mark_step_async, sync_async, to_cpu_async, wait_device_ops_async
from .api import (
                  add_step_closure,
                  backend_device,
                  devices,
                  init,
                  mark_step,
                  sync,
                  to_cpu,
                  wait_device_ops,
)
from .compile import register as _register_compile
from .diagnostics.recompiles import RecompileWarning
from .diagnostics.sync_guard import (
                  UnexpectedSyncError,
                  UnexpectedSyncWarning,
                  sync_guard,
)
from .executor.futures import ComputationError, ExecutionError
from .patches.registration import register as _register

_register()
_register_compile()   # torch.compile(..., backend="ltc")

__all__ = [
    "init", "devices", "backend_device",
    "mark_step", "wait_device_ops", "sync", "to_cpu", "add_step_closure",
    "mark_step_async", "wait_device_ops_async", "sync_async", "to_cpu_async",
    "metrics", "debug", "ExecutionError", "ComputationError",
    "sync_guard", "RecompileWarning", "UnexpectedSyncWarning", "UnexpectedSyncError",
]
__version__ = "0.1.0"
