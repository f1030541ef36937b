"""IR dumps and graph hashes (LTC's `ir_dump_util`, `torch._lazy.debug`)."""
from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from .executor import arena
from .executor import graph_executor as gx
from .ir.node import DEVICE_DATA, NUM, RNG, SCALAR, TENSOR, TENSOR_LIST, Node, Tag, const_value, post_order
from .tensor.lazy_tensor import unwrap

__all__ = ["dump_ir", "graph_hash"]


def _roots(tensors: Sequence[torch.Tensor]) -> list[tuple[Node, int]]:
    roots: list[tuple[Node, int]] = []
    for t in tensors:
        inner = unwrap(t)
        if inner._v not in roots:
            roots.append(inner._v)
    return roots


def _fmt_arg(e: object, names: dict[tuple[int, int], str], node: Node) -> str:
    if type(e) is tuple and e and type(e[0]) is Tag:
        if e[0] is TENSOR:
            o, i = node.operands[e[1]]
            return names[(id(o), i)]
        if e[0] is TENSOR_LIST:
            return "[" + ", ".join("None" if r is None else names[(id(node.operands[r][0]), node.operands[r][1])]
                                   for r in e[1]) + "]"
        if e[0] is SCALAR:
            return f"scalar<{e[2].__name__}>={node.scalars[e[1]]!r}"
        if e[0] is RNG:
            return f"rng_seed={node.scalars[e[1]]}"
        if e[0] is NUM:
            return repr(const_value(e))
    return repr(e)


def dump_ir(tensors: Sequence[torch.Tensor], fmt: str = "text") -> str:
    """The pending IR graph producing `tensors`: `fmt` is "text", "dot" (Graphviz) or
    "backend" (the backend's lowered program, e.g. TorchScript IR)."""
    roots = _roots(tensors)
    if fmt == "backend":
        order = post_order([n for n, _ in roots])
        ctx = unwrap(tensors[0])._ctx
        return ctx.backend.compile(order, roots, ctx.backend_device).backend_text
    order = post_order([n for n, _ in roots])
    names: dict[tuple[int, int], str] = {}
    lines = []
    for k, n in enumerate(order):
        outs = []
        for i, m in enumerate(n.outputs):
            names[(id(n), i)] = f"%{k}" if len(n.outputs) == 1 else f"%{k}.{i}"
            outs.append(f"{names[(id(n), i)]}: {str(m.dtype).replace('torch.', '')}{list(m.shape)}")
        if n.op is DEVICE_DATA:
            body = "device_data()"
        else:
            body = f"{n.name}({', '.join(_fmt_arg(e, names, n) for e in n.template)})"
        origin = f"  # {n.origin}" if n.origin else ""
        lines.append(f"  {', '.join(outs)} = {body}{origin}")
    if fmt == "text":
        roots_s = ", ".join(names[(id(n), i)] for n, i in roots)
        return "IR {\n" + "\n".join(lines) + f"\n  ROOT: ({roots_s})\n}}\n"
    if fmt == "dot":
        dot = ["digraph G {"]
        for k, n in enumerate(order):
            shape = "box" if n.op is DEVICE_DATA else "ellipse"
            dot.append(f'  node{k} [label="{n.name}\\n{[list(m.shape) for m in n.outputs]}", shape={shape}]')
        pos = {id(n): k for k, n in enumerate(order)}
        for k, n in enumerate(order):
            for j, (o, i) in enumerate(n.operands):
                dot.append(f'  node{pos[id(o)]} -> node{k} [label="o{i}->i{j}"]')
        dot.append("}")
        return "\n".join(dot) + "\n"
    raise ValueError(f"dump_ir: unknown fmt {fmt!r}; use 'text', 'dot' or 'backend'")


def graph_hash(tensors: Sequence[torch.Tensor]) -> str:
    """A hex digest of the exact graph key `mark_step` would compile these tensors under."""
    roots = _roots(tensors)
    pending = [(n, i) for n, i in roots if n.op is not DEVICE_DATA]
    key = gx.GraphPlan(pending).key if pending else ()
    return hashlib.sha1(repr(_stable(key)).encode()).hexdigest()


def _stable(x: object) -> object:
    """A process-independent rendering of a graph key (ops by name, tags by name)."""
    if isinstance(x, tuple):
        return tuple(_stable(e) for e in x)
    if isinstance(x, torch._ops.OpOverload):
        return str(x)
    if isinstance(x, type):
        return x.__name__
    return x


del arena
