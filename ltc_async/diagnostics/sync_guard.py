"""`ltc.sync_guard`: implicit device-to-host syncs warn or raise.

Design note.  A lazy program runs fast when the host traces step N+1 while the device runs
step N; any read of a device value in between (`loss.item()` for a log line, `if t > 0:`,
`print(t)`, an op that falls back to eager on device data) makes the host wait for the device
and the overlap is gone.  `torch.cuda.set_sync_debug_mode` is the model: a mode says what such
an *implicit* sync does -- "allow" (default), "warn" (`UnexpectedSyncWarning` at the user's
line) or "raise" (`UnexpectedSyncError`, before anything is read).  *Explicit* reads are always
allowed: `t.cpu()`, `t.to("cpu")`, `ltc.to_cpu`, `ltc.sync`, `mark_step`, `wait_device_ops`,
and reads inside step closures (`ltc.add_step_closure`, the recommended place for them).

Where syncs are seen:

* `.item()`, `bool(t)`, `float(t)`, `int(t)`, `operator.index(t)`, `.tolist()`, `repr`/`print`
  and `format(t)` are Python methods of `torch.Tensor`; while a guard is armed (any mode other
  than "allow" was ever set) they are wrapped to name themselves.  Installed on first arming
  only, so a program that never uses the guard pays nothing;
* ops returning Python values (`_local_scalar_dense`, `equal`: `host.host_op`) and eager
  fallbacks reading lazy tensors (`host.eager_fallback`) publish `events.host_read` /
  `events.fallback` on every occurrence (slow paths already); this module subscribes, and
  also records them for the findings of `ltc.metrics.report()`.  Step closures run wrapped by
  `events.explicit_reads` (subscribed here: `exempt`).  A wrapped method marks its thread (`_tls.depth`) so the
  op it leads to is not reported twice.

Scope (thread and trio safety).  Called plainly, `ltc.sync_guard("warn")` sets the process-wide
mode (`LTC_ASYNC_SYNC_GUARD` sets it at import).  Used as a context manager, the mode holds for
the block in the current thread or trio task only (a `ContextVar`: other threads and tasks keep
theirs), and the previous mode is back on exit; blocks nest.  `_lock` guards the process-wide
mode and the one-time install of the wrappers; it is a leaf lock.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ..base import events
from ..base.config import config
from ..tensor.lazy_tensor import LtcTensor
from . import findings, location

__all__ = ["UnexpectedSyncError", "UnexpectedSyncWarning", "mode", "sync_guard"]

MODES = ("allow", "warn", "raise")


class UnexpectedSyncWarning(UserWarning):
    """An implicit device-to-host sync under `ltc.sync_guard("warn")`.  `.what` names the op,
    `.where` the user's `file:line (function)`."""

    what: str = ""
    where: str = ""


class UnexpectedSyncError(RuntimeError):
    """An implicit device-to-host sync under `ltc.sync_guard("raise")` (raised before anything
    is read).  `.what` names the op, `.where` the user's `file:line (function)`."""

    what: str = ""
    where: str = ""


def _checked(mode: Any, source: str = "sync_guard") -> str:
    if mode not in MODES:
        raise ValueError(f"{source}: unknown mode {mode!r}; use 'allow', 'warn' or 'raise'")
    return mode


_lock = threading.Lock()
_global = _checked(config.sync_guard, "LTC_ASYNC_SYNC_GUARD")
_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar("ltc_sync_guard", default=None)
_exempt: contextvars.ContextVar[bool] = contextvars.ContextVar("ltc_sync_exempt", default=False)
_open_blocks = 0
#: True once a mode other than "allow" may apply somewhere: the hooks short-circuit on it
armed = False
_installed = False
_tls = threading.local()   # .depth: inside a wrapped Tensor method (its sync is reported)


def mode() -> str:
    """The mode in force for the calling thread or trio task."""
    m = _scoped.get()
    return _global if m is None else m


def _rearm() -> None:
    """Under `_lock`: recompute `armed`, install the method wrappers on first arming."""
    global armed, _installed
    armed = _global != "allow" or _open_blocks > 0
    if armed and not _installed:
        _install()
        _installed = True


class _Guard:
    """What `sync_guard(mode)` returns: the mode is set already; `with` scopes it."""

    def __init__(self, new: str) -> None:
        global _global
        self.mode = new
        with _lock:
            self._prev = _global
            _global = new
            _rearm()
        # inside a `with sync_guard(...)` block of this thread/task the block's mode would mask
        # the process-wide one: a plain call changes the block's mode too (until the block ends)
        self._call_token = _scoped.set(new) if _scoped.get() is not None else None
        self._token: contextvars.Token | None = None

    def __enter__(self) -> _Guard:
        global _global, _open_blocks
        if self._call_token is not None:
            _scoped.reset(self._call_token)
            self._call_token = None
        with _lock:  # a block is scoped: give the process-wide mode back
            if _global == self.mode:
                _global = self._prev
            _open_blocks += 1
            _rearm()
        self._token = _scoped.set(self.mode)
        return self

    def __exit__(self, *exc: object) -> None:
        global _open_blocks
        if self._token is not None:
            _scoped.reset(self._token)
            self._token = None
        with _lock:
            _open_blocks -= 1
            _rearm()

    def __repr__(self) -> str:
        return f"sync_guard({self.mode!r})"


