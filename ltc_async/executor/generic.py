"""Shape-generic programs: one compile for graphs that differ only in integers.

Design note.  Graph keys are exact (`compiler.GraphPlan`), so a graph whose view sizes, `arange`
ends or `narrow` lengths follow a growing length -- the KV cache of `generate()`, a sequence
bucket, a smaller last batch -- is a new key at every length, and an exact-key engine (LTC,
PyTorch/XLA) compiles once per length.  Here, like `torch.compile`'s automatic dynamic shapes:

* every graph has a *skeleton*: its key with each int constant (an `int` argument, the ints of
  an `int[]` argument, an int `Scalar` constant) replaced by a marker and each device-data input
  reduced to its dtype and rank, plus the list of those ints in post-order;
* the first graph of a skeleton compiles exactly (its ints stay constants the backend can
  specialize on) and its ints are remembered;
* when another graph of the same skeleton misses the exact cache, the ints that differ from the
  remembered ones become runtime inputs of one *generic* program (`Backend.compile(..., lifted=)`),
  and every later graph of that skeleton whose other ints agree runs it without compiling
  (`GenericProgramHit`); one that also differs elsewhere compiles once more, lifting the union.
  Compiles per skeleton are bounded by its number of ints; in practice two.

A `Bound` computation pairs the generic program with one graph's ints and inserts them among
that graph's inputs, so the executor (and the exact cache, which stores the `Bound`) sees an
ordinary `Computation` of the usual inputs.

Tiers (`tiers.py`): the program a `Request` compiles is wrapped (`tiers.wrap(..., generic=True)`)
before it is stored, so it is *one* tiered program for every graph of its skeleton: it turns hot
from the executions of all of them, and its top tier is built once, with the lifted ints and the
tensor dimensions that varied while it got hot symbolic (`generate()` makes one graph per cache
length: a build per length took ~8 minutes of a core for 36 lengths of a tiny Llama and bought
nothing per token; one symbolic build halves the token's execution).  Graphs of a skeleton
that compiles exactly (its backend would not lift) are built per exact graph while the
skeleton has had few of them (`lookup`'s third answer).

Only backends whose programs take such ints (`Backend.lifts_ints`) take part: the IR
interpreter reads constants from the nodes themselves.  Everything here runs on the compiler
thread (`compiler.py`), so the registry needs no lock.
"""
from __future__ import annotations

import collections
from typing import Any, Sequence

from ..backend import Computation
from ..base import counters
from ..base.config import config
from ..ir.node import DEVICE_DATA, NUM, Tag

Position = tuple[int, int, "int | None"]   # (node index in post-order, template index, list index)
_INT = Tag("int")


def _is_int(v: Any) -> bool:
    return type(v) is int


def skeleton(plan: Any) -> tuple[tuple, list[int], list[Position], list[int]]:
    """The skeleton key of `plan`, its ints, where each int is, and for each int the number of
    graph inputs that precede it (inputs of its node and of the nodes before it)."""
    parts: list[Any] = []
    ints: list[int] = []
    where: list[Position] = []
    before: list[int] = []
    pos = {id(n): j for j, n in enumerate(plan.order)}
    n_inputs = 0
    for j, n in enumerate(plan.order):
        if n.op is DEVICE_DATA:
            m = n.outputs[0]
            parts.append((DEVICE_DATA, m.dtype, len(m.shape)))
            n_inputs += 1
            continue
        n_inputs += len(n.scalars)
        entries: list[Any] = []
        for k, e in enumerate(n.template):
            te = type(e)
            if te is int:
                entries.append(_INT)
                ints.append(e)
                where.append((j, k, None))
            elif te is tuple and e and type(e[0]) is Tag:
                if e[0] is NUM and e[2] is int:                    # an int Scalar constant
                    entries.append((NUM, _INT))
                    ints.append(e[1])
                    where.append((j, k, None))
                elif e[0] is NUM and type(e[1]) is tuple and all(t is int for t in e[2]):
                    entries.append((NUM, _INT, len(e[1])))
                    for i, v in enumerate(e[1]):
                        ints.append(v)
                        where.append((j, k, i))
                else:
                    entries.append(e)
            elif te is tuple and e and all(map(_is_int, e)):      # an int[] (sizes, dims)
                entries.append((_INT, len(e)))
                for i, v in enumerate(e):
                    ints.append(v)
                    where.append((j, k, i))
            else:
                entries.append(e)
        while len(before) < len(ints):
            before.append(n_inputs)
        # out_spec: how many tensors a `Tensor[]` result unpacks to (split, unbind, chunk) can
        # follow the shapes the skeleton leaves out; the program unpacks a fixed number
        parts.append((n.key[0], tuple(entries), tuple([(pos[id(o)], i) for o, i in n.operands]),
                      n.out_spec))
    key = (tuple(parts), tuple([(pos[id(n)], i) for n, i in plan.roots]))
    return key, ints, where, before


