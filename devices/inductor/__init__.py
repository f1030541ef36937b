"""The Inductor tier: a cut ltc graph compiled by `torch._inductor` (issue 19).

Design note.  A backend's quick tier (TorchScript) compiles a graph in milliseconds; Inductor
takes seconds (it generates and builds C++/OpenMP kernels on CPU, Triton on CUDA) and its
programs run the graph's small ops fused.  The executor (`ltc_async/executor/tiers.py`) builds
this tier in the background for graphs that have run often, and swaps it in when ready.

How a graph becomes an Inductor program:

1. the IR interpreter over the cut graph (`Interpreter(order, roots, device)`: structure and
   constants only, no node objects kept) is traced by `make_fx` in fake mode, on stand-ins
   with the graph inputs' shapes, strides and dtypes: an FX graph of the aten ops the IR holds
   (captured `torch.compile` bodies included: they run through an interpreter of the same
   class), except that the `x_copy` ops functionalization made of views are traced as the views
   (`OpInfo.compiled_as`) and `view` is handed to Inductor as `reshape` (`_views_as_reshapes`);
2. the graph's runtime scalars are Python numbers, which `make_fx` would bake into the FX graph
   as constants.  Those that change from step to step in real programs are *lifted*: a float
   in a Tensor slot of a floating-point op (`div.Tensor(x, bias_correction)`), the scalar of
   `mul/div/add/sub.Scalar` and the `value` of `addcdiv` / `addcmul` (Adam's step size) become
   0-dim float64 inputs of the program (`mul.Tensor(x, t)` computes what `mul.Scalar(x, s)`
   does for floating `x`; `addcdiv(x, a, b, value=s)` becomes `x + t * a / b`), and so does the
   fill value of a bool or floating `full` (`full((b,), cur_len >= max_len, dtype=bool)`,
   generate()'s stopping criterion, is `ones * t`: `_full_of`).  The rest (an
   int exponent, a clamp bound) are baked: the program serves the executions whose baked
   scalars equal those it was built with (`InductorProgram.accepts`), and the executor only
   builds it for a graph whose baked-to-be scalars (`specialization`) were the same over the
   runs that made it hot;
3. `torch._inductor.compile(gm, example_inputs)` builds it in-process (`compile_threads=1`: no
   compiler worker processes to orphan at exit; C++ builds are `g++` subprocesses that end
   with their build).  With Inductor's C++ wrapper (`cpp_wrapper`; CPU and CUDA devices): the
   whole program -- kernels, allocations, the calls between them -- is one C++ function that
   runs without the GIL, as a TorchScript graph does (the program's text in `ltc.debug` says
   which wrapper it got: a graph the C++ wrapper cannot build gets the Python one; a build
   that fails inside Inductor's loop reordering is made again without that pass).  Casts to
   a lower precision and back keep eager's rounding (`emulate_precision_casts`).  The default Python wrapper calls each
   kernel from Python, taking the GIL back between kernels: a device worker running it
   contended with the tracing thread for the GIL at every kernel (measured: the overlapped
   steps of the compile path were ~12% slower than with the C++ wrapper), and its kernels,
   each a separate shared library, took longer to build cold.  The program returns its inputs
   after its outputs (`_return_inputs`): the C++ wrapper would release each input at its last
   use, and releasing a tensor Python holds takes the GIL, mid-program.

A skeleton's shape-generic program (one per set of graphs differing only in sizes and ints:
`ltc_async/executor/generic.py`) is built by `build_generic` with those sizes symbolic, its
assumptions about them checked before each run (see "shape-generic graphs" below).

Graphs drawing random numbers are not built (their seeds are runtime inputs that `make_fx`
cannot take; Inductor would also draw other numbers): they stay on the quick tier.  So do,
before PyTorch 2.13, graphs that read a value rounded to float16/bfloat16 at a higher
precision: Inductor then drops the rounding (`DROPS_ROUNDING`).
Inductor's own on-disk caches (`TORCHINDUCTOR_CACHE_DIR`, FX graph cache) make a second process
build the same graphs quickly.

Threads: `build` runs on the executor's tier-up thread, never on a tracing thread or a device
worker; `InductorProgram.execute` runs where any `Computation` runs (the device worker, or a
reader running its graph: `executor/read_here.py`).
"""
from __future__ import annotations

import functools
import shutil
import traceback
from typing import Any, Sequence

import torch
from torch.torch_version import TorchVersion

from ltc_async.backend import Computation
from ltc_async.ir.interpreter import Interpreter
from ltc_async.ir.node import DEVICE_DATA, RNG, SCALAR, Node, Tag, TensorMeta
from ltc_async.ir.schema import op_info


