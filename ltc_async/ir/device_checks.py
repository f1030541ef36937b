"""Which aten ops eager CUDA lets a CPU 0-dim tensor join as a scalar, read from PyTorch's own
op declarations (`native_functions.yaml`, shipped in the wheel with torchgen).

PyTorch generates a device check into the CUDA wrapper of every op with a backend kernel: all
tensor arguments on one device, 0-dim CPU tensors included.  Ops declared
`device_check: NoCheck` skip it and check for themselves (TensorIterator takes CPU scalars);
ops with only composite kernels have no wrapper check (they decompose into ops that check).  So
`x_cuda + torch.tensor(2.)` works and `torch.clamp(x_cuda, min=torch.tensor(0.))` raises, and
`ltc` does the same (`OpInfo.cpu_scalars`).  The file is read once, on the first CPU 0-dim
tensor met, by a line scan (no YAML parser needed): about 30 ms.
"""
from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_strict: frozenset[str] | None = None   # "name.overload" of ops that refuse CPU 0-dim tensors

# eager CUDA refuses CPU scalars in these although declared NoCheck (their kernels check):
# the same list PyTorch's FakeTensor keeps (`bypass_zero_dim_cpu_tensor_check_ops`)
_KERNEL_CHECKED = {"nextafter", "nextafter_", "nextafter.out"}


def _scan(path: str) -> frozenset[str]:
    strict = set()
    name, nocheck, backend = None, False, False

    def close() -> None:
        if name is not None and backend and not nocheck:
            strict.add(name)
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("- func:"):
                close()
                sig = line[len("- func:"):].strip()
                name, nocheck, backend = sig[:sig.index("(")], False, False
            elif line.startswith("  device_check:"):
                nocheck = "NoCheck" in line
            elif line.startswith("  structured_delegate:") or line.startswith("  structured: True"):
                backend = True
            elif line.startswith("    ") and ":" in line and name is not None:
                keys = line.split(":", 1)[0]   # dispatch entries: "    CPU, CUDA: kernel"
                if any(k.strip() in ("CUDA", "CPU") for k in keys.split(",")):
                    backend = True
    close()
    return frozenset(strict | _KERNEL_CHECKED)


def _table() -> frozenset[str]:
    global _strict
    if _strict is None:
        with _lock:
            if _strict is None:
                try:
                    import torchgen
                    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen",
                                        "native", "native_functions.yaml")
                    _strict = _scan(path)
                except (ImportError, OSError):   # a torch without torchgen: be lenient
                    _strict = frozenset(_KERNEL_CHECKED)
    return _strict


def takes_cpu_scalars(qualname: str) -> bool:
    """Does eager CUDA accept CPU 0-dim tensors among this op's (`aten::name.overload`)
    arguments?"""
    name = qualname.split("::", 1)[-1]
    if name.endswith(".default"):
        name = name[: -len(".default")]
    return name not in _table()
