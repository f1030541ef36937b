"""The seam test, generated: every op of PyTorch's OpInfo database (`op_db`) whose call takes two
or more tensors, called with ltc and CPU tensors mixed, against what eager does for the same
mix of CUDA and CPU tensors.

    python tests/seam_mixes.py                 # every op, a summary and the mismatches
    python tests/seam_mixes.py --ops add,where # a subset

For each op, its first float32 sample whose call has two or more tensors gives four mixes:

  ltc,cpu0    the first tensor on ltc, the next one a CPU 0-dim tensor (its first element)
  cpu0,ltc    the first tensor a CPU 0-dim tensor, the rest on ltc
  ltc,cpu     the first tensor on ltc, the next one a full CPU tensor
  cpu_self    the op's in-place variant on a CPU `self`, the other tensors on ltc

What eager CUDA does with a mix is decided without a GPU from PyTorch's own descriptions of it:

1. the device check PyTorch generates into the CUDA wrapper of every op with a backend kernel
   not declared `device_check: NoCheck` in `native_functions.yaml` (every tensor on one device,
   CPU 0-dim tensors included): the all-CPU call runs under a dispatch mode that sees each aten
   op after composite decomposition, as a CUDA run would, and a CPU tensor of the mix reaching
   such an op means eager CUDA refuses;
2. otherwise PyTorch's FakeTensor model, which torch.compile uses to reproduce eager on CUDA:
   the same call on FakeTensors on a fake "cuda" device;
3. `_FAKE_DISAGREES` (`_FAKE_DISAGREES_MIX`: for one mix): ops where that model accepts what
   the CUDA kernel refuses, each with the check that refuses it.

Where eager CUDA accepts, ltc must give the values eager gives on CPU tensors (the same call,
every tensor on the CPU); where it refuses, ltc must raise a RuntimeError and leave the CPU
tensors unchanged; where the fake run cannot tell (an op it cannot run without a GPU), ltc must
do one of the two.  Always: no INTERNAL ASSERT or "Internal error" text, no other exception
type than eager's.  A mix whose all-CPU call fails must fail on ltc too.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

MIXES = ("ltc,cpu0", "cpu0,ltc", "ltc,cpu", "cpu_self")
_INTERNAL = ("INTERNAL ASSERT", "Internal error", "please report a bug to PyTorch")
# ops whose results are not values (uninitialized memory) or whose eager result depends on the
# host generator: nothing to compare values with
_SKIP = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_permuted", "empty_strided",
         "bernoulli", "multinomial", "normal", "rand_like", "randint_like", "randn_like",
         "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
         "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
         "nn.functional.rrelu", "uniform", "cauchy", "exponential", "geometric", "log_normal",
         "bfloat16", "byte", "char", "double", "float", "half", "int", "long", "short", "bool",
         "cdouble", "cfloat", "chalf", "to", "item", "tolist", "equal", "allclose",
         "nn.functional.multi_head_attention_forward", "svd_lowrank", "pca_lowrank",
         "sparse.sampled_addmm", "sparse.mm", "to_sparse", "nonzero_static", "jiterator"}


# grown memory is uninitialized: shapes and dtypes only
_SHAPE_ONLY = {"resize_as_"}


def _leaves(sample: Any) -> tuple[list, Any]:
    return tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))


def _tensors(leaves: list) -> list[int]:
    return [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]


def cases(names: set[str] | None = None) -> list[tuple[str, Any, Any, str]]:
    """(op name, OpInfo, sample, mix) for every op with a sample taking two or more tensors."""
    from torch.testing._internal.common_methods_invocations import op_db
    found = []
    for op in op_db:
        full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
        if op.name in _SKIP or op.name.startswith("_") or (names and op.name not in names and full not in names):
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
            sample = next((s for s in samples if len(_tensors(_leaves(s)[0])) >= 2
                           and all(v.device.type == "cpu" for v in _leaves(s)[0]
                                   if isinstance(v, torch.Tensor))), None)
        except Exception:  # noqa: BLE001 - a sample generator that needs something absent
            continue
        if sample is None:
            continue
        for mix in MIXES:
            if mix == "cpu_self" and op.inplace_variant is None:
                continue
            found.append((full, op, sample, mix))
    return found


def _arrange(leaves: list, mix: str, lazy: Any, host_scalar: bool) -> list:
    """The sample's leaves for a mix: `lazy(t)` places a tensor on the lazy side; the tensor
    the mix puts on the CPU stays there (as a 0-dim tensor for the cpu0 mixes)."""
    idx = _tensors(leaves)
    first, second = idx[0], idx[1]
    out = list(leaves)
    for i in idx:
        t = leaves[i]
        zero = t.reshape(-1)[0].clone() if t.numel() else torch.zeros((), dtype=t.dtype)
        if mix == "ltc,cpu0":
            out[i] = zero if i == second else lazy(t)
        elif mix == "cpu0,ltc":
            out[i] = zero if i == first else lazy(t)
        elif mix == "ltc,cpu":
            out[i] = t.clone() if i == second else lazy(t)
        else:  # cpu_self
            out[i] = t.clone() if i == first else lazy(t)
    return out


def _call(op: Any, mix: str, leaves: list, spec: Any) -> Any:
    inp, args, kwargs = tree_unflatten(leaves, spec)
    fn = op.inplace_variant if mix == "cpu_self" else op.op
    return fn(inp, *args, **kwargs)


# FakeTensor accepts these mixes; eager CUDA's kernels refuse them
_FAKE_DISAGREES = {
    # `_convolution` checks "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor)
    # should be the same"
    "nn.functional.conv1d": False, "nn.functional.conv2d": False, "nn.functional.conv3d": False,
    "nn.functional.conv_transpose1d": False, "nn.functional.conv_transpose2d": False,
    "nn.functional.conv_transpose3d": False,
    # a TensorIterator kernel (`masked_scale`): all operands on the device
    "native_dropout_backward": False,
    # TensorShape.cpp: "torch.block_diag: input tensors must all be on the same device"
    "block_diag": False,
    # its matmul runs on the two devices
    "nn.functional.linear_cross_entropy.chunked": False,
    "nn.functional.linear_cross_entropy.chunked_none": False,
}
# FakeTensor refuses these mixes; eager CUDA takes them (composite kernels that copy the source:
# `output = self.clone(); output.select(dim, index).copy_(src)`)
_FAKE_DISAGREES.update({"select_scatter": True,
                        # LossCTC.cpp: "if the targets are on CPU (which you need for CuDNN, let's
                        # move them to GPU as a service for the user)"
                        "nn.functional.ctc_loss": True})
# ... and one mix of ops that PyTorch 2.11's FakeTensor accepts: a CPU `self` written from CUDA
# operands (2.13's refuses it, as the CUDA kernel's generated wrapper does: "Expected all
# tensors to be on the same device")
_FAKE_DISAGREES_MIX = {("index_add", "cpu_self"): False, ("index_copy", "cpu_self"): False}
_CHECKED: set[str] | None = None


def _codegen_checked() -> set[str]:
    """Ops whose generated CUDA wrapper checks that every tensor is on one device."""
    global _CHECKED
    if _CHECKED is None:
        import os
        import torchgen
        import yaml
        path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native",
                            "native_functions.yaml")
        with open(path) as f:
            entries = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        _CHECKED = set()
        for e in entries:
            backend = "structured_delegate" in e or e.get("structured") or any(
                k.strip() in ("CPU", "CUDA") for keys in (e.get("dispatch") or {}) for k in keys.split(","))
            if backend and e.get("device_check") != "NoCheck":
                _CHECKED.add(e["func"].split("(")[0])
    return _CHECKED


def _reaches_checked_op(op: Any, sample: Any, mix: str) -> bool:
    """Does a CPU tensor of the mix reach an op with a generated device check (all-CPU run)?"""
    from torch.utils._python_dispatch import TorchDispatchMode
    leaves, spec = _leaves(sample)
    mixed = _arrange(leaves, mix, lambda t: t.clone(), True)
    idx = _tensors(mixed)
    host = {id(mixed[idx[1]]) if mix in ("ltc,cpu0", "ltc,cpu") else id(mixed[idx[0]])}
    checked = _codegen_checked()
    hit = []
    # the generated check fails only where an op gets tensors of two devices: the host tensor
    # and any other (on CUDA every other tensor of the call, and all it derives, is on the GPU)

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.split("::")[-1] + (
                "." + func._schema.overload_name if func._schema.overload_name else "")
            flat, _ = tree_flatten((args, kwargs or {}))
            tensors = [v for v in flat if isinstance(v, torch.Tensor)]
            if name in checked and any(id(v) in host for v in tensors) and \
                    any(id(v) not in host for v in tensors):
                hit.append(name)
            return func(*args, **(kwargs or {}))
    try:
        with Watch():
            _call(op, mix, mixed, spec)
    except Exception:  # noqa: BLE001
        pass
    return bool(hit)


_FAKE_UNDECIDED = ("not linked with support for cuda", "DataDependentOutput", "DynamicOutputShape",
                   "Unsupported", "unsupported", "Cannot", "meta", "Meta", "not implemented",
                   "NotImplemented", "aten::", "out=", "fake")


def eager_cuda_accepts(op: Any, sample: Any, mix: str) -> bool | None:
    """True/False: eager CUDA accepts / refuses the mix (see the module docstring); None: this
    cannot be told without a GPU."""
    full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
    if full in _FAKE_DISAGREES or op.name in _FAKE_DISAGREES:
        return _FAKE_DISAGREES.get(full, _FAKE_DISAGREES.get(op.name))
    if (op.name, mix) in _FAKE_DISAGREES_MIX:
        return _FAKE_DISAGREES_MIX[op.name, mix]
    if mix != "cpu_self" and _reaches_checked_op(op, sample, mix):
        return False
    from torch._subclasses.fake_tensor import FakeTensorMode
    leaves, spec = _leaves(sample)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            fake = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in leaves]
            mixed = _arrange(fake, mix, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                                       device="cuda"), True)
            _call(op, mix, mixed, spec)
        return True
    except Exception as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        if "Expected all tensors to be on the same device" in text or "DeviceMismatch" in text:
            return False
        return None


def run_one(op: Any, sample: Any, mix: str, device: str = "ltc:0") -> tuple[str, str]:
    """(status, detail): status one of pass, mismatch, internal."""
    import ltc_async as ltc
    leaves, spec = _leaves(sample)
    # the eager reference: the same call with every tensor on the CPU
    ref_leaves = _arrange(leaves, mix, lambda t: t.clone(), True)
    try:
        want = _call(op, mix, ref_leaves, spec)
        want_err = None
    except Exception as e:  # noqa: BLE001
        want, want_err = None, e
    accepts = None if want_err is not None else eager_cuda_accepts(op, sample, mix)
    mixed = _arrange(leaves, mix, lambda t: t.clone().to(device), True)
    host_before = [v.clone() for v in mixed if isinstance(v, torch.Tensor) and v.device.type == "cpu"]
    try:
        got = _call(op, mix, mixed, spec)
        got = tree_map(lambda v: v.cpu() if isinstance(v, torch.Tensor) else v, got)
        ltc.wait_device_ops()
        got_err = None
    except Exception as e:  # noqa: BLE001
        got, got_err = None, e
    if got_err is not None and any(s in str(got_err) for s in _INTERNAL):
        return "internal", f"{type(got_err).__name__}: {str(got_err).splitlines()[0][:200]}"
    if want_err is not None:
        if got_err is None:
            return "mismatch", f"eager (all CPU) raised {type(want_err).__name__}, ltc accepted"
        return "pass", "both raise"
    if accepts is False:
        if got_err is None:
            return "mismatch", "eager CUDA refuses this mix, ltc accepted"
        if not isinstance(got_err, RuntimeError):
            return "mismatch", f"refused with {type(got_err).__name__}, not RuntimeError: {got_err}"
        after = [v for v in mixed if isinstance(v, torch.Tensor) and v.device.type == "cpu"]
        if not all(torch.equal(a, b) or (a.isnan().any() and torch.allclose(a, b, equal_nan=True))
                   for a, b in zip(after, host_before)):
            return "mismatch", "refused, but a CPU tensor was written"
        return "pass", "refused like eager CUDA"
    if got_err is not None:
        if accepts is None and isinstance(got_err, RuntimeError):
            return "pass", "refused (eager CUDA undecided)"
        return "mismatch", f"eager CUDA accepts, ltc raised {type(got_err).__name__}: {str(got_err)[:200]}"
    if op.name in _SHAPE_ONLY:
        got_l, want_l = tree_flatten(got)[0], tree_flatten(want)[0]
        same = all((a.shape, a.dtype) == (b.shape, b.dtype) for a, b in zip(got_l, want_l))
        return ("pass", "same shapes") if same else ("mismatch", "shapes differ")
    try:
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-5, check_device=False,
                                   check_dtype=True)
    except Exception as e:  # noqa: BLE001
        return "mismatch", f"values differ: {str(e).splitlines()[0][:200]}"
    if mix == "cpu_self":
        target = mixed[_tensors(mixed)[0]]
        try:
            torch.testing.assert_close(target, ref_leaves[_tensors(ref_leaves)[0]], equal_nan=True,
                                       rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001
            return "mismatch", f"in-place target differs: {str(e).splitlines()[0][:200]}"
    return "pass", "same values"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=None)
    a = ap.parse_args()
    import ltc_async  # noqa: F401
    names = set(a.ops.split(",")) if a.ops else None
    tally: Counter = Counter()
    bad = []
    todo = cases(names)
    ops = {c[0] for c in todo}
    for name, op, sample, mix in todo:
        status, detail = run_one(op, sample, mix)
        tally[status] += 1
        if status != "pass":
            bad.append(f"{status:9s} {name} [{mix}]: {detail}")
    for line in bad:
        print(line)
    print(f"ops {len(ops)}, mixes tried {len(todo)}: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
