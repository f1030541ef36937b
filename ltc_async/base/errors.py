"""Errors kept for later: a captured exception must not keep a failed step's tensors alive."""
from __future__ import annotations

import traceback

__all__ = ["strip_frames"]


def strip_frames(error: BaseException) -> BaseException:
    """Drop the local variables of the finished frames in `error`'s traceback (and its causes):
    a captured error must not keep a failed step's tensors alive until someone reads it."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__
    return error
