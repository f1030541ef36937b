"""The backend seam (LTC's `BackendImplInterface`): what a device backend must provide.

The core never imports a concrete backend; `ltc_async.executor.arena` loads one by name from
the `ltc_async_devices` package (the repository's `devices/` folder, installed under a name of
its own: a top-level `devices` package would collide with any other distribution's).  A backend deals in
*values*: whatever object holds a tensor's data on its device (for TorchScript, a
`torch.Tensor` on the backing `torch.device`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

from ..ir.interpreter import Interpreter
from ..ir.node import Node


class Computation(ABC):
    """A compiled graph.  `execute` runs on a device worker thread."""

    #: the backend's text of the graph (`ltc.debug.dump_ir(..., fmt="backend")`)
    backend_text: str = ""
    #: True when `Backend.compile` reused an already compiled program for this graph (the
    #: graphs differ only in what the program does not encode, e.g. input shapes)
    reused_program: bool = False

    @abstractmethod
    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        """Run with `inputs` in graph-input order; return one value per graph output."""

    def accepts(self, inputs: Sequence[Any]) -> bool:
        """Whether this program computes the graph for these inputs (a top-tier program built
        with the graph's runtime scalars baked in takes only those values)."""
        return True


class Backend(ABC):
    """A family of backend devices (one instance per process)."""

    name: str = "?"

    @abstractmethod
    def parse_device(self, entry: str) -> torch.device:
        """Validate a configuration entry ("cpu", "cuda:1") and return its `torch.device`.

        Raises `ValueError` naming the entry when it is malformed or not available here.
        """

    @abstractmethod
    def default_devices(self) -> list[str]:
        """Entries used when none are configured."""

    @abstractmethod
    def upload(self, tensor: torch.Tensor, device: torch.device) -> Any:
        """Copy a host tensor to the device; the result must not alias `tensor`."""

    @abstractmethod
    def to_torch(self, value: Any) -> torch.Tensor:
        """A `torch.Tensor` on the backing device holding `value` (may alias it: read-only)."""

    def from_torch(self, tensor: torch.Tensor, device: torch.device) -> Any:
        """Adopt a tensor already on the backing device (eager-fallback results)."""
        return tensor

    #: whether `compile` takes `lifted` (see `executor/generic.py`)
    lifts_ints: bool = False

    @abstractmethod
    def compile(self, order: list[Node], roots: list[tuple[Node, int]],
                device: torch.device, lifted: Sequence[tuple[int, int, int | None]] = ()) -> Computation:
        """Lower the post-ordered graph `order` producing `roots` and compile it.

        Graph inputs, in order: each DEVICE_DATA node's value, and each op node's runtime
        scalars / RNG seeds (`node.scalars`), then the node's `lifted` ints, in post-order.
        `lifted` (only for backends with `lifts_ints`) lists int constants to take as inputs
        instead of baking them in, as (node index in `order`, template index, index in an
        `int[]` or None), sorted: one program then serves graphs that differ only in them.
        """

    #: the compilers of this backend's tiers, quick first (`compile` is the first; see
    #: `executor/tiers.py`); a backend with one tier has nothing to build in the background
    tiers: tuple[str, ...] = ("quick",)

    def tier_refuses(self, tier: str, order: list[Node], device: torch.device) -> str | None:
        """Why `tier` will not build this graph for `device` (None: it will).  Called once per
        newly compiled graph, on the compiler thread."""
        return f"no tier {tier!r}"

    def tier_specialization(self, tier: str, graph: Interpreter) -> Any:
        """A function of one execution's inputs giving what a `tier` program built from them is
        specialized on (default: every non-tensor input, i.e. runtime scalars are baked in).
        The executor builds only for a graph whose specialization held over the runs that made
        it hot."""
        return lambda inputs: tuple([(type(v), v) for v in inputs if not isinstance(v, torch.Tensor)])

    def compile_tier(self, tier: str, graph: Interpreter, device: torch.device,
                     inputs: Sequence[Any], varying: frozenset | None = None) -> Computation:
        """Build the graph's program on `tier`, on the background tier-up thread.  `graph`
        replays the graph's structure; `inputs` are one execution's inputs in graph-input
        order, tensors given by their `TensorMeta` (layout only).  `varying` is None for an
        exact graph (its shapes are fixed by its key).  A skeleton's program
        (`executor/generic.py`) serves graphs of other sizes: its lifted ints are inputs
        (`graph.lifted_scalars`), and `varying` holds the (input position, dim) pairs whose
        sizes differed between the executions that made it hot (maybe none).  Its program must
        serve other values of those, and say in `accepts` which executions it serves."""
        raise NotImplementedError(tier)

    def can_lower(self, node: Node) -> bool:
        """Whether `node` (trace time, before its inputs exist) can be compiled; False sends
        the op to the eager fallback."""
        return True

    def completion_marker(self, device: torch.device) -> Any:
        """Called on the worker right after `execute` returned.  Backends whose kernels run
        asynchronously (CUDA) return something `wait_marker` can block on (an event), so the
        worker moves on at once; None means the work is already complete."""
        return None

    def wait_marker(self, marker: Any) -> None:
        """Block until the work a `completion_marker` stands for has finished."""

    def worker_init(self, device: torch.device, threads: int) -> None:
        """Called on each device worker thread when it starts."""


Computation.register(Interpreter)   # the IR interpreter runs graphs as a Computation does