def sync_guard(mode: str) -> _Guard:
    """Set what an implicit device-to-host sync does: "allow" (default), "warn"
    (`ltc.UnexpectedSyncWarning`) or "raise" (`ltc.UnexpectedSyncError`).

    `ltc.sync_guard("warn")` sets it for the process; `with ltc.sync_guard("raise"):` for the
    block, in this thread or trio task only, restoring the previous mode on exit.  Implicit:
    `.item()`, `bool(t)` (`if t:`, `while t:`), `float(t)`, `int(t)`, `.tolist()`, `print(t)`,
    ops returning Python values (`torch.equal`), eager fallbacks reading device data.  Always
    allowed: `t.cpu()`, `t.to("cpu")`, `ltc.to_cpu`, `ltc.sync`, `mark_step`,
    `wait_device_ops`, and reads inside step closures."""
    return _Guard(_checked(mode))


@contextlib.contextmanager
def exempt() -> Iterator[None]:
    """Reads in this block are explicit (step closures run in one): neither checked nor
    recorded as implicit syncs."""
    token = _exempt.set(True)
    try:
        yield
    finally:
        _exempt.reset(token)


def implicit(what: str) -> None:
    """An implicit sync `what` is about to happen on this thread: record it for the findings,
    then warn or raise as the mode says."""
    if _exempt.get():
        return
    f = location.user_frame()
    where = location.describe(f)
    findings.synced(what, where)
    if not armed:
        return
    m = mode()
    if m == "allow":
        return
    text = (f"ltc_async: implicit device-to-host sync: {what} at {where} waits for the device "
            f"(tracing and execution stop overlapping). Keep the value on the device "
            f"(torch.where instead of `if t:`), or read it explicitly and less often: t.cpu() / "
            f"ltc.to_cpu(...) every N steps, or in ltc.add_step_closure(fn, run_async=True).")
    if m == "raise":
        err = UnexpectedSyncError(text)
        err.what, err.where = what, where
        raise err
    w = UnexpectedSyncWarning(text)
    w.what, w.where = what, where
    location.warn_at(f, w)


def inside_method() -> bool:
    """A wrapped Tensor method on this thread reported the sync already."""
    return getattr(_tls, "depth", 0) > 0


# -- Tensor methods that read device values ----------------------------------------------------

_METHODS = {
    "item": ".item()",
    "__bool__": "bool(t) (`if t:` / `while t:`: data-dependent control flow)",
    "__float__": "float(t)",
    "__int__": "int(t)",
    "__index__": "operator.index(t)",
    "tolist": ".tolist()",
    "__repr__": "print(t) / repr(t)",
    "__format__": "format(t) / an f-string",
}
_USER_TYPES = (torch.Tensor, torch.nn.Parameter)


def _wrap(original: Any, what: str) -> Any:
    def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if type(self) not in _USER_TYPES or getattr(_tls, "depth", 0) or self.device.type != "ltc":
            return original(self, *args, **kwargs)
        implicit(what)
        _tls.depth = 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _tls.depth = 0
    method.__name__ = getattr(original, "__name__", "method")
    method.__doc__ = getattr(original, "__doc__", None)
    method.__wrapped__ = original
    return method


def _install() -> None:
    for name, what in _METHODS.items():
        setattr(torch.Tensor, name, _wrap(getattr(torch.Tensor, name), what))


with _lock:
    _rearm()


# -- subscriptions -----------------------------------------------------------------------------

_SCALAR_READ = ".item() / bool(t) / float(t) / int(t) (a tensor's Python value)"


@events.host_read.subscribe
def _host_read(func: Any, what: str | None = None) -> None:
    """`host.host_op`: an op returning a Python value is about to read device data (`what`
    says otherwise, e.g. a data-dependent output size)."""
    if inside_method():
        return
    name = str(func)
    implicit(what or (_SCALAR_READ if name == "aten._local_scalar_dense.default" else f"torch op {name}"))


@events.fallback.subscribe
def _fallback(name: str, args: Any) -> None:
    """`host.eager_fallback`: op `name` runs eagerly on `args` (its bound arguments)."""
    if not inside_method() and _reads_lazy(args):
        implicit(f"eager fallback of {findings.qualified(name)} (reads device data)")


def _reads_lazy(args: Any) -> bool:
    for a in args:
        if type(a) is LtcTensor:
            return True
        if type(a) in (list, tuple) and any(type(e) is LtcTensor for e in a):
            return True
    return False


@events.explicit_reads.subscribe
def _explicit(fn: Any) -> Any:
    def run(*args: Any) -> Any:
        with exempt():
            return fn(*args)
    return run
