"""IR invariants (`ltc_async.ir.lint`), one test per rule, and the node hashes."""
from __future__ import annotations

import pytest
import torch

import ltc_async as ltc
from ltc_async.executor.futures import BackendData
from ltc_async.ir.lint import IRLintError, lint
from ltc_async.ir.node import SCALAR, TENSOR, Node, TensorMeta, make_data_node
from ltc_async.tensor.lazy_tensor import unwrap

aten = torch.ops.aten
META = TensorMeta((2,), (1,), torch.float32)


def _data() -> Node:
    return make_data_node(BackendData(None, META, value=torch.zeros(2)), META)


def _add(a: Node, b: Node, **over) -> Node:
    kw = dict(op=aten.add.Tensor, operands=((a, 0), (b, 0)), template=((TENSOR, 0), (TENSOR, 1), 1),
              scalars=(), outputs=(META,), out_spec=(None,))
    kw.update(over)
    return Node(**kw)


def test_traced_graphs_pass_lint():
    x = torch.randn(4, 3).to("ltc:0")
    y = (torch.relu(x @ x.t()) * 0.5).softmax(-1)[0]
    inner = unwrap(y)
    lint([inner._v])
    assert inner._v[0].hash == inner._v[0].hash and isinstance(inner._v[0].hash, int)


def test_lint_root_index_out_of_range():
    n = _add(_data(), _data())
    with pytest.raises(IRLintError, match="output index"):
        lint([(n, 1)])


def test_lint_device_data_needs_data():
    bad = make_data_node(None, META)
    with pytest.raises(IRLintError, match="device data"):
        lint([(bad, 0)])


def test_lint_operand_missing_output():
    a = _data()
    n = _add(a, a, operands=((a, 0), (a, 3)))
    with pytest.raises(IRLintError, match="missing output"):
        lint([(n, 0)])


def test_lint_template_must_use_every_operand():
    a, b = _data(), _data()
    n = _add(a, b, template=((TENSOR, 0), (TENSOR, 0), 1))
    with pytest.raises(IRLintError, match="uses operands"):
        lint([(n, 0)])


def test_lint_template_must_use_every_scalar():
    a, b = _data(), _data()
    n = _add(a, b, template=((TENSOR, 0), (TENSOR, 1), (SCALAR, 0, float)), scalars=(1.0, 2.0))
    with pytest.raises(IRLintError, match="uses scalars"):
        lint([(n, 0)])


def test_lint_out_spec_matches_outputs():
    n = _add(_data(), _data(), out_spec=(2,))
    with pytest.raises(IRLintError, match="out_spec"):
        lint([(n, 0)])


def test_dag_hash_covers_structure_not_values():
    a1, b1 = _data(), _data()
    assert _add(a1, b1).hash == _add(_data(), _data()).hash       # shape/dtype, not values
    assert _add(a1, b1).hash != _add(a1, b1, template=((TENSOR, 0), (TENSOR, 1), 2)).hash
    x = torch.randn(3).to("ltc:0")
    assert ltc.debug.graph_hash([x * 2]) != ltc.debug.graph_hash([x + 2])


def test_exact_constants_key_by_type_and_bits():
    from ltc_async.ir.node import const_value, exact
    nan1, nan2 = float("nan"), float("nan")
    assert exact(1) != exact(1.0) != exact(True) and exact(1) != exact(True)
    assert exact(0.0) != exact(-0.0)
    assert exact(nan1) == exact(nan2) and exact(nan1) != exact(-nan1)   # NaN equals itself, by sign
    assert hash(exact(nan1)) == hash(exact(nan2))
    assert exact((1.0, -0.0)) != exact((1.0, 0.0)) and exact(()) == ()
    for v in (1, 1.0, True, -0.0, 2 ** 63, 1j, (0.5, 2.0)):
        back = const_value(exact(v))
        assert type(back) is (list if isinstance(v, tuple) else type(v))
        assert repr(back) == repr(list(v) if isinstance(v, tuple) else v)


def test_graph_keys_differ_for_constants_python_calls_equal():
    t = torch.tensor([1, -2, 3]).to("ltc:0")
    keys = {ltc.debug.graph_hash([t.clamp(min=v)]) for v in (0, 0.0)}
    keys.add(ltc.debug.graph_hash([]))  # what a result the eager fallback made hashes to
    assert len(keys) == 3
    x = torch.ones(2).to("ltc:0")
    assert ltc.debug.graph_hash([x.clamp(min=0.0)]) != ltc.debug.graph_hash([x.clamp(min=-0.0)])


def test_an_int_too_wide_for_int64_does_not_stop_later_calls_compiling():
    # regression (CI flake): clamp(min=2**63) failed TorchScript lowering, and the failure was
    # remembered for every int clamp, so later `clamp(min=0)` silently ran eagerly
    t = torch.tensor([1, -2, 3]).to("ltc:0")
    with pytest.raises(RuntimeError, match="int64"):
        t.clamp(min=2 ** 63)   # eager's own error, at the line
    r = t.clamp(min=0)
    assert ltc.debug.graph_hash([r]) != ltc.debug.graph_hash([])   # traced, not fallen back
    assert r.cpu().tolist() == [1, 0, 3]


def _plan_by_definition(roots):
    """What `GraphPlan` computes, written plainly: post-order, then each node's key part."""
    from ltc_async.ir.node import DEVICE_DATA, post_order
    order = post_order([n for n, _ in roots])
    pos = {id(n): i for i, n in enumerate(order)}
    parts = tuple(n.key if n.op is DEVICE_DATA else (n.key, tuple((pos[id(o)], i) for o, i in n.operands))
                  for n in order)
    return order, (parts, tuple((pos[id(n)], i) for n, i in roots))


@pytest.mark.parametrize("seed", range(30))
def test_graph_plan_orders_and_keys_random_dags_like_its_definition(seed):
    """Random DAGs: shared operands, an operand used twice (`a + a`), roots inside other roots'
    graphs, roots repeated."""
    from ltc_async.executor.compiler import GraphPlan
    g = torch.Generator().manual_seed(seed)

    def pick(k):
        return int(torch.randint(0, k, (1,), generator=g))
    nodes = [_data() for _ in range(1 + pick(3))]
    for k in range(pick(40)):
        a, b, c = (nodes[pick(len(nodes))] for _ in range(3))
        kind = pick(4)
        if kind == 0:     # three operands, a runtime scalar
            nodes.append(Node(op=aten.addcmul.default, operands=((a, 0), (b, 0), (c, 0)),
                              template=((TENSOR, 0), (TENSOR, 1), (TENSOR, 2), (SCALAR, 0, float)),
                              scalars=(0.5 * k,), outputs=(META,), out_spec=(None,)))
        elif kind == 1:   # no operands (a factory), a runtime scalar
            nodes.append(Node(op=aten.full.default, operands=(), template=((2,), (SCALAR, 0, float)),
                              scalars=(float(k),), outputs=(META,), out_spec=(None,)))
        else:
            nodes.append(_add(a, b, template=((TENSOR, 0), (TENSOR, 1), k)))
    roots = [(nodes[pick(len(nodes))], 0) for _ in range(1 + pick(4))]
    plan = GraphPlan(roots)
    order, key = _plan_by_definition(roots)
    assert [id(n) for n in plan.order] == [id(n) for n in order]
    assert plan.key == key
    assert plan.inputs == [v for n in order for v in ([n.data] if n.is_data else n.scalars)]
