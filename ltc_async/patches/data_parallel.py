"""`torch.nn.DataParallel` over `ltc` devices, and as before over CPU modules.

Once `ltc_async` is imported, `ltc` is PyTorch's current accelerator (`torch.accelerator`,
`torch.device(0)`, the streams PyTorch's Scatter makes), GPU or not, while `DataParallel(module)`
picks its device type from `torch.cuda` first: CUDA where a GPU is, `ltc` where none is.  So the
wrapper is bound by where the module is, the same with and without a GPU:

* a module with `ltc` parameters or buffers (or `ltc` devices in `device_ids`) is bound to the
  `ltc` devices (all of them by default): with a GPU present PyTorch would bind it to `cuda:0`
  and refuse its parameters;
* a CPU module wrapped without `device_ids` -- a no-op on a machine without GPUs, which many
  scripts do unconditionally -- keeps running on the CPU as it did: PyTorch would bind it to
  `ltc:0`, or where a GPU is move it to `cuda:0` and scatter its CPU batches with streams of
  the current accelerator, `ltc` ones, which `torch._C._scatter` refuses ("Expected
  stream_.device_type() == DeviceType::CUDA");
* a CUDA module, or explicit integer `device_ids` with a GPU present, is left to PyTorch;
* over `ltc` devices, PyTorch's scatter, broadcast and gather are CUDA kernels
  (`torch._C._scatter`, ...), and its threads run each replica inside CUDA stream contexts.
  Here the inputs are split and moved with `.to()` (differentiable: gradients flow back as
  through PyTorch's autograd functions), parameters are broadcast the same way into PyTorch's
  own `replicate`, and the replicas are traced one after another on the calling thread:
  tracing is host work, and each device runs its graph asynchronously on its own queue, so the
  devices still compute concurrently.
"""
from __future__ import annotations

import importlib
from itertools import chain
from typing import Any, Sequence

import torch
from torch._utils import _get_device_index
from torch.nn.parallel import DataParallel
from torch.nn.parallel.scatter_gather import _is_namedtuple

# the module, not the function `torch.nn.parallel.replicate` its package exports under its name
replicate_module = importlib.import_module("torch.nn.parallel.replicate")

_patched = False


def _ltc(dp: Any) -> bool:
    return bool(dp.device_ids) and dp.src_device_obj.type == "ltc"


def _device(d: Any) -> torch.device:
    return d if isinstance(d, torch.device) else torch.device("ltc", d)


def _is_ltc(d: Any) -> bool:
    return isinstance(d, (str, torch.device)) and torch.device(d).type == "ltc"


def _ltc_index(d: Any) -> int:
    """A `device_ids` / `output_device` entry as an ltc device index (an int is one already)."""
    if _is_ltc(d) and torch.device(d).index is None:
        return torch.ltc.current_device()
    return _get_device_index(d, True)


def _init_ltc(dp: Any, module: Any, device_ids: Any, output_device: Any, dim: int) -> None:
    """PyTorch's `DataParallel.__init__` with `ltc` as the device type, whatever
    `_get_available_device_type()` answers (CUDA where a GPU is)."""
    torch.nn.Module.__init__(dp)
    torch._C._log_api_usage_once("torch.nn.parallel.DataParallel")
    if device_ids is None:
        device_ids = list(range(torch.ltc.device_count()))
    if output_device is None:
        output_device = device_ids[0]
    dp.dim = dim
    dp.module = module
    dp.device_ids = [_ltc_index(x) for x in device_ids]
    dp.output_device = _ltc_index(output_device)
    dp.src_device_obj = torch.device("ltc", dp.device_ids[0])
    if len(dp.device_ids) == 1:
        dp.module.to(dp.src_device_obj)


