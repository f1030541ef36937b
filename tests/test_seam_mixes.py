"""The generated seam test (`seam_mixes.py`) under pytest: every op of op_db whose call takes two
or more tensors, each mix of ltc and CPU tensors against what eager CUDA does with it.  No
mismatch and no INTERNAL ASSERT is allowed; `python tests/seam_mixes.py` prints the figures."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seam_mixes  # noqa: E402

import ltc_async  # noqa: E402,F401

_BY_OP: dict[str, list] = {}
for _name, _op, _sample, _mix in seam_mixes.cases():
    _BY_OP.setdefault(_name, []).append((_op, _sample, _mix))


@pytest.mark.parametrize("name", sorted(_BY_OP))
def test_op_mixes_ltc_and_cpu_tensors_like_eager_cuda(name):
    bad = []
    for op, sample, mix in _BY_OP[name]:
        status, detail = seam_mixes.run_one(op, sample, mix)
        if status != "pass":
            bad.append(f"{status} [{mix}]: {detail}")
    assert not bad, "\n".join(bad)
