"""An interpreter over the IR: replays a cut graph with eager aten calls.

It is the reference semantics of the IR (the `reference` backend is just this), and the
executor's fallback when a backend fails to compile a graph: the step still runs, eagerly.
Values are `torch.Tensor`s on the backing device, or `Failed` where an op raised while
salvaging (`execute_salvaging`): the executor carries those to the tensors' readers.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..base.errors import strip_frames
from .node import (
    DEVICE_DATA,
    NUM,
    RNG,
    SCALAR,
    TENSOR,
    TENSOR_LIST,
    Node,
    Tag,
    const_value,
)

# A template entry whose int constants (some, or all) are graph inputs: (LIFTED, the entry,
# ((index in an int list or None, index among the node's scalars), ...)); see `with_lifted_ints`.
LIFTED = Tag("L")
from .schema import op_info


class Failed:
    """A value an execution could not produce.  It stands in the execution's outputs, and every
    value computed from it (in this execution or a later one, on any device) is the same
    `Failed`: it always names the *root* failure, so chains of failing steps neither grow nor
    keep earlier steps alive."""

    __slots__ = ("error", "where", "ctx", "label")

    def __init__(self, error: BaseException, where: str) -> None:
        self.error = strip_frames(error)
        self.where = where        # "aten::index_select", or "execution" for a whole-graph failure
        self.ctx: Any = None      # device and label of the execution where it happened
        self.label = ""

    def __repr__(self) -> str:
        return f"Failed({self.root_text})"

    @property
    def root_text(self) -> str:
        return (f"{self.where} on {self.ctx} (graph scheduled at {self.label}): "
                f"{type(self.error).__name__}: {self.error}")


class Interpreter:
    """Replays the post-ordered nodes with eager aten calls.  A `backend.Computation` (registered
    as one there: the IR layer does not import the seam)."""

    reused_program = False

    def __init__(self, order: list[Node], roots: list[tuple[Node, int]], device: torch.device) -> None:
        self.device = device
        pos = {id(n): k for k, n in enumerate(order)}
        # Only structure and constants are kept: the same Computation serves every graph with
        # this key, whatever node objects a later step traced.
        self.steps = [(n.op, n.template, [(pos[id(o)], i) for o, i in n.operands], len(n.scalars), n.out_spec)
                      for n in order]
        self.roots = [(pos[id(n)], i) for n, i in roots]
        self.backend_text = "\n".join(
            f"%{k} = {'device_data' if op is DEVICE_DATA else op}" for k, (op, *_rest) in enumerate(self.steps))

    def with_lifted_ints(self, order: list[Node], lifted: Sequence[tuple[int, int, int | None]]) -> "Interpreter":
        """This graph's interpreter taking the int constants at `lifted` as inputs, as a shape-
        generic program does (`executor/generic.py`; (node index in `order`, template index,
        index in an `int[]` or None), sorted): each node's lifted ints follow its scalars among
        the inputs, so they become scalars of that node here.  Sets `lifted_scalars`, their
        indices among the graph's non-tensor inputs.  Captured graphs take no lifted ints."""
        by_node: dict[int, list[tuple[int, int | None]]] = {}
        for j, k, i in lifted:
            if not isinstance(order[j].op, torch._ops.OpOverload):
                raise ValueError("a captured graph's ints cannot be lifted")
            by_node.setdefault(j, []).append((k, i))
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        steps, lifted_scalars, n = [], [], 0
        for j, (op, template, operands, n_scalars, out_spec) in enumerate(self.steps):
            if op is DEVICE_DATA:
                steps.append((op, template, operands, n_scalars, out_spec))
                continue
            n += n_scalars
            subs: dict[int, list[tuple[int | None, int]]] = {}
            for k, i in by_node.get(j, ()):
                subs.setdefault(k, []).append((i, n_scalars))
                lifted_scalars.append(n)
                n_scalars += 1
                n += 1
            if subs:
                template = tuple((LIFTED, e, tuple(subs[k])) if k in subs else e for k, e in enumerate(template))
            steps.append((op, template, operands, n_scalars, out_spec))
        out.steps = steps
        out.lifted_scalars = lifted_scalars
        return out

    #: indices among the non-tensor inputs of the ints `with_lifted_ints` made inputs
    lifted_scalars: list[int] = []

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        env: list[list[Any]] = []
        it = iter(inputs)
        for step in self.steps:
            if step[0] is DEVICE_DATA:
                env.append([next(it)])
            else:
                env.append(self._run_step(step, env, it))
        return [env[k][i] for k, i in self.roots]

    def execute_salvaging(self, inputs: Sequence[Any]) -> list[Any]:
        """Run what can run: a node whose op raises, or that consumes a `Failed` value, yields
        `Failed` outputs; every other output gets its value.  How a failed execution keeps the
        outputs that do not depend on the failure (see `graph_executor._execute`)."""
        env: list[list[Any]] = []
        it = iter(inputs)
        for step in self.steps:
            op, _template, operands, n_scalars, out_spec = step
            if op is DEVICE_DATA:
                env.append([next(it)])
                continue
            failed = next((v for k, i in operands if type(v := env[k][i]) is Failed), None)
            if failed is None:
                try:
                    env.append(self._run_step(step, env, it))
                    continue
                except Exception as e:  # noqa: BLE001 - this node's failure, kept as a value
                    failed = Failed(e, op.name())
            else:
                for _ in range(n_scalars):
                    next(it)
            env.append([failed] * sum(1 if s is None else (s or 0) for s in out_spec))
        return [env[k][i] for k, i in self.roots]

    @classmethod
    def run_node(cls, node: Node, values: Sequence[Any], device: torch.device) -> list[Any]:
        """One node's op on `device`, given its operands' values: its flattened outputs."""
        self = cls.__new__(cls)
        self.device = device
        step = (node.op, node.template, [(k, 0) for k in range(len(values))], len(node.scalars), node.out_spec)
        return self._run_step(step, [[v] for v in values], iter(node.scalars))

    def _run_step(self, step: tuple, env: list[list[Any]], it: Any) -> list[Any]:
        """One node: call its aten op on the operand values; the flattened outputs."""
        op, template, operands, n_scalars, out_spec = step
        scalars = [next(it) for _ in range(n_scalars)]
        vals = [env[k][i] for k, i in operands]
        if not isinstance(op, torch._ops.OpOverload):  # a captured graph (ltc_async.compile)
            return op.run(vals, scalars, self.device, type(self))
        args = [self._arg(e, vals, scalars) for e in template]
        pos_args, kw_args = op_info(op).split(args)
        return self.flatten(self._call(op, pos_args, kw_args), out_spec)

    def _call(self, op: Any, args: Any, kwargs: dict) -> Any:
        """The aten op on its arguments (a backend's interpreter may rewrite the call)."""
        return op(*args, **kwargs)

    @staticmethod
    def flatten(out: Any, out_spec: tuple) -> list[Any]:
        """An op's result as the node's flattened outputs (one per tensor, lists spread)."""
        flat: list[Any] = []
        for r, s in zip(out if isinstance(out, tuple) else (out,), out_spec):
            if s is None:
                flat.append(r)
            elif s is not False:
                flat.extend(r)
        return flat

    def _arg(self, e: Any, vals: list[Any], scalars: list[Any]) -> Any:
        if type(e) is tuple and e and type(e[0]) is Tag:
            if e[0] is TENSOR:
                return vals[e[1]]
            if e[0] is TENSOR_LIST:
                return [None if r is None else vals[r] for r in e[1]]
            if e[0] is SCALAR:
                return scalars[e[1]]
            if e[0] is NUM:
                return const_value(e)
            if e[0] is LIFTED:   # an int, or ints of a list, given as inputs
                base, subs = e[1], e[2]
                v = base[1] if type(base) is tuple and base and type(base[0]) is Tag else base
                if type(v) is not tuple:
                    return scalars[subs[0][1]]
                v = list(v)
                for i, s in subs:
                    v[i] = scalars[s]
                return v
            if e[0] is RNG:
                g = torch.Generator(self.device)
                g.manual_seed(scalars[e[1]])
                return g
        if isinstance(e, torch.device) and e.type == "ltc":
            return self.device
        if type(e) is tuple:
            return list(e)
        return e