def _scatter(obj: Any, devices: list[torch.device], dim: int) -> list[Any]:
    """PyTorch's `scatter` (`scatter_gather.py`) with `.to()` for its CUDA kernel."""
    if isinstance(obj, torch.Tensor):
        return [c.to(d) for c, d in zip(obj.chunk(len(devices), dim), devices)]
    if _is_namedtuple(obj):
        return [type(obj)(*args) for args in zip(*(_scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, tuple) and obj:
        return list(zip(*(_scatter(o, devices, dim) for o in obj)))
    if isinstance(obj, list) and obj:
        return [list(i) for i in zip(*(_scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, dict) and obj:
        return [type(obj)(i) for i in zip(*(_scatter(kv, devices, dim) for kv in obj.items()))]
    return [obj for _ in devices]


def _scatter_kwargs(inputs: tuple, kwargs: dict | None, devices: list[torch.device], dim: int) -> tuple:
    scattered = _scatter(inputs, devices, dim) if inputs else []
    scattered_kwargs = _scatter(kwargs, devices, dim) if kwargs else []
    if len(scattered) < len(scattered_kwargs):
        scattered.extend(() for _ in range(len(scattered_kwargs) - len(scattered)))
    elif len(scattered_kwargs) < len(scattered):
        scattered_kwargs.extend({} for _ in range(len(scattered) - len(scattered_kwargs)))
    return tuple(scattered), tuple(scattered_kwargs)


def _gather(outputs: Sequence[Any], target: Any, dim: int) -> Any:
    """PyTorch's `gather` with `.to()` and `cat` for its CUDA kernel."""
    out = outputs[0]
    if isinstance(out, torch.Tensor):
        where = "cpu" if target == "cpu" else _device(target)
        parts = [o.to(where) for o in outputs]
        if dim == 0 and all(p.dim() == 0 for p in parts):   # scalars: a vector, as PyTorch does
            parts = [p.view(1) for p in parts]
        return torch.cat(parts, dim)
    if out is None:
        return None
    if isinstance(out, dict):
        if not all(len(out) == len(d) for d in outputs):
            raise ValueError("All dicts must have the same number of keys")
        return type(out)((k, _gather([d[k] for d in outputs], target, dim)) for k in out)
    if _is_namedtuple(out):
        return type(out)._make(_gather(list(v), target, dim) for v in zip(*outputs, strict=True))
    return type(out)(_gather(list(v), target, dim) for v in zip(*outputs, strict=True))


def patch() -> None:
    global _patched
    if _patched:
        return
    cls = DataParallel
    init, scatter, replicate = cls.__init__, cls.scatter, cls.replicate
    parallel_apply, gather = cls.parallel_apply, cls.gather

    def __init__(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, dim: int = 0) -> None:
        where = {t.device.type for t in chain(module.parameters(), module.buffers())}
        if "ltc" in where or any(_is_ltc(d) for d in device_ids or ()):
            _init_ltc(self, module, device_ids, output_device, dim)
        elif device_ids is None and where <= {"cpu"}:
            # a CPU module: run it as PyTorch does without an accelerator (its own branch),
            # before PyTorch's `__init__` could move it to `ltc:0` or `cuda:0`
            torch.nn.Module.__init__(self)
            self.module = module
            self.device_ids = []
        else:
            init(self, module, device_ids, output_device, dim)

    def scatter_(self: Any, inputs: tuple, kwargs: dict | None, device_ids: Sequence[Any]) -> Any:
        if not _ltc(self):
            return scatter(self, inputs, kwargs, device_ids)
        return _scatter_kwargs(inputs, kwargs, [_device(d) for d in device_ids], self.dim)

    def replicate_(self: Any, module: Any, device_ids: Sequence[Any]) -> Any:
        return replicate(self, module, device_ids)   # broadcast: `_broadcast_coalesced_reshape`

    def parallel_apply_(self: Any, replicas: Sequence[Any], inputs: Sequence[Any], kwargs: Any) -> list[Any]:
        if not _ltc(self):
            return parallel_apply(self, replicas, inputs, kwargs)
        return [r(*(i if isinstance(i, (list, tuple)) else (i,)), **k)
                for r, i, k in zip(replicas, inputs, kwargs)]

    def gather_(self: Any, outputs: Sequence[Any], output_device: Any) -> Any:
        if not _ltc(self):
            return gather(self, outputs, output_device)
        return _gather(outputs, output_device, self.dim)

    cls.__init__ = __init__
    cls.scatter, cls.replicate, cls.parallel_apply, cls.gather = scatter_, replicate_, parallel_apply_, gather_

    broadcast = replicate_module._broadcast_coalesced_reshape

    def _broadcast_coalesced_reshape(tensors: Sequence[torch.Tensor], devices: Sequence[Any],
                                     detach: bool = False) -> list[list[torch.Tensor]]:
        if not tensors or tensors[0].device.type != "ltc":
            return broadcast(tensors, devices, detach)
        return [[(t.detach() if detach else t).to(_device(d)) for t in tensors] for d in devices]
    replicate_module._broadcast_coalesced_reshape = _broadcast_coalesced_reshape
    _patched = True