@functools.lru_cache(maxsize=None)
def available(device_type: str) -> str | None:
    """None when Inductor can build kernels for `device_type` here, else why not."""
    try:
        import torch._inductor  # noqa: F401 - the import is the check
    except Exception as e:  # noqa: BLE001 - any import failure means no Inductor
        return f"torch._inductor does not import ({type(e).__name__}: {e})"
    if device_type == "cpu":
        if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
            return "no C++ compiler on PATH"
        return None
    if device_type == "cuda":
        try:
            import triton  # noqa: F401
        except Exception:  # noqa: BLE001
            return "triton is not installed"
        return None
    return f"no Inductor target for {device_type!r}"


def eligible(order: list[Node]) -> str | None:
    """None when the graph can be built by this tier, else why not (stays on the quick tier)."""
    rounded: set[tuple[int, int]] = set()   # (id(node), output) of casts to float16/bfloat16
    for n in order:
        if n.op is DEVICE_DATA:
            continue
        if any(type(e) is tuple and e and type(e[0]) is Tag and e[0] is RNG for e in n.template):
            return "draws random numbers"
        sub = getattr(n.op, "ops", None)        # a captured torch.compile body
        if sub is not None:
            why = eligible(sub)
            if why is not None:
                return why
        if DROPS_ROUNDING:
            ins = [src.outputs[k].dtype for src, k in n.operands]
            if any((id(src), k) in rounded for src, k in n.operands) and \
                    any(m.dtype.is_floating_point and m.dtype.itemsize > 2 for m in n.outputs):
                return (f"reads a value rounded to a lower precision at a higher one "
                        f"({getattr(n.op, '__name__', n.op)}): Inductor before PyTorch 2.13 drops "
                        f"such a rounding (torch {torch.__version__})")
            rounded.update((id(n), k) for k, m in enumerate(n.outputs)
                           if m.dtype in _LOW_PRECISION and any(d.is_floating_point and d.itemsize > m.dtype.itemsize
                                                                for d in ins))
    return None


_LOW_PRECISION = (torch.float16, torch.bfloat16)

# Inductor before PyTorch 2.13 drops the rounding of a cast to float16/bfloat16 whose value is
# read back at a higher precision (`x.to(bfloat16).float()`, a fake-quantization; a bf16 value
# an op promotes to float32): its joint-graph pass `pointless_convert` makes any cast of a
# cast one cast, and its C++ kernels reuse the value from before the cast (a CSE shortcut
# that `emulate_precision_casts` turns off only from 2.13).  Measured with torch 2.11: 0.017
# off eager on an H200 and on CPU.  Such graphs stay on the quick tier there (`eligible`).
DROPS_ROUNDING = TorchVersion(torch.__version__) < (2, 13)


class InductorProgram(Computation):
    """A graph's Inductor program; takes the graph's inputs in the quick tier's order."""

    def __init__(self, fn: Any, tensor_slots: list[int], lifted: list[int], baked: tuple, text: str,
                 strides: Sequence[tuple[int, ...]], n_outputs: int, shapes: Sequence[tuple[int, ...]] = ()) -> None:
        self.fn = fn
        self.tensor_slots = tensor_slots    # positions of the tensor inputs among all inputs
        self.lifted = lifted                # positions of scalars passed as 0-dim float64 tensors
        self.baked = baked                  # (position, type, value) of scalars built in
        self.backend_text = text
        self.strides = list(strides)        # the tensor inputs' strides the kernels were built for
        self.n_outputs = n_outputs          # the program returns its inputs after these (`_return_inputs`)
        # the tensor inputs' shapes it was built for, where it serves graphs of other shapes too
        # (a skeleton's program: `ltc_async/executor/generic.py`); those run the quick tier
        self.shapes = list(shapes)
        self._last_floats: tuple | None = None   # (values, their tensors): see `_floats`

    def _floats(self, inputs: Sequence[Any]) -> Sequence[torch.Tensor]:
        """The lifted scalars as the program takes them: one tensor made, its elements passed
        (`_scalars`: ~2 us a scalar less); those of the last execution again when the values
        are the same (a generate() token's scale factors, a constant learning rate: a tiny
        Llama's token, 45 -> 7 us).  The program only reads them.  Tuples compare floats with
        `==`, which takes -0.0 for 0.0: values with a float zero are made anew (`0 not in
        values` first: most have no zero at all, and that test is one C call)."""
        values = tuple([inputs[i] for i in self.lifted])
        last = self._last_floats
        if last is not None and last[0] == values and (0 not in values or _no_float_zero(values)):
            return last[1]
        made = torch.tensor(values, dtype=torch.float64).unbind()
        self._last_floats = (values, made)
        return made

    def accepts(self, inputs: Sequence[Any]) -> bool:
        for i, t, v in self.baked:
            w = inputs[i]
            if type(w) is not t or w != v:
                return False
        for i, shape in zip(self.tensor_slots, self.shapes):
            if inputs[i].shape != shape:
                return False
        return True

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        args = [inputs[i] for i in self.tensor_slots]
        # The kernels index their inputs with the strides they were built for (and check them).
        # The same graph key can meet other layouts: the graph's inputs come from programs whose
        # outputs' layout depends on their tier (Inductor lays out a transposed or expanded
        # result contiguously, TorchScript as eager's view), and during a trial the producer
        # alternates tiers.  An input in another layout is copied into the one built for.
        for k, stride in enumerate(self.strides):
            a = args[k]
            if a.stride() != stride:
                args[k] = _relayout(a, stride)
        if self.lifted:
            args.extend(self._floats(inputs))
        return list(self.fn(*args)[:self.n_outputs])


