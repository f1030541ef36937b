"""`ltc.debug.explain_recompiles`: why a call site compiled another graph.

Design note.  Graph keys are exact (`executor/compiler.py: GraphPlan`): per post-order node,
`node.key` -- `(op name, template)` for an op, `(DEVICE_DATA, output metas)` for an input --
and the post-order positions of its operands, then the roots.  A new key at a call site that
has compiled before is a recompile, and its cause is the first node where the key differs
from the closest cached one.  The real causes, and how they show:

* a smaller last batch: an input's *shape* (a DEVICE_DATA node's metas);
* a Python number baked in as a *constant* (an `eps`, a `full` value): a template entry, named
  by its schema argument (runtime scalars are lifted: only their type is in the key);
* a changed *dtype*: an input's metas, or a dtype constant;
* another op order or a data-dependent branch: the *op* at that node;
* a tensor synced in one step but computed in the other, or swapped operands: an *input*
  (device data where the cached graph computes, or other operand positions).

Mechanics.  On the compiler thread, `looked_up` (called by `compiler._prepare` after the cache
lookup) keeps, per call site and device, the keys of the graphs seen there (at most
`_PER_SITE`, most recent last) with each node's origin; on a miss at a site with history it
picks the cached key with the longest equal prefix (most recent on ties), describes the first
difference, appends the message to the log and parks it under the plan.  The warning itself
is issued on the user's thread, at the user's line: `track` (at the cut) notes the prepare
job's future, and `_emit` (when `schedule` returns, no lock held) waits for it -- so with
explanations on, `mark_step` returns once its graph is compiled -- and warns.  The trio twin
awaits instead.  Node origins need `config.ir_debug`, which `enable` turns on (and back off).

Locks: `_lock` (a leaf) guards `_log` and `_pending`, which cross threads; `_sites` is only
touched on the compiler thread; `_tls` holds each thread's own futures.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from ..base import counters, events
from ..base.config import config
from ..ir.node import (
    DEVICE_DATA,
    NUM,
    RNG,
    SCALAR,
    TENSOR,
    TENSOR_LIST,
    Tag,
    const_value,
)
from . import location

__all__ = ["RecompileWarning", "enable", "recompile_log"]

_PER_SITE = 8        # graphs remembered per (call site, device)
_MAX_SITES = 256
_MAX_PENDING = 256


class RecompileWarning(UserWarning):
    """A graph-cache miss at a call site that had a graph before.  Attributes: `call_site`
    (the user's `file:line (function)`), `device`, `kind` (`"shape"`, `"dtype"`, `"constant"`,
    `"op"`, `"input"`, `"output"`, or `"evicted"`: the same graph again, evicted meanwhile), `node` (post-order index, as in `dump_ir`), `op`,
    `new` / `cached` (the differing values, as text) and `origin` (the user line that traced
    the node)."""

    call_site = device = kind = op = new = cached = origin = ""
    node = -1


class _Seen(NamedTuple):
    parts: tuple          # the key's per-node parts
    roots: tuple          # the key's roots
    origins: tuple        # user line of each node (None for inputs)
    number: int           # 1 for the first graph seen at the site, ...


class _Diff(NamedTuple):
    kind: str
    node: int
    op: str
    new: str
    cached: str
    origin: str
    text: str
    hint: str


enabled = False
_lock = threading.Lock()
_log: collections.deque[str] = collections.deque(maxlen=128)
_pending: dict[int, RecompileWarning] = {}      # id(plan) -> its warning, until emitted
_sites: collections.OrderedDict[tuple[str, str], collections.OrderedDict] = collections.OrderedDict()
_counts: dict[tuple[str, str], int] = {}        # graphs seen per site (numbers them)
_tls = threading.local()
_we_set_ir_debug = False


def enable(flag: bool = True) -> None:
    """Turn explanations on or off (node origins, `config.ir_debug`, follow)."""
    global enabled, _we_set_ir_debug
    flag = bool(flag)
    if flag and not config.ir_debug:
        config.ir_debug = _we_set_ir_debug = True
    elif not flag and _we_set_ir_debug:
        config.ir_debug = _we_set_ir_debug = False
    enabled = flag
    for event, handler in ((events.prepare_job, _track), (events.looked_up, looked_up),
                           (events.scheduled, _emit)):
        (event.subscribe if flag else event.unsubscribe)(handler)


def recompile_log() -> list[str]:
    """The most recent explanations (oldest first, at most 128)."""
    with _lock:
        return list(_log)


def clear() -> None:
    """Forget call sites, history and the log (tests)."""
    with _lock:
        _log.clear()
        _pending.clear()
    _sites.clear()
    _counts.clear()


# -- user thread ---------------------------------------------------------------------------

def track(fut: cf.Future) -> None:
    """At the cut (device lock held: no waiting): remember this thread's prepare job."""
    futs = getattr(_tls, "futures", None)
    if futs is None:
        futs = _tls.futures = []
    futs.append(fut)


