"""The user's line: the innermost frame outside ltc_async, its backends and torch.

A foundation (it imports nothing of the package): execution labels (`caller_location`, "graph
scheduled at file:line"), the IR's debug origins, the sync guard's and the recompile
explanations' warnings all name the same frame, found by this one walk.  Frames skipped: the
`ltc_async` package, its backends (the `ltc_async_devices` package, wherever it is installed:
the repository's `devices/` folder in an editable install), torch, and frozen import
machinery.  Generated code that must be skipped too (the per-op plans) is
compiled with a file name inside the package (`tensor/trace.py`).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from types import FrameType

import torch


def _folder_of(package: str) -> str | None:
    """The folder of a top-level package, found without importing it."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return os.path.abspath(locations[0]) + os.sep if locations else None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # .../ltc_async/
SKIP_PREFIXES = tuple(p for p in (_PACKAGE, _folder_of("ltc_async_devices"),
                                  os.path.dirname(torch.__file__) + os.sep, "<frozen") if p)


def user_frame() -> FrameType | None:
    """The innermost frame outside ltc_async, its backends and torch (None: there is none,
    e.g. on one of ltc_async's own threads)."""
    skip = SKIP_PREFIXES
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip):
            return f
        f = f.f_back
    return None


def describe(f: FrameType | None) -> str:
    """`file:line (function)`, the format of execution labels and warnings' locations."""
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


def caller_location() -> str:
    """`file:line (function)` of the user's frame (see `user_frame`)."""
    return describe(user_frame())