class Bound(Computation):
    """A generic program with one graph's lifted ints, taking that graph's usual inputs."""

    def __init__(self, program: Computation, inserts: list[tuple[int, int]]) -> None:
        self.program = program
        self.inserts = inserts            # (index among the usual inputs, value), ascending
        self.backend_text = program.backend_text

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        at = 0
        for i, v in self.inserts:
            out.extend(inputs[at:i])
            out.append(v)
            at = i
        out.extend(inputs[at:])
        return self.program.execute(out)


class _Variants:
    """What the registry knows about one skeleton."""

    __slots__ = ("ints", "lifted", "program", "graphs")

    def __init__(self, ints: list[int]) -> None:
        self.ints = ints                      # the first graph's ints
        self.lifted: frozenset[int] | None = frozenset()   # None: the backend refused to lift
        self.program: Computation | None = None
        self.graphs = 1                       # exact graphs of this skeleton seen so far


class Request:
    """A cache miss `lookup` could not serve: compile with `lifted`, then `finish`."""

    def __init__(self, var: _Variants, lifted: frozenset[int], where: list[Position],
                 ints: list[int], before: list[int]) -> None:
        self.var = var
        self.lifted_ids = lifted
        self.lifted: list[Position] = [where[i] for i in sorted(lifted)]
        self.ints = ints
        self.before = before

    def finish(self, comp: Computation, lifted_ok: bool) -> Computation:
        """Record the compiled program (`lifted_ok`: a backend program that took `lifted`);
        return what the exact cache should hold."""
        if not lifted_ok:    # the backend refused (or fell back): this skeleton compiles exactly
            self.var.lifted = None
            return comp
        self.var.lifted = self.lifted_ids
        self.var.program = comp
        return _bind(comp, self.lifted_ids, self.ints, self.before) if self.lifted else comp


def _bind(program: Computation, lifted: frozenset[int], ints: list[int], before: list[int]) -> Bound:
    return Bound(program, [(before[i], ints[i]) for i in sorted(lifted)])


_registry: "collections.OrderedDict[tuple, _Variants]" = collections.OrderedDict()
# exact graphs of one skeleton that may each get a top-tier build (see the module note)
_BUILT_PER_SKELETON = 4


def lookup(device_key: str, plan: Any) -> tuple[Computation | None, Request | None, bool]:
    """For an exact-cache miss: a generic program bound to `plan`'s ints, or what to compile;
    and whether `plan` may be built on the top tier once hot (not when its skeleton has had
    more than a few exact graphs: see the module note)."""
    key, ints, where, before = skeleton(plan)
    skey = (device_key, key)
    var = _registry.get(skey)
    if var is None:
        var = _registry[skey] = _Variants(ints)
        while len(_registry) > config.compile_cache_size:
            _registry.popitem(last=False)
        return None, Request(var, frozenset(), where, ints, before), True
    _registry.move_to_end(skey)
    var.graphs += 1
    worth = var.graphs <= _BUILT_PER_SKELETON
    if var.lifted is None:           # this skeleton compiles exactly
        return None, None, worth
    differ = var.lifted | {i for i, (a, b) in enumerate(zip(ints, var.ints)) if a != b}
    if var.program is not None and differ == var.lifted:
        counters.counter("GenericProgramHit")
        return _bind(var.program, var.lifted, ints, before), None, worth
    return None, Request(var, frozenset(differ), where, ints, before), worth


def clear() -> None:
    _registry.clear()
