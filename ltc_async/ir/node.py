"""The IR: immutable nodes recorded instead of running aten ops.

A `Node` is one aten call with its tensor operands replaced by references to other nodes'
outputs.  Everything that is not a tensor is kept in `template`, one entry per schema argument:

* a constant (ints, int lists as tuples, dtypes, devices, None, ...), part of the node's identity;
* `(NUM, value, token)`: a constant in a slot that takes floats or Scalars (`eps`, `clamp(min=)`,
  a factory's fill value), made by `exact()`.  Python equality merges `1 == 1.0 == True` and
  `0.0 == -0.0` and never matches NaN, so such constants carry an exact `token` (the type, or
  the float's bits) and every key built from the template tells them apart; `const_value(e)`
  gives the value back;
* `(TENSOR, i)`: operand `i`;
* `(TENSOR_LIST, (i, j, None, ...))`: a `Tensor[]` / `Tensor?[]` argument;
* `(SCALAR, k, type)`: runtime scalar `k` of `node.scalars`.  Only its *type* is part of the
  identity, so a new learning rate does not recompile (LTC turns such scalars into device data);
* `(RNG, k)`: a `Generator?` argument, fed at execution from the seed `node.scalars[k]` drawn at
  trace time, so random values depend on the trace order, not on when the device runs.

`node.key` is the local identity (op + template).  Graph identity is computed by the executor
from a post-order walk (see `executor/compiler.py`: `GraphPlan`), which makes equal graphs compare equal exactly;
`node.hash` is the LTC-style DAG hash (op, template, operand hashes) for debugging and reuse.
"""
from __future__ import annotations

import struct
from typing import Any, NamedTuple

import torch


class Tag:
    """A marker in a node template; compared by identity, so no constant can collide with it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


TENSOR = Tag("T")
TENSOR_LIST = Tag("TL")
SCALAR = Tag("S")
RNG = Tag("G")
NUM = Tag("N")
DEVICE_DATA = Tag("device_data")  # the `op` of a node that stands for materialized device data


_PACK = struct.Struct("<d").pack
_NANS: dict[bytes, Any] = {}  # bits -> one NaN object per bit pattern: equal to itself by identity


def exact(v: Any) -> Any:
    """A number constant (or a list of them) as a template entry that compares exactly."""
    t = type(v)
    if t is int or t is bool:
        return (NUM, v, t)
    if t is float:
        bits = _PACK(v)
        if v != v:
            v = _NANS.setdefault(bits, v)
        return (NUM, v, bits)
    if t is complex:
        bits = _PACK(v.real) + _PACK(v.imag)
        if v != v:
            v = _NANS.setdefault(bits, v)
        return (NUM, v, bits)
    if (t is list or t is tuple) and v:
        codes = [exact(e) for e in v]
        return (NUM, tuple([c[1] if type(c) is tuple else c for c in codes]),
                tuple([c[2] if type(c) is tuple else c for c in codes]))
    return tuple(v) if t is list else v


def const_value(e: tuple) -> Any:
    """The value of an `exact()` template entry (lists come back as lists)."""
    v = e[1]
    return list(v) if type(v) is tuple else v


class TensorMeta(NamedTuple):
    """What shape inference knows of one output: enough to make the wrapper tensor."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


class Node:
    """One recorded op.  Nodes never change after construction (except `_hash`, a cache)."""

    __slots__ = ("op", "operands", "template", "scalars", "outputs", "out_spec", "key",
                 "data", "origin", "_hash", "__weakref__")

    def __init__(self, op: Any, operands: tuple, template: tuple, scalars: tuple,
                 outputs: tuple[TensorMeta, ...], out_spec: tuple, data: Any = None,
                 origin: str | None = None, op_key: str | None = None, key: tuple | None = None) -> None:
        self.op = op                # torch._ops.OpOverload, or DEVICE_DATA
        self.operands = operands    # tuple of (Node, output_index)
        self.template = template    # one entry per schema argument, see module docstring
        self.scalars = scalars      # runtime values for SCALAR / RNG entries (not in the key)
        self.outputs = outputs      # TensorMeta per flattened output
        self.out_spec = out_spec    # per schema return: None (one tensor) or n (Tensor[] of n)
        # The key is what makes two nodes interchangeable in a compiled graph.  Device data is
        # keyed by shape/dtype only, so new parameter values reuse the compiled graph.
        # (`op_key`, the op's qualified name, hashes faster than the OpOverload itself.)
        # (`key`, when given, is that `(op_key, template)` pair made once and shared by every
        # node of the signature: the tracer keeps it with the shape-cache entry.)
        if key is not None:
            self.key = key
        elif op is DEVICE_DATA:
            self.key = (op, outputs)
        else:
            self.key = (op_key or _op_key(op), template)
        self.data = data            # BackendData, for DEVICE_DATA nodes
        self.origin = origin        # "file:line" of the user code that traced it (debug mode)
        self._hash: int | None = None

    @property
    def is_data(self) -> bool:
        return self.op is DEVICE_DATA

    @property
    def hash(self) -> int:
        """DAG hash: covers the op, its template and (recursively) its operands."""
        h = self._hash
        if h is None:
            # Iterative to survive very deep chains (a 2000-op trace).
            stack = [self]
            while stack:
                n = stack[-1]
                pending = [o for o, _ in n.operands if o._hash is None]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                if n._hash is None:
                    n._hash = hash((n.key, tuple((o._hash, i) for o, i in n.operands)))
            h = self._hash
        return h

    @property
    def name(self) -> str:
        if self.op is DEVICE_DATA:
            return "device_data"
        return self.op.name()

    def __repr__(self) -> str:
        return f"Node({self.name}, outputs={[tuple(m.shape) for m in self.outputs]})"


def _op_key(op: Any) -> str:
    schema = op._schema
    return schema.name + ("." + schema.overload_name if schema.overload_name else "")


def make_data_node(data: Any, meta: TensorMeta) -> Node:
    """A leaf standing for existing (possibly still being computed) device data."""
    return Node(DEVICE_DATA, (), (), (), (meta,), (None,), data=data)


def post_order(roots: list[Node]) -> list[Node]:
    """Unique nodes reachable from `roots`, operands before users (iterative, deterministic)."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.operands))]
        while stack:
            node, it = stack[-1]
            for child, _ in it:
                if id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, iter(child.operands)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order
