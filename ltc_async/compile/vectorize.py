"""Foreach ops over lists of 0-dim tensors become one elementwise op over a 1-D tensor.

Design note.  Under Dynamo, `torch.optim`'s foreach implementations compute per-parameter
scalars as lists of 0-dim tensors: Adam's bias corrections are `_foreach_pow(beta, steps)`,
`_foreach_sub`, `_foreach_neg`, `_foreach_div`, `_foreach_reciprocal`, `_foreach_sqrt`, ...
each one kernel per parameter.  Inductor fuses them; TorchScript on the CPU runs every element
as its own kernel call (type promotion, allocation, a TensorIterator), which made those
scalars the largest part of a tiny transformer's compiled AdamW step.

This pass rewrites such a foreach node into the elementwise op it stands for, applied to the
list stacked into a 1-D tensor: `_foreach_pow.ScalarAndTensor(b, [s0, s1, ...])` becomes
`pow.Scalar(b, S)`, and `getitem(node, i)` becomes `select(result, 0, i)`.  A list that is
exactly the elements of an already vectorized node, or consecutive `select`s of one 1-D tensor
(the packed host values of `split.py`), is used as that vector without stacking.  Elementwise
kernels compute each element as the per-element kernel does, so values are unchanged.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

aten = torch.ops.aten

# foreach overload -> (elementwise overload, how its arguments map): "unary" (list),
# "scalar" (list, scalar), "rscalar" (scalar, list), "list" (list, list, **kwargs)
_RULES: dict[Any, tuple[Any, str]] = {}


def _rule(name: str, overload: str, target: Any, form: str) -> None:
    packet = getattr(aten, name, None)
    op = getattr(packet, overload, None) if packet is not None else None
    if op is not None and target is not None:
        _RULES[op] = (target, form)


for _n in ("neg", "sqrt", "reciprocal", "abs", "exp", "log", "sign", "sigmoid", "tanh", "rsqrt"):
    _rule(f"_foreach_{_n}", "default", getattr(aten, _n).default, "unary")
for _n in ("add", "sub", "mul", "div"):
    _rule(f"_foreach_{_n}", "Scalar", getattr(aten, _n).Scalar, "scalar")
    _rule(f"_foreach_{_n}", "List", getattr(aten, _n).Tensor, "list")
_rule("_foreach_pow", "Scalar", aten.pow.Tensor_Scalar, "scalar")
_rule("_foreach_pow", "ScalarAndTensor", aten.pow.Scalar, "rscalar")
_rule("_foreach_pow", "List", aten.pow.Tensor_Tensor, "list")
_rule("_foreach_maximum", "Scalar", aten.clamp_min.default, "scalar")
_rule("_foreach_minimum", "Scalar", aten.clamp_max.default, "scalar")


def _scalar_list(v: Any) -> torch.dtype | None:
    """The dtype of a list of 0-dim tensors of one dtype (a node's `meta["val"]`), else None."""
    if not isinstance(v, (list, tuple)) or not v:
        return None
    if not all(isinstance(t, torch.Tensor) and t.dim() == 0 for t in v):
        return None
    dtypes = {t.dtype for t in v}
    return dtypes.pop() if len(dtypes) == 1 else None


def vectorize_scalar_foreach(gm: fx.GraphModule) -> int:
    """Rewrite `gm` in place (see the module note); the number of foreach nodes rewritten."""
    g = gm.graph
    vectors: dict[fx.Node, fx.Node] = {}   # vectorized foreach node -> its 1-D result
    rewritten = 0

    def vector_of(items: Any, dtype: torch.dtype, before: fx.Node) -> fx.Node | None:
        if not isinstance(items, (list, tuple)) or not items or not all(isinstance(a, fx.Node) for a in items):
            return None
        first = items[0]
        # elements 0..n-1 of a vectorized node, in order
        if first.op == "call_function" and first.target is operator.getitem and first.args[0] in vectors:
            src = first.args[0]
            if all(a.op == "call_function" and a.target is operator.getitem and a.args[0] is src
                   and a.args[1] == i for i, a in enumerate(items)) and len(items) == len(src.meta["val"]):
                return vectors[src]
        # consecutive selects of one 1-D tensor
        if first.op == "call_function" and first.target is aten.select.int:
            base, dim, k0 = first.args
            bv = base.meta.get("val") if isinstance(base, fx.Node) else None
            if dim == 0 and isinstance(bv, torch.Tensor) and bv.dim() == 1 and bv.dtype == dtype and all(
                    a.op == "call_function" and a.target is aten.select.int and a.args[0] is base
                    and a.args[1] == 0 and a.args[2] == k0 + i for i, a in enumerate(items)):
                if k0 == 0 and len(items) == bv.shape[0]:
                    return base
                with g.inserting_before(before):
                    return g.call_function(aten.slice.Tensor, (base, 0, k0, k0 + len(items)))
        if not all(isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dim() == 0
                   and a.meta["val"].dtype == dtype for a in items):
            return None
        with g.inserting_before(before):
            return g.call_function(aten.stack.default, (list(items),))

    for node in list(g.nodes):
        if node.op != "call_function" or node.target not in _RULES:
            continue
        dtype = _scalar_list(node.meta.get("val"))
        if dtype is None:
            continue
        target, form = _RULES[node.target]
        args = node.args
        if form in ("unary", "scalar", "list"):
            lists = [args[0]] + ([args[1]] if form == "list" else [])
        else:
            lists = [args[1]]
        in_dtypes = {_scalar_list([a.meta.get("val") for a in lst]) if isinstance(lst, (list, tuple))
                     and all(isinstance(a, fx.Node) for a in lst) else None for lst in lists}
        if None in in_dtypes or len({len(lst) for lst in lists}) != 1:
            continue
        vecs = [vector_of(lst, next(iter(in_dtypes)) if len(in_dtypes) == 1 else dtype, node)
                for lst in lists]
        if any(v is None for v in vecs):
            continue
        with g.inserting_before(node):
            if form == "unary":
                out = g.call_function(target, (vecs[0],))
            elif form == "scalar":
                out = g.call_function(target, (vecs[0], args[1]))
            elif form == "rscalar":
                out = g.call_function(target, (args[0], vecs[0]))
            else:
                out = g.call_function(target, (vecs[0], vecs[1]), dict(node.kwargs))
        vectors[node] = out
        out.meta["val"] = torch.empty(len(node.meta["val"]), dtype=dtype, device="meta")
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                with g.inserting_before(user):
                    sel = g.call_function(aten.select.int, (out, 0, user.args[1]))
                sel.meta["val"] = user.meta.get("val")
                user.replace_all_uses_with(sel)
        rewritten += 1
    if rewritten:
        g.eliminate_dead_code()
        g.lint()
        gm.recompile()
    return rewritten
