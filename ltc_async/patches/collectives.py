"""torch.distributed collectives on views: writes reach the base, as in eager.

Design note.  `c10d::allreduce_` and its friends write their tensor arguments and have no
functional form.  PyTorch's functionalization fallback hands them the unwrapped values and keeps
what they wrote in those values only: a collective on a *view* (`dist.all_reduce(t[2:4])`, a
slice of a flattened gradient bucket) left the view's base unchanged, and every later read of
the base or of another view lost the result.  Eager writes the base's memory.

This module registers a Functionalize kernel for each mutating c10d op that does what
functionalization does for an ordinary in-place op: sync and unwrap the functional tensors, run
the op below functionalization (for `ltc` values that is `host.mutating_host_op`: the
collective runs on host copies and the written lazy tensors take the results), then replace
each written wrapper's value and commit the update, so the base and all its views see it.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from ..ir.schema import op_info
from ..tensor.collectives import issue_queued_first
from ..tensor.lazy_tensor import tensors_in as _tensors
from ..tensor.writeback import write

_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
_lib: torch.library.Library | None = None


def _unwrap(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and torch._is_functional_tensor(v):
        torch._sync(v)
        return torch._from_functional_tensor(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(e) for e in v)
    return v


def _kernel(op: torch._ops.OpOverload) -> Any:
    info = op_info(op)
    written = info.written     # c10d ops write their first argument without saying so
    names = info.arg_names

    def functionalized(*args: Any, **kwargs: Any) -> Any:
        inner_args = [_unwrap(a) for a in args]
        inner_kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            out = op(*inner_args, **inner_kwargs)
        # the written wrappers take their (rebound) inner values; the update reaches the base
        by_inner: dict[int, torch.Tensor] = {}
        for i in written:
            if i < len(args):
                outer, inner = args[i], inner_args[i]
            elif names[i] in kwargs:
                outer, inner = kwargs[names[i]], inner_kwargs[names[i]]
            else:
                continue
            for w, v in zip(_tensors(outer), _tensors(inner)):
                if w is not v and torch._is_functional_tensor(w):
                    # ADInplaceOrView (above this kernel) bumps the version: the schema marks the write
                    write([w], [v], bump=False)
                    by_inner[id(v)] = w

        def back(o: torch.Tensor) -> torch.Tensor:    # outputs aliasing written inputs are those inputs
            w = by_inner.get(id(o))
            return w if w is not None else (torch._to_functional_tensor(o) if o.device.type == "ltc" else o)
        result = tree_map_only(torch.Tensor, back, out)
        if any(_is_work(r) for r in (result if isinstance(result, tuple) else (result,))):
            # the Work's future holds the written tensors, as c10d's own do: DDP's reducer reads
            # its bucket's result from it (`parseCppCommHookResult`)
            value = [by_inner.get(id(v), v) for i in written
                     for v in _tensors(inner_args[i] if i < len(args) else inner_kwargs.get(names[i]))]
            result = _with_work(result, _completed_work(value))
        return result
    return functionalized


def _is_work(v: Any) -> bool:
    return isinstance(v, torch._C.ScriptObject) and "Work" in str(v._type())


def _completed_work(value: list) -> Any:
    """A c10d Work whose future is done and holds `value` (the written tensors): the collective
    is queued on the device, and every later use of a written tensor is ordered after it."""
    done = torch.futures.Future()
    done.set_result(value)
    return torch._C._distributed_c10d._create_work_from_future(done).boxed()


def _with_work(result: Any, work: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(work if _is_work(r) else r for r in result)
    return work if _is_work(result) else result


# torch.distributed's Python API: a call on host tensors (or on none: `barrier`, the object
# collectives) waits for the ltc collectives queued before it to be issued (`tensor/collectives.py`)
_HOST_ORDERED = (
    "all_reduce", "all_reduce_coalesced", "broadcast", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier", "monitored_barrier",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "send_object_list", "recv_object_list",
)


def _after_queued(original: Any) -> Any:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not any(t.device.type == "ltc" for t in _tensors((args, list(kwargs.values())))):
            issue_queued_first()
        return original(*args, **kwargs)
    return call


def _order_host_collectives() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    for name in _HOST_ORDERED:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = _after_queued(original)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


def register() -> None:
    """Install the kernels (once; at `import ltc_async`)."""
    global _lib
    if _lib is not None:
        return
    try:
        import torch.distributed  # noqa: F401 - registers the c10d ops
    except ImportError:
        return
    _order_host_collectives()
    lib = torch.library.Library("c10d", "IMPL")
    for qualname in torch._C._dispatch_get_all_op_names():
        ns, _, name = qualname.partition("::")
        if ns != "c10d" or not name.endswith("_"):
            continue
        packet = getattr(torch.ops.c10d, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op_info(op).written:
                lib.impl(op, _kernel(op), "Functionalize")
    _lib = lib
