"""Warnings issued at the user's line.

The frame comes from `ltc_async.callsite` (the one call-site lookup, re-exported here as
`user_frame` / `describe`); a warning points at that line (`warnings.warn_explicit` with that
frame's module and registry: the usual "once per location" filtering then applies, and
`pytest.warns` / `-W error` work as usual).
"""
from __future__ import annotations

import warnings
from types import FrameType

from ..base.callsite import describe, user_frame  # noqa: F401 - re-exported for the diagnostics


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
