"""CI subset of the op_db conformance run (the full run: `make conformance`).

Runs PyTorch's OpInfo samples for a representative set of ops on ltc:0 against eager,
forward and backward, in crash-isolated worker processes, and requires: no wrong result ever,
and no error or crash outside the reviewed expected-failure list.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("expecttest")   # op_db imports it; it is in the test extras

import opdb_conformance as conf  # noqa: E402
from conformance_expected import EXPECTED_FAILURES  # noqa: E402

SUBSET = [
    # elementwise, promotion, scalars
    "add", "sub", "mul", "div", "true_divide", "pow", "exp", "log", "tanh", "sigmoid", "abs", "neg",
    "clamp", "where", "maximum", "eq", "lt", "lerp", "addcmul", "nn.functional.gelu", "nn.functional.silu",
    # reductions
    "sum", "mean", "amax", "argmax", "prod", "std", "var", "logsumexp", "softmax", "log_softmax",
    "cumsum", "norm",
    # linear algebra
    "mm", "bmm", "addmm", "matmul", "einsum", "nn.functional.linear", "nn.functional.conv2d",
    # views, shapes, indexing
    "view", "reshape", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand", "flatten",
    "narrow", "chunk", "split", "cat", "stack", "index_select", "gather", "scatter", "index_put",
    "masked_fill", "__getitem__", "take_along_dim",
    # casts, factories, random, data-dependent
    "to", "zeros_like", "full_like", "arange", "linspace", "nn.functional.dropout", "bernoulli",
    "nonzero", "masked_select", "unique", "sort", "topk",
    # nn
    "nn.functional.cross_entropy", "nn.functional.layer_norm", "nn.functional.batch_norm",
    "nn.functional.embedding", "nn.functional.max_pool2d", "nn.functional.scaled_dot_product_attention",
]


def _key(r: dict) -> str:
    return r["op"]


def test_opdb_subset_matches_eager():
    records = conf.run("ltc", ",".join(SUBSET), chunk=20, op_timeout=120, max_samples=4, quiet=True)
    assert records, "the conformance run produced no samples"
    ran = {r["op"] for r in records}
    assert len(ran) >= 60, f"only {len(ran)} ops ran"
    wrong = [r for r in records if "mismatch" in (r.get("fwd"), r.get("bwd"))]
    assert not wrong, "WRONG RESULTS:\n" + "\n".join(f"{r['op']} {r['dtype']} #{r['sample']}: {r.get('why')}"
                                                      for r in wrong)
    unexpected = [r for r in records if (r.get("fwd") in ("error", "crash") or r.get("bwd") == "error")
                  and _key(r) not in EXPECTED_FAILURES]
    assert not unexpected, "unexpected errors:\n" + "\n".join(
        f"{r['op']} {r['dtype']} #{r['sample']}: {r.get('why')}" for r in unexpected)
    summary = conf.summarize(records)
    assert summary["forward"].get("pass", 0) > 500
    assert summary["backward"].get("pass", 0) > 150
