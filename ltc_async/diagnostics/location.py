"""The user's `file:line` of an event, and warnings issued there.

`executor.device.caller_location` names the innermost frame outside ltc_async, its backends and
torch as a string; diagnostics also need the frame itself, so that a warning points at the
user's line (`warnings.warn_explicit` with that frame's module and registry: the usual
"once per location" filtering then applies, and `pytest.warns` / `-W error` work as usual).
"""
from __future__ import annotations

import sys
import warnings
from types import FrameType

_skip: tuple[str, ...] | None = None


def user_frame() -> FrameType | None:
    """The innermost frame outside ltc_async, its backends and torch (None: there is none,
    e.g. on one of ltc_async's own threads)."""
    global _skip
    skip = _skip
    if skip is None:
        # the very prefixes caller_location skips (imported late: device.py imports hooks)
        from ..executor.device import _SKIP_PREFIXES
        skip = _skip = _SKIP_PREFIXES
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip) and "ltc_async_devices" not in fn:
            return f
        f = f.f_back
    return None


def describe(f: FrameType | None) -> str:
    """`file:line (function)`, the format of `caller_location` and of execution labels."""
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


def warn_at(f: FrameType | None, warning: Warning) -> None:
    """Issue `warning` as if raised at the user's line `f`."""
    if f is None:
        warnings.warn(warning, stacklevel=2)
        return
    g = f.f_globals
    filename = f.f_code.co_filename
    # module_globals lets linecache find the source; code run from a string (`python -c`) has
    # none to find, and its loader would fail
    warnings.warn_explicit(warning, type(warning), filename, f.f_lineno,
                           module=g.get("__name__", "<unknown>"),
                           registry=g.setdefault("__warningregistry__", {}),
                           module_globals=None if filename.startswith("<") else g)
