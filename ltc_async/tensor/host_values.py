"""Values read to the host, kept by the lazy value they were read from.

Design note.  A value read once need not be read again while its lazy value lives: a mask's
count serves every index op of the step and the backward (`data_dependent.py`), the small
integer tensors a mask is computed from let later masks be counted on the host
(`host_compute.py`).  Both keep what they read here, one store keyed by IR value -- the node
and output index -- and *what* was read of it (a count, a max, the whole tensor): weak keys,
so an entry goes with its step's graph.

A cut (`mark_step`, the backward's own cut of the forward) turns pending values into device
data: `events.values_cut` moves each value's entries to the data node that now names it, so
the backward still finds what the forward read.

Thread safety: `_lock` guards the store; a racing miss reads the same value twice (both
readers then store equal values).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

from ..base import events

_store: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # node -> {(output, what): value}
_lock = threading.Lock()


def get(value: tuple[Any, int], what: str) -> Any:
    """What was read as `what` of the lazy value `(node, output)`, or None."""
    node, out = value
    with _lock:
        return _store.get(node, {}).get((out, what))


def put(value: tuple[Any, int], what: str, read: Any) -> None:
    node, out = value
    with _lock:
        _store.setdefault(node, {})[(out, what)] = read


@events.values_cut.subscribe
def _follow_cut(roots: list, data_nodes: list) -> None:
    """A value read before a cut is the same value after it, under the device data that now
    names it."""
    if not _store:
        return
    with _lock:
        for (node, out), data in zip(roots, data_nodes):
            known = _store.get(node)
            if known is not None:
                mine = {(0, what): v for (o, what), v in known.items() if o == out}
                if mine:
                    _store.setdefault(data, {}).update(mine)
