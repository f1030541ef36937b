"""Lowering IR to a TorchScript graph (LTC's `TSLoweringContext` + `ts_node_lowering`).

Every IR node becomes one `aten::` node of a `torch._C.Graph`: TorchScript resolves the overload
from the argument types, so the lowering is generic; only argument *values* need translating
(lazy devices -> backing device, tuples -> lists, memory formats -> ints).  Graph inputs follow
`Backend.compile`'s order: device data, then each node's runtime scalars / RNG seeds.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch._C import BoolType, FloatType, IntType, ListType, OptionalType, TensorType

from ltc_async.ir.node import (
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
from ltc_async.ir.schema import op_info

_TENSOR = TensorType.get()
_GEN = torch._C._GeneratorType.get()
_SCALAR_JIT = {float: FloatType.get(), int: IntType.get(), bool: BoolType.get(),
               complex: torch._C.ComplexType.get()}   # `z * 1j`: a wrapped complex number
_ENUMS = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
          torch.channels_last_3d: 3, torch.strided: 0, torch.sparse_coo: 1}

# Input kinds recorded for `execute`.
IN_TENSOR, IN_SCALAR, IN_GENERATOR = 0, 1, 2


def _graph_op_name(op: torch._ops.OpOverload) -> str:
    """The aten name to emit: `OpInfo.compiled_as` (a view copy runs as its view)."""
    return op_info(op).compiled_as._schema.name


def _is_optional_list(t: torch._C.JitType) -> bool:
    if isinstance(t, OptionalType):
        t = t.getElementType()
    return isinstance(t, ListType) and isinstance(t.getElementType(), OptionalType)


def _bool_scalar(node: Node) -> tuple[int, int] | None:
    """(template index of a bool constant in a `Scalar` slot, index of the `dtype` argument) of
    an op like `full(size, True)`: TorchScript's Scalar holds no bool, so the bool lowers as an
    int with the output dtype made explicit (the dtype decides the result, not the number)."""
    args = node.op._schema.arguments
    dtype = next((k for k, a in enumerate(args) if a.name == "dtype"), None)
    if dtype is None:
        return None
    for k, e in enumerate(node.template):
        if (type(e) is tuple and e and e[0] is NUM and type(e[1]) is bool
                and isinstance(args[k].type, torch._C.NumberType)):
            return k, dtype
    return None


class TSLowering:
    """Builds one `torch._C.Graph` from a post-ordered IR graph."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.graph = torch._C.Graph()
        self.input_kinds: list[int] = []

    def constant(self, v: Any) -> torch._C.Value:
        if isinstance(v, torch.device):
            v = self.device if v.type == "ltc" else v
        elif isinstance(v, tuple):
            v = [self._plain(e) for e in v]
        else:
            v = self._plain(v)
        return self.graph.insertConstant(v)

    def empty_list(self, t: torch._C.JitType) -> torch._C.Value:
        """`[]` needs its element type, which TorchScript cannot infer from a constant."""
        if isinstance(t, OptionalType):
            t = t.getElementType()
        lc = self.graph.create("prim::ListConstruct", [], 1)
        self.graph.insertNode(lc)
        lc.output().setType(t if isinstance(t, ListType) else ListType.ofInts())
        return lc.output()

    def _plain(self, v: Any) -> Any:
        if isinstance(v, (torch.memory_format, torch.layout)):
            return _ENUMS[v]
        return v

    def input(self, jit_type: torch._C.JitType, kind: int) -> torch._C.Value:
        v = self.graph.addInput()
        v.setType(jit_type)
        self.input_kinds.append(kind)
        return v

    def emit(self, node: Node, operand_values: list[torch._C.Value],
             lifted: Sequence[tuple[int, int | None]] = ()) -> list[torch._C.Value]:
        """Insert the aten node for `node`; return its flattened tensor outputs.  `lifted`:
        (template index, list index or None) of int constants taken as graph inputs."""
        if not isinstance(node.op, torch._ops.OpOverload):  # a captured graph: its body inline
            return node.op.lower(self, node, operand_values)
        g = self.graph
        scalar_vals: dict[int, torch._C.Value] = {}
        for e in node.template:  # scalar inputs in index order == template order
            if type(e) is tuple and e:
                if e[0] is SCALAR:
                    scalar_vals[e[1]] = self.input(_SCALAR_JIT[e[2]], IN_SCALAR)
                elif e[0] is RNG:
                    scalar_vals[e[1]] = self.input(OptionalType(_GEN), IN_GENERATOR)
        ints: dict[int, dict[int | None, torch._C.Value]] = {}
        for k, i in lifted:      # after the scalars, in (template, list) order
            ints.setdefault(k, {})[i] = self.input(IntType.get(), IN_SCALAR)
        args = []
        schema_args = node.op._schema.arguments
        bool_scalar = _bool_scalar(node)
        for k, e in enumerate(node.template):
            if k in ints:
                args.append(self._int_arg(e, ints[k]))
            elif type(e) is tuple and e and type(e[0]) is Tag:
                tag = e[0]
                if tag is TENSOR:
                    args.append(operand_values[e[1]])
                elif tag is TENSOR_LIST:
                    # `Tensor?[]` keeps its type without Nones too (`index.Tensor`, not the
                    # `Tensor[]` overload TorchScript would pick otherwise)
                    optional = any(r is None for r in e[1]) or _is_optional_list(schema_args[k].type)
                    items = [g.insertConstant(None) if r is None else operand_values[r] for r in e[1]]
                    lc = g.create("prim::ListConstruct", items, 1)
                    g.insertNode(lc)
                    lc.output().setType(ListType(OptionalType(_TENSOR)) if optional else ListType.ofTensors())
                    args.append(lc.output())
                elif tag is NUM:
                    v = const_value(e)
                    if bool_scalar and k == bool_scalar[0]:
                        v = int(v)  # TorchScript has no bool Scalar: the dtype says bool (below)
                    args.append(self._number_arg(node, k, self.constant(v)))
                elif tag is SCALAR:
                    args.append(self._number_arg(node, k, scalar_vals[e[1]]))
                else:  # RNG
                    args.append(scalar_vals[e[1]])
            elif type(e) is tuple and not e:
                args.append(self.empty_list(schema_args[k].type))
            elif bool_scalar and k == bool_scalar[1] and e is None:
                args.append(self.constant(node.outputs[0].dtype))  # the dtype the bool implied
            else:
                args.append(self.constant(e))
        schema = node.op._schema
        n = g.create(_graph_op_name(node.op), args, len(schema.returns))
        g.insertNode(n)
        outs: list[torch._C.Value] = []
        for r, spec in enumerate(node.out_spec):
            v = n.outputsAt(r)
            if spec is None:
                v.setType(_TENSOR)
                outs.append(v)
            elif spec is False:
                v.setType(OptionalType(_TENSOR))
            else:
                v.setType(ListType.ofTensors())
                un = g.create("prim::ListUnpack", [v], spec)
                g.insertNode(un)
                for o in un.outputs():
                    o.setType(_TENSOR)
                    outs.append(o)
        return outs

    def _number_arg(self, node: Node, k: int, value: torch._C.Value) -> torch._C.Value:
        """A Python number in argument `k`.  In a Tensor `self` (`7 // t` is `floor_divide(7, t)`)
        no `.Scalar` twin takes it, as TorchScript resolves numbers in `other`: it becomes a
        0-dim tensor of the result's dtype, what eager computes in after promoting the number."""
        if k != 0 or not isinstance(node.op._schema.arguments[0].type, torch._C.TensorType):
            return value
        n = self.graph.create("aten::scalar_tensor", [value, self.constant(node.outputs[0].dtype),
                                                      self.constant(None), self.constant(self.device),
                                                      self.constant(None)], 1)
        self.graph.insertNode(n)
        n.output().setType(_TENSOR)
        return n.output()

    def _int_arg(self, e: Any, inputs: dict[int | None, torch._C.Value]) -> torch._C.Value:
        """An int (or `int[]`) argument some of whose ints are graph inputs."""
        if None in inputs:
            return inputs[None]
        values = const_value(e) if type(e[0]) is Tag else e
        items = [inputs[i] if i in inputs else self.graph.insertConstant(v) for i, v in enumerate(values)]
        lc = self.graph.create("prim::ListConstruct", items, 1)
        self.graph.insertNode(lc)
        lc.output().setType(ListType.ofInts())
        return lc.output()

    def lower(self, order: list[Node], roots: list[tuple[Node, int]],
              lifted: Sequence[tuple[int, int, int | None]] = ()) -> torch._C.Graph:
        by_node: dict[int, list[tuple[int, int | None]]] = {}
        for j, k, i in lifted:
            by_node.setdefault(j, []).append((k, i))
        env: dict[int, list[torch._C.Value]] = {}
        for j, node in enumerate(order):
            if node.op is DEVICE_DATA:
                env[id(node)] = [self.input(_TENSOR, IN_TENSOR)]
            else:
                env[id(node)] = self.emit(node, [env[id(o)][i] for o, i in node.operands],
                                          by_node.get(j, ()))
        outs = [env[id(n)][i] for n, i in roots]
        g = self.graph
        # The program also returns its tensor inputs, after its outputs (`TSComputation`
        # drops them): the interpreter then keeps each input until the end, and the last C++
        # reference to a tensor that Python owns is released with the GIL held, on return.
        # Otherwise the interpreter frees an input at its last use, inside the call, and
        # PyTorch must take the GIL there to drop the Python object's reference: the device
        # worker then stalls mid-graph, once per input, for as long as the tracing thread
        # keeps the GIL (up to `sys.getswitchinterval()`, 5 ms, each time).
        self.n_outputs = len(outs)
        outs = outs + [v for v, k in zip(g.inputs(), self.input_kinds) if k == IN_TENSOR]
        tup = g.create("prim::TupleConstruct", outs, 1)
        g.insertNode(tup)
        tup.output().setType(torch._C.TupleType([_TENSOR] * len(outs)))
        g.registerOutput(tup.output())
        return g
