"""The set of lazy devices (LTC's `DeviceContextArena`) and the exit sequence.

Owns: the backend (loaded by name from `ltc_async_devices`; the core imports no concrete
backend), one `DeviceContext` per lazy device, created on first use from `ltc.init(...)` /
`LTC_ASYNC_DEVICES` and never replaced, and `_shutdown` (atexit), which drains and stops every
worker in order (devices, then the subscribers of `events.exit_drain` / `exit_stop`).

Locking: `_lock` (re-entrant) serializes creation; after it `_contexts` is only read, without a
lock (a list assigned once).  `started()` never creates the devices (diagnostics use it).
"""
from __future__ import annotations

import atexit
import gc
import importlib
import threading

import torch

from ..backend import Backend
from ..base import events
from ..base.config import config
from .device import DeviceContext

_lock = threading.RLock()
_contexts: list[DeviceContext] | None = None
_backend: Backend | None = None


def load_backend(name: str) -> Backend:
    """Find a backend by name: the module `ltc_async_devices.<name>` exposes `Backend`."""
    try:
        mod = importlib.import_module(f"ltc_async_devices.{name}")
    except ModuleNotFoundError as e:
        raise ValueError(f"unknown ltc_async backend {name!r} (no module ltc_async_devices.{name})") from e
    return mod.Backend()


def init(devices: list[str] | None = None, backend: str | None = None) -> list[torch.device]:
    """Configure the lazy devices (before first use).

    `devices` lists backend device entries ("cpu", "cuda:1"); several "cpu" entries give
    independent virtual CPU devices.  Raises `ValueError` naming a bad entry, and
    `RuntimeError` if devices are already in use with a different configuration.
    """
    global _contexts, _backend
    with _lock:
        be = load_backend(backend or config.backend)
        entries = list(devices) if devices is not None else (config.devices or be.default_devices())
        if not entries:
            raise ValueError("ltc_async needs at least one device entry")
        parsed = [be.parse_device(e) for e in entries]
        if _contexts is not None:
            if [c.backend_device for c in _contexts] == parsed and type(_backend) is type(be):
                return [c.device for c in _contexts]
            raise RuntimeError("ltc_async devices are already in use; call ltc.init() before the "
                               "first lazy tensor is created")
        n_cpu = sum(1 for d in parsed if d.type == "cpu")
        threads = config.cpu_threads or max(1, torch.get_num_threads() // max(1, n_cpu))
        _backend = be
        _contexts = [DeviceContext(i, be, d, threads, config.max_inflight)
                     for i, d in enumerate(parsed)]
        tune_gc(config.gc_threshold)
        return [c.device for c in _contexts]


def tune_gc(threshold: int) -> None:
    """Raise the garbage collector's young-generation threshold to `threshold` (if lower).

    A traced step keeps its IR alive until `mark_step`: thousands of container objects (nodes,
    lazy tensors, their wrappers) that outlive Python's default threshold (700 net
    allocations), so every step triggers young collections that promote them, and their
    promotion triggers full collections of the whole heap (the model, torch, transformers):
    27% of BERT's host time per lazy step, 4.9 ms of 18.7 (`benchmarks/README.md`, "The pipeline
    under load").  With 20000, a step's objects die by reference counting before a
    collection is due: no collection at all per step.  Only collection of reference *cycles*
    is deferred, by at most that many allocations; nothing is frozen or leaked.
    `LTC_ASYNC_GC_THRESHOLD=0` leaves Python's setting alone."""
    if threshold <= 0:
        return
    t0, t1, t2 = gc.get_threshold()
    if t0 < threshold:
        gc.set_threshold(threshold, t1, t2)


def started() -> list[DeviceContext]:
    """The lazy devices if they exist already, else [] (never creates them)."""
    return list(_contexts or ())


def contexts() -> list[DeviceContext]:
    """The lazy devices, created from the configuration on first use."""
    if _contexts is None:
        init()
    assert _contexts is not None
    return _contexts


def get(device: torch.device | str | int | None) -> DeviceContext:
    """The context of a lazy device (`None`: ltc:0)."""
    ctxs = _contexts if _contexts is not None else contexts()
    if device is None:
        return ctxs[0]
    if isinstance(device, int):
        index = device
    else:
        if not isinstance(device, torch.device):
            device = torch.device(device)
        if device.type != "ltc":
            raise ValueError(f"{device} is not a lazy device (expected 'ltc:N')")
        index = 0 if device.index is None else device.index
    if not 0 <= index < len(ctxs):
        raise ValueError(f"ltc:{index} does not exist: configured lazy devices are "
                         f"{', '.join(str(c.device) for c in ctxs)}")
    return ctxs[index]


def resolve(devices) -> list[DeviceContext]:
    """`None` -> all devices; a device / list of devices -> their contexts."""
    if devices is None:
        return list(contexts())
    if isinstance(devices, (str, int, torch.device)):
        return [get(devices)]
    return [get(d) for d in devices]


def backend() -> Backend:
    contexts()
    assert _backend is not None
    return _backend


def _shutdown() -> None:
    """PrepareToExit.  Queued work completes: every device queue is drained with no time
    limit, then the workers that depend on it (`events.exit_drain`: step closures), then every
    worker thread is joined (devices, then `events.exit_stop`: the closure and compiler
    workers), so no thread is inside a kernel while the interpreter finalizes (which would
    abort the process).  Ctrl-C while draining cancels what has not started yet, waits for what
    is running (a kernel cannot be interrupted) and exits cleanly."""
    if _contexts is None:
        return
    try:
        for c in _contexts:
            c.wait()
        events.exit_drain()
    except KeyboardInterrupt:
        import sys
        print("ltc_async: interrupted at exit; cancelling queued work", file=sys.stderr)
        for c in _contexts:
            c.worker.stop(timeout=0, cancel_queued=True)
    for c in _contexts:
        c.worker.stop()
    events.exit_stop()


atexit.register(_shutdown)
