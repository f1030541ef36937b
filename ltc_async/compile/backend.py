"""`torch.compile(model_or_fn, backend="ltc")`: trace once, then one IR node per graph call.

Design note.  Uncompiled, every aten call on an `ltc` tensor costs one Python dispatch (schema
binding, shape inference from a cache, a `Node`, a wrapper tensor): ~13 us per op, so a small
model's training step is bound by tracing, not by its kernels.  Dynamo removes that per-op
cost the way PyTorch/XLA's Dynamo bridge does, but stays lazy and asynchronous:

* Dynamo captures the Python function once per set of guards (its guards decide when to
  capture again: new shapes, dtypes, devices, a changed global) and falls back to running the
  Python between graphs on graph breaks, which on `ltc` tensors is ordinary lazy tracing;
* AOTAutograd splits each captured graph into aten-level forward and backward graphs (or one
  inference graph: `torch.compile(opt.step)`), functionalized, with input mutations applied
  by its runtime wrapper (`param.copy_(new)`: lazy, no copy);
* the backend turns each aten graph into a `GraphFunction` (`capture.py`): captured once by
  ordinary lazy tracing on placeholders, then every call records ONE IR node whose op is the
  captured `Subgraph` (`subgraph.py`) and returns pending `ltc` tensors.  `mark_step` cuts
  and queues the step as before; the TorchScript backend inlines each body into the step's
  program, so a training step of forward node + backward node + optimizer node compiles
  once and is a cache hit after;
* fake-ification: Dynamo would reject parameters on `ltc` (`fakeify.py`).

What is the same as uncompiled: the IR inside a body is what tracing those ops produces, so
results are equal (same kernels, same random seeds drawn in the same order), errors surface
where they do uncompiled, several devices, trio, `mark_step(wait=...)`, salvaging.  What is
different: the trace runs once per capture key, not per call, so Python side effects inside
compiled regions follow Dynamo's rules (as with any backend).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .capture import GraphFunction
from .split import SplitGraphFunction, split_host
from .vectorize import vectorize_scalar_foreach


def _graph_compiler(label: str) -> Any:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        split = split_host(gm)      # CPU tensors among the inputs (an optimizer's step counts)
        if split is not None:
            return SplitGraphFunction(split, label)
        vectorize_scalar_foreach(gm)    # an optimizer's per-parameter scalars: one op each
        return GraphFunction(gm, label, _saved_from() if label == "fw" else None)
    return compile_graph


def _saved_from() -> int | None:
    """Where a forward graph's outputs saved for the backward start (AOTAutograd returns
    mutated inputs, user outputs and intermediate bases first, the rng offset if any, then the
    saved tensors and sizes)."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    return getattr(meta, "num_forward", None)


_aot_backend: Any = None


def ltc_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The Dynamo backend registered as "ltc" (see the module note)."""
    global _aot_backend
    if _aot_backend is None:
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd
        _aot_backend = aot_autograd(fw_compiler=_graph_compiler("fw"), bw_compiler=_graph_compiler("bw"),
                                    inference_compiler=_graph_compiler("inference"),
                                    # input mutations as `copy_` in the graph: captured into the
                                    # body, applied by one replace per input (`capture.py`)
                                    keep_inference_input_mutations=True,
                                    partition_fn=min_cut_rematerialization_partition)
    return _aot_backend(gm, example_inputs, **kwargs)
