"""The TorchScript backend (LTC's `TSBackendImpl`): CPU and CUDA devices.

Values are plain `torch.Tensor`s on the backing device.  A compiled graph is a TorchScript
function made from the lowered `torch._C.Graph`; calling it releases the GIL, so device workers
run concurrently with tracing and with each other.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Sequence

import torch

from ltc_async.backend import Backend, Computation
from ltc_async.ir.node import NUM, SCALAR, TENSOR_LIST, Node, Tag

from .. import inductor
from .lowering import IN_GENERATOR, TSLowering, _graph_op_name

_lower_ok: dict[tuple, bool] = {}
# intra-op threads of each CPU device's worker (set on the worker; OpenMP's count is per thread,
# so the tier-up thread's own count says nothing about the device's)
_worker_threads: dict[str, int] = {}
_lower_lock = threading.Lock()


class TSComputation(Computation):
    def __init__(self, graph: torch._C.Graph, input_kinds: list[int], device: torch.device,
                 n_outputs: int) -> None:
        self.graph = graph
        self.n_outputs = n_outputs   # then the tensor inputs, returned (see `TSLowering.lower`)
        self.backend_text = str(graph)
        self.fn = torch._C._create_function_from_graph("ltc_graph", graph)
        self.device = device
        self.gen_slots = [i for i, k in enumerate(input_kinds) if k == IN_GENERATOR]

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        if self.gen_slots:
            inputs = list(inputs)
            for i in self.gen_slots:
                g = torch.Generator(self.device)
                g.manual_seed(inputs[i])
                inputs[i] = g
        if self.device.type != "cuda":
            return list(self.fn(*inputs)[:self.n_outputs])
        # On CUDA, TorchScript's profiling executor would replace parts of the graph by fused
        # kernels it generates (NNC) after the first runs: results then moved away from eager's
        # (a GPU run trained MobileNetV2 to different weights).  The graph runs as lowered, op
        # by op with PyTorch's kernels, as it always does on CPU, where nothing fuses.  The
        # switch is thread-local (the caller's own TorchScript code elsewhere is untouched).
        optimize = torch._C._get_graph_executor_optimize()
        torch._C._set_graph_executor_optimize(False)
        try:
            return list(self.fn(*inputs)[:self.n_outputs])
        finally:
            torch._C._set_graph_executor_optimize(optimize)


class SharedProgram(Computation):
    """A graph whose lowered program equals an already compiled one (other shapes only)."""

    reused_program = True

    def __init__(self, program: TSComputation) -> None:
        self.program = program
        self.backend_text = program.backend_text

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        return self.program.execute(inputs)


_programs: "collections.OrderedDict[tuple[str, str], TSComputation]" = collections.OrderedDict()
_programs_lock = threading.Lock()
_MAX_PROGRAMS = 1024


def _kind(e: Any) -> Any:
    """A template entry reduced to what decides TorchScript overload resolution (types, never
    values: `can_lower`'s cache key)."""
    if type(e) is tuple and e and type(e[0]) is Tag:
        if e[0] is TENSOR_LIST:
            return ("L", any(r is None for r in e[1]))
        if e[0] is NUM:  # a number constant: its type (element types for lists)
            v = e[1]
            return ("N", tuple(map(type, v)) if type(v) is tuple else type(v))
        return (e[0].name, e[2]) if e[0] is SCALAR else e[0].name
    return type(e)


class TorchScriptBackend(Backend):
    name = "torchscript"

    def parse_device(self, entry: str) -> torch.device:
        try:
            d = torch.device(entry.strip())
        except (RuntimeError, TypeError):
            raise ValueError(f"bad ltc_async device entry {entry!r}: expected 'cpu' or 'cuda:N'") from None
        if d.type == "cpu":
            return torch.device("cpu")
        if d.type == "cuda":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            index = 0 if d.index is None else d.index
            if index >= n:
                raise ValueError(f"bad ltc_async device entry {entry!r}: this machine has {n} CUDA "
                                 f"device(s)")
            return torch.device("cuda", index)
        raise ValueError(f"bad ltc_async device entry {entry!r}: the torchscript backend supports "
                         "'cpu' and 'cuda:N'")

    def default_devices(self) -> list[str]:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{i}" for i in range(n)] if n else ["cpu"]

    def upload(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        # A blocking copy: the source may be freed or written next.  No pinning: with the `ltc`
        # PrivateUse1 backend registered, `pin_memory()` without a device asks PrivateUse1's
        # hooks for an allocator and raises where the native hooks are not built (seen on a
        # GPU), and a pinned copy followed by a synchronize gains nothing.
        return tensor.to(device, copy=True)

    def to_torch(self, value: Any) -> torch.Tensor:
        return value

    lifts_ints = True

    def compile(self, order: list[Node], roots: list[tuple[Node, int]], device: torch.device,
                lifted: Sequence[tuple[int, int, int | None]] = ()) -> Computation:
        lowering = TSLowering(device)
        graph = lowering.lower(order, roots, lifted)
        # TorchScript programs are shape-generic: graphs that differ only in input shapes (a
        # smaller last batch) usually lower to the same program text, and then share one
        # compiled function instead of compiling and warming up another (LTC compiles again).
        # The text is an exact key: constants print with their types and 17 significant digits
        # (`1` / `1.` / bool `1`, `0.` / `-0.`, `nan` / `-nan` stay apart).
        key = (str(device), str(graph))
        with _programs_lock:
            comp = _programs.get(key)
            if comp is not None:
                _programs.move_to_end(key)
                return SharedProgram(comp)
        comp = TSComputation(graph, lowering.input_kinds, device, lowering.n_outputs)
        with _programs_lock:
            _programs[key] = comp
            while len(_programs) > _MAX_PROGRAMS:
                _programs.popitem(last=False)
        return comp

    #: TorchScript first (quick to compile), then Inductor in the background (issue 19)
    tiers = ("ts", "inductor")

    def tier_refuses(self, tier: str, order: list[Node], device: torch.device) -> str | None:
        if tier != "inductor":
            return f"no tier {tier!r}"
        return inductor.available(device.type) or inductor.eligible(order)

    def tier_specialization(self, tier: str, graph: Any) -> Any:
        return inductor.specialization(graph)

    def compile_tier(self, tier: str, graph: Any, device: torch.device, inputs: Sequence[Any],
                     varying: frozenset | None = None) -> Computation:
        if tier != "inductor":
            raise NotImplementedError(tier)
        threads = _worker_threads.get(str(device))
        if graph.lifted_scalars or varying:   # a skeleton's program whose ints or sizes vary
            return inductor.build_generic(graph, device, inputs, varying, threads=threads)
        return inductor.build(graph, device, inputs, threads=threads, check_shapes=varying is not None)

    def can_lower(self, node: Node) -> bool:
        key = (node.op, tuple(_kind(e) for e in node.template))
        ok = _lower_ok.get(key)
        if ok is None:
            ok = _check_lowering(node)
            with _lower_lock:
                _lower_ok[key] = ok
        return ok

    def completion_marker(self, device: torch.device) -> Any:
        if device.type != "cuda":
            return None  # CPU kernels ran synchronously inside execute
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def wait_marker(self, marker: Any) -> None:
        marker.synchronize()

    def worker_init(self, device: torch.device, threads: int) -> None:
        if device.type == "cpu" and threads > 0:
            torch.set_num_threads(threads)
        elif device.type == "cuda":
            torch.cuda.set_device(device)
        if device.type == "cpu":   # what the device's kernels may use: its Inductor programs too
            _worker_threads[str(device)] = torch.get_num_threads()


def _check_lowering(node: Node) -> bool:
    """Does TorchScript resolve this node to the same overload?  (Once per op signature.)"""
    lowering = TSLowering(torch.device("cpu"))
    operands = [lowering.input(torch._C.TensorType.get(), 0) for _ in node.operands]
    try:
        lowering.emit(node, operands)
        n = [x for x in lowering.graph.nodes() if x.kind() == _graph_op_name(node.op)][-1]
        schema = n.schema()
    except Exception:  # noqa: BLE001 - any failure means "cannot lower"
        return False
    if schema == "(no schema)":
        return False
    want = node.op._schema
    overload = want.overload_name
    got = schema.split("(")[0]
    if got == _graph_op_name(node.op) + ("." + overload if overload else ""):
        return True
    # A Python number in a Tensor slot (`x * 0.5` is `mul.Tensor` with a wrapped number)
    # resolves to the `.Scalar` twin, which wraps the number the same way.
    wrapped = any(type(e) is tuple and e and e[0] is SCALAR and _is_tensor_arg(want, k)
                  for k, e in enumerate(node.template))
    return wrapped and got.split(".")[0] == _graph_op_name(node.op)


def _is_tensor_arg(schema: torch._C.FunctionSchema, k: int) -> bool:
    return isinstance(schema.arguments[k].type, torch._C.TensorType)