def _take() -> list[cf.Future]:
    futs = getattr(_tls, "futures", None)
    if not futs:
        return []
    _tls.futures = []
    return futs


def _warn_for(futs: list[cf.Future]) -> None:
    f = location.user_frame()
    for fut in futs:
        if fut.cancelled() or fut.exception() is not None:
            continue
        with _lock:
            w = _pending.pop(id(fut.result()), None)
        if w is not None:
            location.warn_at(f, w)


def _track(job: Any, _ctx: Any, _label: str, fut: cf.Future) -> Any:
    """`events.prepare_job` (at the cut, device lock held: no waiting): remember this thread's
    prepare job; the job itself is unchanged."""
    track(fut)
    return job


def _emit() -> Iterator[list[cf.Future]]:
    """`events.scheduled` (no lock held): wait for this thread's prepare jobs, then warn for
    their misses at the user's line.  A generator of waits, so the trio twins await it; the
    list is taken before the first wait, so tasks sharing the thread never take each other's."""
    futs = _take()
    if futs:
        yield futs
        _warn_for(futs)


# -- compiler thread -------------------------------------------------------------------------

def looked_up(ctx: Any, plan: Any, label: str, hit: bool) -> None:
    """After the cache lookup of `plan`'s key, scheduled at `label` on `ctx`."""
    device = str(ctx.device)
    site = (label, device)
    seen = _sites.get(site)
    key = plan.key
    if seen is not None and key in seen:
        if not hit:   # seen here before, but no longer cached
            _park(_evicted(seen[key], label, device), plan)
        seen.move_to_end(key)
        _sites.move_to_end(site)
        return
    if not hit and seen:
        _park(_explain(plan, seen, label, device), plan)
    if seen is None:
        seen = _sites[site] = collections.OrderedDict()
        while len(_sites) > _MAX_SITES:
            old, _ = _sites.popitem(last=False)
            _counts.pop(old, None)
    _sites.move_to_end(site)
    n = _counts[site] = _counts.get(site, 0) + 1
    seen[key] = _Seen(key[0], key[1], tuple([nd.origin for nd in plan.order]), n)
    while len(seen) > _PER_SITE:
        seen.popitem(last=False)


def _park(w: RecompileWarning, plan: Any) -> None:
    """Log `w` and keep it for the user thread that scheduled `plan` (`_emit`)."""
    counters.counter("RecompileExplained")
    with _lock:
        _log.append(str(w))
        _pending[id(plan)] = w
        while len(_pending) > _MAX_PENDING:   # a thread that never emits: keep memory flat
            del _pending[next(iter(_pending))]


def _evicted(entry: _Seen, label: str, device: str) -> RecompileWarning:
    w = RecompileWarning(
        f"ltc_async: recompiling at {label} on {device}: the very graph {entry.number} of this "
        f"call site, evicted from the compile cache since. Likely cause: more distinct graphs "
        f"than LTC_ASYNC_COMPILE_CACHE_SIZE={config.compile_cache_size} (raise it, or find why "
        f"there are so many graphs: the other warnings here)")
    w.call_site, w.device, w.kind, w.new, w.cached = label, device, "evicted", "", ""
    return w


