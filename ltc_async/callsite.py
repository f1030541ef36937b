"""The user's line: the innermost frame outside ltc_async, its backends and torch.

A foundation (it imports nothing of the package): execution labels (`caller_location`, "graph
scheduled at file:line"), the IR's debug origins, the sync guard's and the recompile
explanations' warnings all name the same frame, found by this one walk.  Frames skipped: the
`ltc_async` package, its backends (`devices/`, installed as `ltc_async_devices`), torch, and
frozen import machinery.  Generated code that must be skipped too (the per-op plans) is
compiled with a file name inside the package (`tensor/trace.py`).
"""
from __future__ import annotations

import os
import sys
from types import FrameType

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))   # .../ltc_async
SKIP_PREFIXES = (_HERE, os.path.join(os.path.dirname(_HERE), "devices"),
                 os.path.dirname(torch.__file__), "<frozen")
_INSTALLED_DEVICES = "ltc_async_devices"   # `devices/` as installed by a non-editable install


def user_frame() -> FrameType | None:
    """The innermost frame outside ltc_async, its backends and torch (None: there is none,
    e.g. on one of ltc_async's own threads)."""
    skip = SKIP_PREFIXES
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip) and _INSTALLED_DEVICES not in fn:
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
