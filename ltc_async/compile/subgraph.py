"""`Subgraph`: the op of the one IR node a compiled graph call records.

A `Subgraph` is a recorded IR graph with formal parameters (its *body*): the IR that ordinary
lazy tracing of a captured FX graph produced once, on placeholder inputs (see `capture.py`).
Every call of the compiled graph records one `Node(subgraph, operands, (), scalars, metas)`:

* operands: the values bound to the body's leaves, in `leaves` order (the call's tensor
  arguments the body reads, then constants the body captured, e.g. 0-dim uploads);
* template: one `(TENSOR, i)` per operand, then one entry per scalar (for `ir.lint` and IR
  dumps); the node key is `(subgraph.key, ())`, unique per body, so the executor's graph key
  (and its compile cache) treats the whole body as one op;
* scalars: the body's runtime scalars, body post-order, template order within a node (what
  `Backend.compile` expects of consecutive nodes), random seeds drawn afresh at each call;
* outputs: one per body root.

Consumers never see a body unless they need its ops: the TorchScript lowering emits the body
inline (`lower`), the IR interpreter (reference backend, compile fallback, salvaging) runs it
with a nested interpreter (`run`).  Both are called by duck typing: an IR op that is not an
`OpOverload` is a `Subgraph`.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from ..ir.interpreter import Interpreter
from ..ir.node import RNG, SCALAR, TENSOR, Node, Tag, TensorMeta

_ids = itertools.count(1)


class Subgraph:
    """A recorded IR body, usable as the op of an IR node (see the module docstring)."""

    def __init__(self, leaves: list[Node], ops: list[Node], roots: list[tuple[Node, int]],
                 label: str) -> None:
        self.leaves = leaves                  # DEVICE_DATA nodes standing for the operands
        self.ops = ops                        # op nodes of the body, post-order
        self.roots = roots                    # body values the node outputs, in output order
        self.key = f"ltc_compile.{label}_{next(_ids)}"
        self.outputs: tuple[TensorMeta, ...] = tuple(n.outputs[i] for n, i in roots)
        self.out_spec = (None,) * len(roots)
        scalars: list[Any] = []
        rng: list[int] = []
        for n in ops:
            base = len(scalars)
            scalars.extend(n.scalars)
            for e in n.template:
                if type(e) is tuple and e and type(e[0]) is Tag and e[0] is RNG:
                    rng.append(base + e[1])
        self.scalars = tuple(scalars)         # the values recorded (seeds replaced per call)
        self.rng_slots = tuple(rng)
        # A node's template names its operands and scalars (what `ir.lint` checks and
        # `debug.dump_ir` prints).  The key stays `(key, ())`: the template is a function of
        # the body, and hashing it at every step would only cost time.
        self.template = tuple((TENSOR, i) for i in range(len(leaves))) + tuple(
            (RNG, k) if k in rng else (SCALAR, k, type(v)) for k, v in enumerate(scalars))
        self.node_key = (self.key, ())
        self._interpreters: dict[tuple, Any] = {}   # (device, interpreter class) -> interpreter

    def name(self) -> str:
        """What IR dumps and error messages call this op."""
        return f"{self.key}[{len(self.ops)} ops]"

    def __repr__(self) -> str:
        return self.name()

    def call_scalars(self, ctx: Any) -> tuple:
        """The scalars of one call: recorded values, fresh seeds from `ctx` for random ops
        (drawn in body order: the same seeds uncompiled tracing would have drawn)."""
        if not self.rng_slots:
            return self.scalars
        out = list(self.scalars)
        for k in self.rng_slots:
            out[k] = ctx.next_seed()
        return tuple(out)

    # -- backends ----------------------------------------------------------------------

    def lower(self, lowering: Any, node: Node, operand_values: list[Any]) -> list[Any]:
        """TorchScript: emit the body's nodes inline (`TSLowering.emit` of each), the operands'
        values standing for the leaves.  Scalar inputs are created in body order, which is
        the order of `node.scalars`."""
        env: dict[int, list[Any]] = {id(n): [v] for n, v in zip(self.leaves, operand_values)}
        for n in self.ops:
            env[id(n)] = lowering.emit(n, [env[id(o)][i] for o, i in n.operands])
        return [env[id(n)][i] for n, i in self.roots]

    def run(self, values: Sequence[Any], scalars: Sequence[Any], device: torch.device,
            interpreter: type[Interpreter] = Interpreter) -> list[Any]:
        """The IR interpreter: run the body eagerly on backend values; the flattened outputs.
        `interpreter`: the class of the interpreter running the graph around this node (a
        backend's interpreter rewrites calls: the body's ops get the same rewrites)."""
        interp = self._interpreters.get((device, interpreter))
        if interp is None:
            interp = self._interpreters[(device, interpreter)] = interpreter(
                self.leaves + self.ops, self.roots, device)
        return interp.execute(list(values) + list(scalars))