def _no_float_zero(values: tuple) -> bool:
    """No float zero among `values` (an int or bool 0 has no sign: `False`, a full's fill)."""
    return not any(v == 0 and type(v) is float for v in values)


def _relayout(a: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """`a`'s values in the layout `stride` (of a tensor of `a`'s shape).  A dimension of stride 0
    (an expanded value: its entries are equal along it) is copied once and expanded again."""
    src = a
    for d, (n, s) in enumerate(zip(a.shape, stride)):
        if s == 0 and n > 1:
            src = src.narrow(d, 0, 1)
    out = torch.empty_strided(src.shape, stride, dtype=a.dtype, device=a.device).copy_(src)
    return out.expand(a.shape) if src is not a else out


# ops whose floating-point Scalar argument is lifted, as the Tensor overload that takes it
_SCALAR_TO_TENSOR = {torch.ops.aten.mul.Scalar: torch.ops.aten.mul.Tensor,
                     torch.ops.aten.div.Scalar: torch.ops.aten.div.Tensor,
                     torch.ops.aten.add.Scalar: torch.ops.aten.add.Tensor,
                     torch.ops.aten.sub.Scalar: torch.ops.aten.sub.Tensor}
_ADDC = {torch.ops.aten.addcdiv.default: torch.ops.aten.div.Tensor,
         torch.ops.aten.addcmul.default: torch.ops.aten.mul.Tensor}


_FULL = torch.ops.aten.full.default


def _lifted_fill(op: Any, template: tuple, pos: int, kind: type) -> bool:
    """Whether the scalar at template position `pos` is the fill value of a `full` this tier
    lifts: into a bool tensor any number (its truth), into a floating one a float (the
    float64 input converts as eager's Python float does).  The rest are baked."""
    if op is not _FULL or pos != 1 or len(template) < 3:
        return False
    dtype = template[2]
    return dtype is torch.bool or (isinstance(dtype, torch.dtype) and dtype.is_floating_point and kind is float)


def _candidates(steps: list) -> set[int]:
    """Positions, among a graph's scalars in input order (`Interpreter.steps`), of the scalars
    this tier may lift (see the module note; whether it does depends on dtypes, known when
    tracing)."""
    out, k = set(), 0
    for op, template, _operands, n_scalars, _spec in steps:
        if op is DEVICE_DATA or not n_scalars:
            continue
        schema = getattr(op, "_schema", None)
        for pos, e in enumerate(template):
            if type(e) is tuple and e and type(e[0]) is Tag and e[0] is SCALAR and len(e) > 2:
                if e[2] is float and schema is not None and (
                        isinstance(schema.arguments[pos].type, torch._C.TensorType)
                        or op in _SCALAR_TO_TENSOR or op in _ADDC):
                    out.add(k + e[1])
                elif _lifted_fill(op, template, pos, e[2]):
                    out.add(k + e[1])
        k += n_scalars
    return out


def specialization(graph: Interpreter) -> Any:
    """A function of one execution's inputs giving what a program built from them is
    specialized on: every non-tensor input but the liftable floats, and the ints of a
    shape-generic graph (`graph.lifted_scalars`: symbolic in its program, see `build_generic`)."""
    candidates = _candidates(graph.steps) | set(graph.lifted_scalars)

    def key(inputs: Sequence[Any]) -> tuple:
        out, k = [], 0
        for v in inputs:
            if isinstance(v, torch.Tensor):
                continue
            if k not in candidates:
                out.append((type(v), v))
            k += 1
        return tuple(out)
    return key


# The `x_copy` ops functionalization made of view ops are traced as the views the program runs
# (`OpInfo.compiled_as`, as the TorchScript tier emits them).  As copies, Inductor materialized
# every transpose, slice and expand the graph takes (extern matmuls take their operands
# materialized; with the C++ wrapper `slice_copy` / `split_copy` even ran through its proxy
# executor): measured, GPT-2's compile-path step kept the device busy 16.9 ms on this tier,
# where a whole step of torch.compile's own Inductor program took 9.3 ms (with views: 11.1 ms).
# As views, Inductor indexes into the buffers, and a graph output that is a view keeps eager's
# strides, as on TorchScript.  Inputs in another layout than built for: `_relayout`.


_ALPHA = (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor)


def _without_alpha(op: Any, args: list, kwargs: dict) -> Any:
    """`op(*args, **kwargs)`, with `add`/`sub`'s `alpha` applied by a `mul` of its operand:
    Inductor (torch 2.13) drops the `alpha` of `add(c, mm(a, b), alpha=k)` -- it fuses the pair
    into `addmm` without it -- so an EMA of a matrix product (a VQ-VAE codebook's
    `embed_avg.mul_(d).add_(onehot.t() @ z, alpha=1 - d)`) went wrong once its graph tiered up."""
    alpha = kwargs.get("alpha", 1)
    if op not in _ALPHA or (not isinstance(alpha, torch.Tensor) and alpha == 1):
        return op(*args, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k != "alpha"}
    x, y = args[0], args[1]
    scaled = torch.ops.aten.mul.Tensor(y, alpha) if isinstance(alpha, torch.Tensor) \
        else torch.ops.aten.mul.Scalar(y, alpha) if isinstance(y, torch.Tensor) else y * alpha
    return op(x, scaled, *args[2:], **kwargs)


class _Lift:
    """A liftable scalar while tracing: its 0-dim tensor and its value."""

    __slots__ = ("tensor", "value", "position", "used")

    def __init__(self, tensor: torch.Tensor, value: float, position: int) -> None:
        self.tensor, self.value, self.position, self.used = tensor, value, position, False


class _LiftingInterpreter(Interpreter):
    """The interpreter, tracing lifted scalars as tensors where the op allows (module note)."""

    def _run_step(self, step: tuple, env: list[list[Any]], it: Any) -> list[Any]:
        op, template, operands, n_scalars, out_spec = step
        scalars = [next(it) for _ in range(n_scalars)]
        if not isinstance(op, torch._ops.OpOverload) or not any(isinstance(v, _Lift) for v in scalars):
            return super()._run_step(step, env, iter(scalars))
        plain = [v.value if isinstance(v, _Lift) else v for v in scalars]   # the values as numbers
        if op is _FULL:     # a lifted fill value (`_lifted_fill`)
            lift = next(v for v in scalars if isinstance(v, _Lift))
            lift.used = True
            pos_args, kw_args = self._split(op, [self._arg(e, [], plain) for e in template])
            return self.flatten(_full_of(pos_args[0], lift.tensor, **kw_args), out_spec)
        vals = [env[k][i] for k, i in operands]
        # a lifted float is a 0-dim float64 tensor, which outranks 0-dim float32 tensors in type
        # promotion where a Python number does not (`lr / step` of 0-dim tensors came out float64,
        # read as float32: ASGD's eta): lifted only beside a tensor with dimensions
        floating = all(v.dtype.is_floating_point for v in vals if isinstance(v, torch.Tensor)) \
            and any(isinstance(v, torch.Tensor) and v.dim() > 0 for v in vals)
        schema = op._schema
        args = []
        for pos, e in enumerate(template):
            if type(e) is tuple and e and type(e[0]) is Tag and e[0] is SCALAR and isinstance(scalars[e[1]], _Lift):
                lift = scalars[e[1]]
                tensor_slot = isinstance(schema.arguments[pos].type, torch._C.TensorType)
                if floating and (tensor_slot or op in _SCALAR_TO_TENSOR or op in _ADDC):
                    lift.used = True
                    args.append(lift)
                else:
                    args.append(lift.value)
            else:
                args.append(self._arg(e, vals, plain))
        pos_args, kw_args = self._split(op, args)
        if op in _ADDC and isinstance(kw_args.get("value"), _Lift):
            x, a, b = pos_args
            out = torch.ops.aten.add.Tensor(x, torch.ops.aten.mul.Tensor(kw_args["value"].tensor, _ADDC[op](a, b))
                                            if op is torch.ops.aten.addcdiv.default
                                            else _ADDC[op](torch.ops.aten.mul.Tensor(kw_args["value"].tensor, a), b))
        else:
            if op in _SCALAR_TO_TENSOR and any(isinstance(a, _Lift) for a in pos_args):
                op = _SCALAR_TO_TENSOR[op]
                if len(pos_args) > 2:    # add/sub.Scalar's `alpha` is keyword-only in .Tensor
                    pos_args, kw_args = pos_args[:2], {**kw_args, "alpha": pos_args[2]}
            pos_args = [a.tensor if isinstance(a, _Lift) else a for a in pos_args]
            kw_args = {k: (a.tensor if isinstance(a, _Lift) else a) for k, a in kw_args.items()}
            out = self._call(op, pos_args, kw_args)
        return self.flatten(out, out_spec)

    def _call(self, op: Any, args: Any, kwargs: dict) -> Any:
        view = op_info(op).compiled_as
        if view is not op:
            if op is torch.ops.aten._reshape_alias_copy.default:
                args = args[:2]          # (self, size, stride): reshape takes the size
            return view(*args, **kwargs)
        if op in _BOOL_REDUCTIONS and args[0].dtype is torch.bool and args[0].numel() != 0:
            return _BOOL_REDUCTIONS[op](args[0])
        if op is torch.ops.aten._grouped_mm.default and args[0].dtype is not torch.bfloat16:
            return _grouped_mm()(*args, **kwargs)
        return _without_alpha(op, args, kwargs)

    @staticmethod
    def _split(op: Any, args: list) -> tuple[list, dict]:
        pos, kw = op_info(op).split(args)
        return list(pos), dict(kw)


# A bool tensor's `max` / `min` as the `any` / `all` they are.  Inductor 2.13's C++ kernels for
# the `max` (`min`) of a bool that mixes a loaded bool and a comparison of floats did not build
# (`max_masked_reduce(VecMask<float, 1>&, VecMask<int, 1>&, ...)`): generate()'s stopping check
# `(unfinished & ~done).max() == 0` kept its graph on the quick tier.  Not for an empty tensor,
# whose `max` raises where `any` would answer (a symbolic size gets a guard: `numel() != 0`).
_BOOL_REDUCTIONS = {torch.ops.aten.max.default: torch.ops.aten.any.default,
                    torch.ops.aten.min.default: torch.ops.aten.all.default}


def _full_of(size: Any, value: torch.Tensor, *, dtype: torch.dtype, layout: Any = None, device: Any = None,
             pin_memory: Any = None) -> torch.Tensor:
    """`full(size, v, dtype=dtype)` for a lifted `v` (a 0-dim float64 tensor), with `full`'s
    values and contiguous layout: floating, ones times `v` (a 0-dim tensor does not promote
    within floating dtypes, so `v` is rounded once, to `dtype`, as eager's Python number is);
    bool, `v`'s truth (the product is float64).  `v` only meets a tensor of the device, as a
    0-dim operand (a CPU scalar on a CUDA device, as Adam's lifted floats)."""
    ones = torch.ops.aten.full.default(size, 1, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
    out = torch.ops.aten.mul.Tensor(ones, value)
    return torch.ops.aten.ne.Scalar(out, 0) if dtype is torch.bool else out


@functools.lru_cache(maxsize=None)
def _grouped_mm() -> Any:
    """`aten._grouped_mm` as an op Inductor calls as it is.  The CPU kernel computes float32 (a
    Mixtral's experts in transformers), but the meta kernel that tracing runs demands bf16, as
    CUDA's kernel does (the quick tier's shape inference takes eager's shapes there,
    `tensor/shapes.py`); this op's fake kernel asks the meta kernel in bf16 and answers in the
    inputs' dtype."""
    @torch.library.custom_op("ltc_async::grouped_mm", mutates_args=())
    def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.ops.aten._grouped_mm(a, b, offs, bias, out_dtype)

    @grouped_mm.register_fake
    def _(a, b, offs=None, bias=None, out_dtype=None):
        bf16 = torch.bfloat16
        out = torch.ops.aten._grouped_mm(a.to(bf16), b.to(bf16), offs,
                                         None if bias is None else bias.to(bf16), None)
        return out.new_empty(out.shape, dtype=out_dtype or a.dtype)
    return torch.ops.ltc_async.grouped_mm.default


class _Traced:
    """What `make_fx` traces for a build: the graph as a function of the program's arguments
    (tensor inputs, lifted floats as 0-dim tensors, then lifted ints), with `inputs` (one
    execution's, tensors as layouts) supplying the baked scalars; `lifts` records, after a trace,
    which lifted floats the trace used."""

    def __init__(self, interp: Interpreter, inputs: Sequence[Any]) -> None:
        self.lifting = _LiftingInterpreter.__new__(_LiftingInterpreter)
        self.lifting.__dict__.update(interp.__dict__)
        self.inputs = inputs
        self.slots = [i for i, v in enumerate(inputs) if isinstance(v, (torch.Tensor, TensorMeta))]
        self.scalar_slots = [i for i, v in enumerate(inputs) if not isinstance(v, (torch.Tensor, TensorMeta))]
        candidates = _candidates(interp.steps)
        self.lift_slots = [i for k, i in enumerate(self.scalar_slots) if k in candidates]
        self.int_slots = [self.scalar_slots[k] for k in interp.lifted_scalars]
        self.lifts: list[_Lift] = []

    def __call__(self, *args: Any) -> list[torch.Tensor]:
        vals = list(self.inputs)
        n, m = len(self.slots), len(self.lift_slots)
        for i, t in zip(self.slots, args):
            vals[i] = t
        self.lifts.clear()
        for i, t in zip(self.lift_slots, args[n:n + m]):
            self.lifts.append(_Lift(t, float(self.inputs[i]), i))
            vals[i] = self.lifts[-1]
        for i, v in zip(self.int_slots, args[n + m:]):
            vals[i] = v
        return self.lifting.execute(vals)

    def used(self) -> set[int]:
        return {lift.position for lift in self.lifts if lift.used}


def _with_a_wrapper(compile_once: Any, device: torch.device, threads: int | None, kind: str) -> tuple[Any, str]:
    """`compile_once(inductor config patch)` with Inductor's C++ wrapper, else (a build that
    failed) with its Python wrapper; the program and the first line of its text, which says
    which wrapper it got (module note, 3.).  A build that fails inside loop reordering is made
    again without that pass, and so is every later try (`_LOOP_REORDERING_FRAMES`)."""
    patch = {"compile_threads": 1, "cpp_wrapper": True}   # without the GIL (module note, 3.)
    if device.type == "cpu" and threads:
        patch["cpp.threads"] = threads
    from torch._inductor import config as inductor_config
    if hasattr(inductor_config, "emulate_precision_casts"):
        # a cast to a lower precision and back rounds, as in eager: fused, Inductor would
        # otherwise drop the pair (`x.to(bfloat16).float()`, a fake-quantization or a bf16
        # output read as float32, came out unrounded: 0.018 off eager)
        patch["emulate_precision_casts"] = True
    passes = ""   # what the text adds once a pass is off

    def built() -> Any:
        nonlocal passes
        try:
            return compile_once(patch)
        except Exception as e:  # noqa: BLE001 - re-raised unless loop reordering failed
            if passes or not _failed_in(e, _LOOP_REORDERING_FRAMES):
                raise
            patch.update({k: False for k in _LOOP_REORDERING_OPTIONS if hasattr(inductor_config, k)})
            passes = f", without loop reordering (the pass failed: {_first_line(e)})"
            return compile_once(patch)
    try:
        fn = built()
        return fn, f"# Inductor program, {kind}C++ wrapper{passes}\n"
    except Exception as e:  # noqa: BLE001 - built again with the Python wrapper
        # the C++ wrapper cannot call some fallback kernels (`_fused_adam`: "fallback
        # kernels with runtime lookup currently only support tensor returns"); the Python
        # wrapper can: the program then takes the GIL between kernels (the tier trial
        # keeps it only if it is faster)
        patch["cpp_wrapper"] = False
        fn = built()
        return fn, (f"# Inductor program, {kind}Python wrapper{passes} (the C++ wrapper's build failed: "
                    f"{_first_line(e)})\n")


# Inductor's loop reordering after fusion, a pass whose own failures a build can do without.
# PyTorch 2.11's asserts on a fused node that holds a template or an extern kernel
# (`assert isinstance(snode, SchedulerNode)` in `reorder_loops_by_dep_pair`, an empty
# message): GPT-2's whole training step on an H200 failed so, with both wrappers, and stayed
# on the quick tier.  Later versions skip such nodes.  The pass only chooses a faster loop
# order for fused kernels: a build it fails is made again without it.
_LOOP_REORDERING_FRAMES = frozenset({"shared_data_after_reordering_loop", "reorder_loops_by_dep_pair"})
_LOOP_REORDERING_OPTIONS = ("loop_ordering_after_fusion", "loop_reindexing_after_fusion")


def _failed_in(e: BaseException, functions: frozenset) -> bool:
    """Whether `e`, or an exception it was raised from, passed through a function named in
    `functions` (Inductor wraps its passes' errors: `InductorError`)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(f.name in functions for f in traceback.extract_tb(e.__traceback__)):
            return True
        e = e.__cause__ or e.__context__
    return False


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e).strip() else ''}"


def build(interp: Interpreter, device: torch.device, inputs: Sequence[Any],
          threads: int | None = None, check_shapes: bool = False) -> InductorProgram:
    """Compile the graph `interp` replays (see the module note).  `inputs`: one execution's
    inputs, where tensors may be replaced by their `TensorMeta` (only their layout is used).
    `threads`: the OpenMP threads the CPU kernels may use (the device worker's intra-op count:
    Inductor would otherwise build for every core and compete with the tracing thread).
    `check_shapes`: the program serves graphs of other shapes too (a skeleton's program), so
    it accepts only executions whose inputs have the shapes it was built for (an exact graph's
    shapes are fixed by its key: no check)."""
    from torch._inductor import config as inductor_config
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = _Traced(interp, inputs)
    slots, lift_slots = graph.slots, graph.lift_slots
    examples = [_example(inputs[i], device) for i in slots] + \
        _scalars([inputs[i] for i in lift_slots])
    with torch.no_grad():
        gm = make_fx(graph, tracing_mode="fake")(*examples)
        used = graph.used()
        if len(used) < len(lift_slots):    # lifted inputs the trace did not use: drop them
            keep = [k for k, i in enumerate(lift_slots) if i in used]
            gm = make_fx(_dropping(graph, len(slots), lift_slots, keep), tracing_mode="fake")(
                *(examples[:len(slots)] + [examples[len(slots) + k] for k in keep]))
            lift_slots = [lift_slots[k] for k in keep]
            lifts_used = set(lift_slots)
        else:
            lifts_used = used
        examples = examples[:len(slots)] + _scalars([inputs[i] for i in lift_slots])
        _views_as_reshapes(gm)
        n_outputs = _return_inputs(gm)

        def compile_once(patch: dict) -> Any:
            with inductor_config.patch(patch):
                return torch._inductor.compile(gm, examples)
        fn, wrapper = _with_a_wrapper(compile_once, device, threads, "")
    baked = tuple((i, type(inputs[i]), inputs[i]) for i in graph.scalar_slots if i not in lifts_used)
    return InductorProgram(fn, slots, lift_slots, baked, wrapper + gm.code, [e.stride() for e in examples[:len(slots)]],
                           n_outputs, [tuple(e.shape) for e in examples[:len(slots)]] if check_shapes else ())


def _return_inputs(gm: torch.fx.GraphModule) -> int:
    """Make the program return its inputs after its outputs (`InductorProgram.execute` drops
    them); the number of real outputs.  Inductor's C++ wrapper runs without the GIL and releases
    each input at its last use; the release of a tensor that Python owns takes the GIL (PyTorch
    drops the Python object's reference), so the device worker stalled mid-program, for up to
    `sys.getswitchinterval()` (5 ms) each time, while the tracing thread held the GIL.  Returned,
    the inputs are released on return, with the GIL held (what the TorchScript lowering does)."""
    graph = gm.graph
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    out.args = (outs + inputs,)
    gm.recompile()
    return len(outs)


def _views_as_reshapes(gm: torch.fx.GraphModule) -> None:
    """`view` nodes of the traced graph as `reshape`: Inductor re-propagates layouts with its
    own passes, where a tensor the trace could view may come out in a layout it cannot
    (a transposed `cat`); `reshape` is a view wherever one is possible."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    gm.recompile()


def _dropping(graph: Any, n_tensors: int, lift_slots: list[int], keep: list[int]) -> Any:
    """`graph` taking only the kept lifted scalars (the others are passed as their values)."""
    def inner(*args: torch.Tensor) -> Any:
        full = list(args[:n_tensors])
        kept = dict(zip(keep, args[n_tensors:]))
        for k in range(len(lift_slots)):
            full.append(kept[k] if k in kept else None)
        return graph(*full)
    return inner


def _scalars(values: list) -> list[torch.Tensor]:
    """Lifted scalars as the program receives them: 0-dim float64 elements of one tensor, made
    in one call (`InductorProgram.execute`); the build sees the same storage offsets, so the
    program's alignment checks hold at every execution."""
    return list(torch.tensor([float(v) for v in values], dtype=torch.float64).unbind()) if values else []


def _example(v: Any, device: torch.device) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    m: TensorMeta = v
    return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=device)


# -- shape-generic graphs --------------------------------------------------------------------------
#
# A shape-generic TorchScript program (`ltc_async/executor/generic.py`) serves every graph of one
# skeleton: `generate()`'s token at each cache length, a mixture of experts' step at each routing.
# Built here, its lifted ints are SymInt inputs and the tensor dimensions that varied while the
# program got hot are symbolic (`make_fx` in symbolic mode over a `ShapeEnv`, Inductor's
# decompositions applied as `torch.compile` would, then `compile_fx_inner`): one Inductor program
# for all of them.  What the trace assumed of the sizes (`s0 == s1 + 1`, a stride, `2 <= s0`:
# the `ShapeEnv`'s guards) is checked before each execution (`DynamicProgram.accepts`, ~10 us);
# an execution the guards reject runs the quick program, as one with other baked scalars does.
# A lifted int is any int constant of the graph (a slice's start, a dimension), not a size: its
# symbol has no sign assumed and stays a symbol at 0 and 1 (a `ShapeEnv` would otherwise make a
# 0 or 1 a constant that no guard checks).  Tensor dimensions that did not vary while the program
# got hot are static: a later graph of the skeleton with other such sizes is rejected by the
# guards and keeps running the quick program (the skeleton's program is built once).


class DynamicProgram(InductorProgram):
    """A shape-generic graph's Inductor program (see above): sizes are symbolic, and the
    trace's assumptions about them are checked by `accepts`."""

    def __init__(self, fn: Any, tensor_slots: list[int], lifted: list[int], ints: list[int], baked: tuple,
                 text: str, guard: Any, n_outputs: int) -> None:
        super().__init__(fn, tensor_slots, lifted, baked, text, (), n_outputs)
        self.ints = ints        # positions of the SymInt inputs among all inputs
        self.guard = guard      # the ShapeEnv's guards, a function of the program's arguments
        # The guards see the lifted floats' layouts (0-dim elements of one tensor, at storage
        # offsets 0, 1, ...), never their values: `accepts` passes these, made once, so only
        # `execute` makes the floats' tensor
        self._float_layouts = _scalars([0.0] * len(lifted))

    def _args(self, inputs: Sequence[Any]) -> list[Any]:
        args = [inputs[i] for i in self.tensor_slots]
        if self.lifted:
            args.extend(self._floats(inputs))
        args.extend(inputs[i] for i in self.ints)
        return args

    def accepts(self, inputs: Sequence[Any]) -> bool:
        if not super().accepts(inputs):
            return False
        try:
            return bool(self.guard([inputs[i] for i in self.tensor_slots] + self._float_layouts +
                                   [inputs[i] for i in self.ints]))
        except Exception:  # noqa: BLE001 - a guard that cannot be evaluated serves nothing
            return False

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        return list(self.fn(self._args(inputs))[:self.n_outputs])


def _cpp_wrapper_config() -> dict:
    """The settings `compile_fx` gives a build with the C++ wrapper (`get_cpp_wrapper_config`:
    Triton kernels tuned at build time, their binaries kept), where this PyTorch has them."""
    from torch._inductor import compile_fx
    get = getattr(compile_fx, "get_cpp_wrapper_config", None)
    return get() if get is not None else {}


def _guard_function(code: str | None) -> Any:
    """The `ShapeEnv`'s guard expression (over `L['t<k>']`, the k-th argument) as a function of
    the argument list, compiled once."""
    import re

    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP
    if not code:
        return lambda args: True
    body = re.sub(r"L\['t(\d+)'\]", r"a[\1]", code)
    return eval(compile(f"lambda a: {body}", "<ltc_async guards>", "eval"), dict(SYMPY_INTERP))  # noqa: S307


def build_generic(interp: Interpreter, device: torch.device, inputs: Sequence[Any], varying: Any,
                  threads: int | None = None) -> DynamicProgram:
    """Compile the shape-generic graph `interp` replays (`Interpreter.with_lifted_ints`): its
    lifted ints and the tensor dimensions in `varying` ((input position, dim) pairs) symbolic."""
    from torch._dynamo.source import ConstantSource
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    graph = _Traced(interp, inputs)
    slots, lift_slots, int_slots = graph.slots, graph.lift_slots, graph.int_slots
    env = ShapeEnv()
    fake_mode = FakeTensorMode(shape_env=env)
    fakes = []
    for i in slots:
        example = _example(inputs[i], device)
        dims = [DimDynamic.DYNAMIC if (i, d) in varying else DimDynamic.STATIC for d in range(example.dim())]
        fakes.append(fake_mode.from_tensor(example, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)))
    fakes += [fake_mode.from_tensor(t) for t in _scalars([inputs[i] for i in lift_slots])]
    # a lifted int is any int constant of the graph, not a size: its sign is left open (a
    # symbol is positive by default, and the build refused a negative one: `x[:, -n:]`), and
    # a 0 or 1 stays a symbol (by default the ShapeEnv makes it a constant that no guard
    # checks; the build then failed on its placeholder: "KeyError: 'val'")
    fakes += [env.create_symintnode(env.create_symbol(inputs[i], ConstantSource(f"ltc_int{k}"),
                                                      dynamic_dim=DimDynamic.DYNAMIC, positive=None,
                                                      do_not_specialize_zero_one=True),
                                    hint=inputs[i])
              for k, i in enumerate(int_slots)]
    with torch.no_grad():
        gm = make_fx(graph, tracing_mode="symbolic", decomposition_table=select_decomp_table())(*fakes)
        used = graph.used()
        placeholders = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        # every size and stride the program assumes, static ones included
        guard = _guard_function(env.produce_guards_expression(placeholders, ignore_static=False))
        _views_as_reshapes(gm)
        n_outputs = _return_inputs(gm)

        def compile_once(patch: dict) -> Any:
            # `compile_fx_inner` takes the wrapper from its argument, not from the config that
            # `torch._inductor.compile` reads (passed the config alone, every shape-generic
            # program got the Python wrapper, and its text said "C++ wrapper"); and the C++
            # wrapper's own settings, which `compile_fx` adds before it calls `compile_fx_inner`
            # (without them, on an H200 with torch 2.11, each CUDA build of the C++ wrapper
            # failed, "CudaKernelParamCache not populated": its kernels were not tuned at build)
            with tracing(TracingContext(fake_mode)), V.set_fake_mode(fake_mode), inductor_config.patch(patch):
                with inductor_config.patch(_cpp_wrapper_config() if patch["cpp_wrapper"] else {}):
                    return compile_fx_inner(gm, placeholders, cpp_wrapper=patch["cpp_wrapper"])
        fn, wrapper = _with_a_wrapper(compile_once, device, threads, "shape-generic, ")
    baked = tuple((i, type(inputs[i]), inputs[i]) for i in graph.scalar_slots
                  if i not in used and i not in int_slots)
    return DynamicProgram(fn, slots, lift_slots, int_slots, baked, wrapper + gm.code, guard, n_outputs)
