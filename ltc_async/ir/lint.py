"""`lint(roots)`: check the IR invariants the executor and the backends rely on.

Cheap enough for tests and debugging (`LTC_ASYNC_IR_DEBUG`), not run on the hot path.  Each
violation raises `IRLintError` naming the node and the broken rule.
"""
from __future__ import annotations

from .node import DEVICE_DATA, RNG, SCALAR, TENSOR, TENSOR_LIST, Node, Tag, post_order


class IRLintError(AssertionError):
    """An IR invariant does not hold."""


def lint(roots: list[tuple[Node, int]]) -> None:
    order = post_order([n for n, _ in roots])
    position = {id(n): k for k, n in enumerate(order)}
    for n, i in roots:
        if not 0 <= i < len(n.outputs):
            raise IRLintError(f"root ({n}, {i}): output index out of range ({len(n.outputs)} outputs)")
    for k, n in enumerate(order):
        if n.op is DEVICE_DATA:
            if n.operands or n.data is None:
                raise IRLintError(f"{n}: device data must have data and no operands")
            continue
        used: set[int] = set()
        scalar_slots: set[int] = set()
        for o, i in n.operands:
            if position[id(o)] >= k:
                raise IRLintError(f"{n}: operand {o} does not come before it in post-order")
            if not 0 <= i < len(o.outputs):
                raise IRLintError(f"{n}: operand ({o}, {i}) names a missing output")
        for e in n.template:
            if type(e) is tuple and e and type(e[0]) is Tag:
                if e[0] is TENSOR:
                    used.add(e[1])
                elif e[0] is TENSOR_LIST:
                    used.update(r for r in e[1] if r is not None)
                elif e[0] is SCALAR or e[0] is RNG:
                    scalar_slots.add(e[1])
        if used != set(range(len(n.operands))):
            raise IRLintError(f"{n}: template uses operands {sorted(used)} of {len(n.operands)}")
        if scalar_slots != set(range(len(n.scalars))):
            raise IRLintError(f"{n}: template uses scalars {sorted(scalar_slots)} of {len(n.scalars)}")
        n_out = sum(1 if s is None else (0 if s is False else s) for s in n.out_spec)
        if n_out != len(n.outputs):
            raise IRLintError(f"{n}: out_spec {n.out_spec} describes {n_out} outputs, node has {len(n.outputs)}")