def _common_prefix(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _explain(plan: Any, seen: collections.OrderedDict, label: str, device: str) -> RecompileWarning:
    parts = plan.key[0]
    best: _Seen | None = None
    best_n = -1
    for entry in reversed(seen.values()):
        n = _common_prefix(parts, entry.parts)
        if n > best_n:
            best, best_n = entry, n
    assert best is not None
    d = _first_difference(plan, best, best_n)
    number = _counts.get((label, device), 0) + 1
    text = (f"ltc_async: recompiling at {label} on {device}: graph {number} at this call site is "
            f"new to the cache. Closest cached graph: graph {best.number} here ({len(best.parts)} "
            f"nodes, the first {best_n} equal). First difference: {d.kind} at node %{d.node} "
            f"({d.op}{', an input' if d.op == 'device_data' else ''}): {d.text}.{' Traced at ' + d.origin + '.' if d.origin else ''} "
            f"Likely cause: {d.hint}")
    w = RecompileWarning(text)
    w.call_site, w.device, w.kind, w.node, w.op = label, device, d.kind, d.node, d.op
    w.new, w.cached, w.origin = d.new, d.cached, d.origin
    return w


# -- describing a difference -----------------------------------------------------------------

_SHAPE_ARGS = {"size", "sizes", "shape", "stride", "output_size", "split_size", "split_sizes"}


def _is_data(part: Any) -> bool:
    return part[0] is DEVICE_DATA


def _op_name(part: Any) -> str:
    return "device_data" if _is_data(part) else str(part[0][0])


def _meta_text(m: Any) -> str:
    return f"{str(m.dtype).replace('torch.', '')}{list(m.shape)}"


def _entry_text(e: Any) -> str:
    if type(e) is tuple and e and type(e[0]) is Tag:
        tag = e[0]
        if tag is NUM:
            v = const_value(e)
            return f"{v!r} ({type(e[1]).__name__})" if not isinstance(v, list) else repr(v)
        if tag is SCALAR:
            return f"a runtime {e[2].__name__} (lifted: an input, not a constant)"
        if tag is TENSOR:
            return f"operand {e[1]}"
        if tag is TENSOR_LIST:
            return f"operands {list(e[1])}"
        if tag is RNG:
            return "a generator (seeded per step)"
    if isinstance(e, torch.dtype):
        return str(e).replace("torch.", "")
    if type(e) is tuple:
        return repr(list(e))
    return repr(e)


def _arg_name(node: Any, j: int) -> str:
    try:
        return node.op._schema.arguments[j].name
    except (AttributeError, IndexError):
        return f"argument {j}"


def _first_user(plan: Any, i: int) -> str:
    """`op traced at file:line` of the first node reading node `i` (inputs have no origin)."""
    target = plan.order[i]
    for n in plan.order[i + 1:]:
        if any(o is target for o, _ in n.operands):
            return f"{n.name}" + (f" at {n.origin}" if n.origin else "")
    return ""


def _first_difference(plan: Any, old: _Seen, i: int) -> _Diff:
    parts, roots = plan.key
    order = plan.order
    if i < len(parts) and i < len(old.parts):
        new_p, old_p = parts[i], old.parts[i]
        node = order[i]
        if _is_data(new_p) and _is_data(old_p):
            nm, om = new_p[1][0], old_p[1][0]
            user = _first_user(plan, i)
            used = f"; first used by {user}" if user else ""
            if nm.shape != om.shape:
                return _Diff("shape", i, "device_data", str(list(nm.shape)),
                             str(list(om.shape)),
                             "", f"an input of shape {list(nm.shape)} here, {list(om.shape)} in the "
                             f"cached graph ({_meta_text(nm)}){used}",
                             "an input of another size: a smaller last batch (drop_last=True, or "
                             "pad it to the usual size) or a sequence of another length")
            if nm.dtype != om.dtype:
                nd, od = str(nm.dtype).replace("torch.", ""), str(om.dtype).replace("torch.", "")
                return _Diff("dtype", i, "device_data", nd, od, "",
                             f"an input of dtype {nd} here, {od} in the cached graph{used}",
                             "inputs of another dtype (a .double() / .half() / .long() "
                             "somewhere, or data loaded as another type)")
            return _Diff("shape", i, "device_data", str(nm.stride), str(om.stride), "",
                         f"an input with strides {list(nm.stride)} here, {list(om.stride)} in "
                         f"the cached graph (same shape, another layout){used}",
                         "an input of another memory layout (a transposed or expanded tensor)")
        if _is_data(new_p) != _is_data(old_p):
            reordered = _reordered_op(plan, old, i)
            if reordered is not None:
                return reordered
            here = f"an input ({_meta_text(new_p[1][0])})" if _is_data(new_p) else \
                f"{new_p[0][0]} (computed)"
            there = f"an input ({_meta_text(old_p[1][0])})" if _is_data(old_p) else \
                f"{old_p[0][0]} (computed)"
            origin = node.origin or ""
            return _Diff("input", i, _op_name(new_p), here, there, origin,
                         f"{here} here, {there} in the cached graph",
                         "a tensor that was synced (device data) in one step is computed in "
                         "the other: a read or sync at another point of the step, or state "
                         "created in a first step (optimizer buffers, accumulators) that later "
                         "steps read as an input -- once, in the first steps, that is expected")
        (nk, npos), (ok, opos) = new_p, old_p
        origin = node.origin or ""
        if nk[0] != ok[0]:
            return _Diff("op", i, str(nk[0]), str(nk[0]), str(ok[0]), origin,
                         f"{nk[0]} here, {ok[0]} in the cached graph (traced at "
                         f"{old.origins[i] or 'an unrecorded line'})",
                         "the code traced other ops: a data-dependent branch, or ops in "
                         "another order")
        if nk[1] != ok[1]:
            j = next(j for j, (a, b) in enumerate(zip(nk[1], ok[1])) if not _same(a, b)) \
                if len(nk[1]) == len(ok[1]) else 0
            a, b = nk[1][j], ok[1][j]
            arg = _arg_name(node, j)
            if isinstance(a, torch.dtype) or isinstance(b, torch.dtype):
                kind, hint = "dtype", "a dtype argument changed (a cast to another type)"
            elif arg in _SHAPE_ARGS:
                kind, hint = "shape", ("a size argument changed: it follows an input's shape or "
                                       "a Python int")
            else:
                kind = "constant"
                hint = ("a Python value baked into the graph as a constant changed: keep it "
                        "fixed, or pass it as a tensor where the op takes one (tensors are "
                        "inputs: a new value reuses the graph)")
            return _Diff(kind, i, str(nk[0]), _entry_text(a), _entry_text(b), origin,
                         f"argument `{arg}` is {_entry_text(a)} here, {_entry_text(b)} in the "
                         f"cached graph", hint)
        return _Diff("input", i, str(nk[0]), str(list(npos)), str(list(opos)), origin,
                     f"it reads nodes {['%' + str(p) + ('' if k == 0 else f'.{k}') for p, k in npos]} "
                     f"here, {['%' + str(p) + ('' if k == 0 else f'.{k}') for p, k in opos]} in "
                     f"the cached graph",
                     "the same ops wired differently (swapped operands, or another tensor fed in)")
    if len(parts) == len(old.parts):
        return _Diff("output", len(parts), "outputs", str(list(roots)), str(list(old.roots)), "",
                     f"the same nodes, other outputs: {len(roots)} here, {len(old.roots)} in the "
                     f"cached graph",
                     "another set of tensors was synced (other live tensors at this call site)")
    if i < len(parts):
        node = order[i]
        return _Diff("op", i, _op_name(parts[i]), _op_name(parts[i]), "(no node)", node.origin or "",
                     f"this graph goes on with {_op_name(parts[i])} ({len(parts)} nodes), the "
                     f"cached graph ends after {len(old.parts)} nodes",
                     "more ops were traced before this sync (another branch, or more steps "
                     "accumulated before mark_step)")
    return _Diff("op", i, "(no node)", "(no node)", _op_name(old.parts[i]), "",
                 f"this graph ends after {len(parts)} nodes, the cached graph goes on with "
                 f"{_op_name(old.parts[i])} (traced at {old.origins[i] or 'an unrecorded line'})",
                 "fewer ops were traced before this sync (another branch)")


def _reordered_op(plan: Any, old: _Seen, i: int) -> _Diff | None:
    """Node `i` is an input in one graph and an op in the other.  With as many inputs and ops
    in both, the graphs hold the same kinds of nodes in another order: name the first op that
    differs when only ops are compared (else None: an input computed in one graph and synced
    in the other)."""
    parts = plan.key[0]
    n_data = sum(map(_is_data, parts))
    if len(parts) != len(old.parts) or n_data != sum(map(_is_data, old.parts)):
        return None
    new_ops = [j for j in range(i, len(parts)) if not _is_data(parts[j])]
    old_ops = [j for j in range(i, len(old.parts)) if not _is_data(old.parts[j])]
    for a, b in zip(new_ops, old_ops):
        na, nb = parts[a][0][0], old.parts[b][0][0]
        if na != nb:
            return _Diff("op", a, str(na), str(na), str(nb), plan.order[a].origin or "",
                         f"the ops come in another order: {na} here, {nb} in the cached graph "
                         f"(traced at {old.origins[b] or 'an unrecorded line'})",
                         "the code traced the same kinds of ops in another order (a "
                         "data-dependent branch, or code paths taken in another order)")
    return None


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


if config.explain_recompiles:   # LTC_ASYNC_EXPLAIN_RECOMPILES=1
    enable(True)
