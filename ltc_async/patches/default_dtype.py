"""`torch.set_default_dtype` between traced ops: per-signature caches start over.

The op path caches what meta inference said about each signature (op, arguments, input metas:
`tensor/shapes.py`), and a few checks cache their verdicts the same way.  A factory without a
dtype (`torch.ones(2, device="ltc:0")`) and an integer tensor promoted by a Python float
(`ids * 0.1`, `ids / 2`) take their result dtype from the default dtype, which is not part of
those keys: after `torch.set_default_dtype(torch.float64)` they kept float32.  Changing the
default empties the caches (users change it rarely: the price is one meta run per signature
afterwards).  What the traced nodes do with the default -- they must not consult it when the
device runs them later -- is `trace.py`'s business (explicit dtypes).

Thread safety: the caches are plain dicts that tracing threads refill (`dispatch.py`'s note);
clearing one is a single dict operation.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from ..tensor import decompositions, shapes
from . import inplace


def _forget() -> None:
    shapes.cache.clear()
    inplace._result_dtypes.clear()
    decompositions._checked.clear()


def patch() -> None:
    for name in ("set_default_dtype", "set_default_tensor_type"):
        original = getattr(torch, name)

        @functools.wraps(original)
        def setter(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            before = torch.get_default_dtype()
            out = _original(*args, **kwargs)
            if torch.get_default_dtype() is not before:
                _forget()
            return out
        setattr(torch, name, setter)
