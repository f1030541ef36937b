"""What the generic op path needs to know about an aten op, read once from its schema.

This is ltc_async's answer to LTC's torchgen `LazyIrSchema`: instead of generating one IR class
per op, every `OpOverload._schema` is read once into an `OpInfo` that says which arguments are
tensors (operands), which are scalars (runtime inputs), which are generators (RNG seeds) and
which are constants (node attributes), and how to bind a call's `args`/`kwargs` to them.
"""
from __future__ import annotations

from typing import Any

import torch

# Argument kinds.  NUM_CONST: a constant in a slot that takes floats or Scalars, which the
# template stores exactly (see `ir.node.exact`).
CONST, TENSOR, OPT_TENSOR, TENSOR_LIST, SCALAR, GENERATOR, NUM_CONST = range(7)
_NO_DEFAULT = object()
_NUM_TYPES = (torch._C.FloatType, torch._C.NumberType, torch._C.ComplexType)


def _holds_numbers(t: torch._C.JitType) -> bool:
    """Does a constant slot of this type take floats or Scalars (alone, optional or in a list)?"""
    if isinstance(t, (torch._C.OptionalType, torch._C.ListType)):
        return _holds_numbers(t.getElementType())
    return isinstance(t, _NUM_TYPES)


def _is_optional_tensor_list(t: torch._C.JitType) -> bool:
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch._C.ListType) and isinstance(t.getElementType(), torch._C.OptionalType)


def _arg_kind(t: torch._C.JitType) -> int:
    if isinstance(t, torch._C.TensorType):
        return TENSOR
    if isinstance(t, torch._C.OptionalType):
        inner = t.getElementType()
        if isinstance(inner, torch._C.TensorType):
            return OPT_TENSOR
        if isinstance(inner, torch._C._GeneratorType):
            return GENERATOR
        if isinstance(inner, torch._C.ListType) and isinstance(inner.getElementType(), torch._C.TensorType):
            return TENSOR_LIST
        # Scalar? (clamp min/max, ...), float?: a constant, None-able
        return NUM_CONST if _holds_numbers(inner) else CONST
    if isinstance(t, torch._C.ListType):
        el = t.getElementType()
        if isinstance(el, torch._C.TensorType) or (
            isinstance(el, torch._C.OptionalType) and isinstance(el.getElementType(), torch._C.TensorType)
        ):
            return TENSOR_LIST
        return NUM_CONST if _holds_numbers(el) else CONST
    if isinstance(t, torch._C.NumberType):
        return SCALAR
    if isinstance(t, torch._C._GeneratorType):
        return GENERATOR
    return NUM_CONST if _holds_numbers(t) else CONST


_FILLS = {"aten::full": "fill_value", "aten::scalar_tensor": "s"}
# see `OpInfo.compiled_as`
_RESHAPES = ("aten::view_copy", "aten::_unsafe_view", "aten::_reshape_alias_copy")
_LAZY_BIT_COPIES = ("_conj_copy", "_neg_view_copy")
_COPIED = {"slice_scatter": ("src",), "select_scatter": ("src",), "diagonal_scatter": ("src",),
           "as_strided_scatter": ("src",),
           "resize_as": ("the_template",), "resize_as_": ("the_template",)}


class OpInfo:
    """Schema facts about one `OpOverload`, cached (see `op_info`)."""

    __slots__ = ("op", "name", "qualname", "counter", "identity", "arg_names", "kinds", "defaults", "n_positional_max", "index_of",
                 "returns", "returns_only_tensors", "is_factory", "has_generator", "seeded", "n_args", "default_tails",
                 "dynamic_shape", "view_op", "compiled_as", "written", "is_inplace_or_out", "generator_twin",
                 "index_lists", "copied", "fill_scalars", "fill_dtype")

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.op = op
        self.name = schema.name.split("::")[-1] + ("." + schema.overload_name if schema.overload_name else "")
        # Keys use this string rather than the OpOverload: its hash is cached by Python, while
        # OpOverload.__hash__ is a Python-level method (measurable on the per-op path).
        self.qualname = schema.name + ("." + schema.overload_name if schema.overload_name else "")
        self.counter = "ltc::" + schema.name.split("::")[-1]   # per-op trace counter
        self.identity = False  # set by the dispatcher for ops that are the identity on values
        self.arg_names = tuple(a.name for a in schema.arguments)
        self.kinds = tuple(_arg_kind(a.type) for a in schema.arguments)
        self.defaults = tuple(a.default_value if a.has_default_value() else _NO_DEFAULT
                              for a in schema.arguments)
        self.n_positional_max = sum(1 for a in schema.arguments if not a.kwarg_only)
        # Binding without kwargs: `args + default_tails[len(args)]` (None where an argument
        # after `len(args)` has no default).
        self.n_args = len(self.kinds)
        self.default_tails = tuple(
            None if any(d is _NO_DEFAULT for d in self.defaults[n:]) else tuple(self.defaults[n:])
            for n in range(self.n_args))
        self.index_of = {a.name: i for i, a in enumerate(schema.arguments)}
        rets = []
        for r in schema.returns:
            k = _arg_kind(r.type)
            rets.append(k)
        self.returns = tuple(rets)
        self.returns_only_tensors = bool(rets) and all(k in (TENSOR, TENSOR_LIST) for k in rets)
        self.is_factory = not any(k in (TENSOR, OPT_TENSOR, TENSOR_LIST) for k in self.kinds)
        # `Tensor?[]` arguments are index lists (`index`, `index_put`), where host tensors are
        # allowed beside device tensors, as on eager CUDA; `Tensor[]` ones (`cat`) must match
        self.index_lists = frozenset(i for i, a in enumerate(schema.arguments)
                                     if self.kinds[i] == TENSOR_LIST and _is_optional_tensor_list(a.type))
        # Arguments eager only copies from, so a host tensor there is taken as it is on CUDA
        # (`slice_scatter` and kin are `clone` + `copy_`, `resize_as` reads a shape)
        wanted = _COPIED.get(schema.name.split("::")[-1], ())
        self.copied = frozenset(i for i, a in enumerate(schema.arguments) if a.name in wanted)
        # A factory's Scalars are constants (`arange`'s decide its shape), except a fill value:
        # `full`'s and `scalar_tensor`'s stay runtime scalars, so a flag made with
        # `torch.full((n,), is_done, dtype=torch.bool)` (transformers' stopping criteria) does
        # not make a new graph when it turns True.  `fill_dtype`: the dtype argument, which
        # must be given for a bool fill to travel as an int (else the fill decides the dtype).
        fill = _FILLS.get(schema.name) if self.is_factory else None
        self.fill_scalars = frozenset(i for i, a in enumerate(schema.arguments)
                                      if fill and a.name == fill and self.kinds[i] == SCALAR)
        self.fill_dtype = self.index_of.get("dtype") if self.fill_scalars else None
        self.has_generator = GENERATOR in self.kinds
        tags = op.tags
        self.seeded = torch.Tag.nondeterministic_seeded in tags
        self.dynamic_shape = torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags
        # Arguments the op writes in place.  c10d collectives (`c10d::allreduce_`, ...) mutate
        # their first argument without saying so in the schema.
        ns = schema.name.split("::")[0]
        if ns == "c10d" and schema.name.endswith("_"):
            self.written: tuple[int, ...] = (0,)
        else:
            self.written = tuple(i for i, a in enumerate(schema.arguments)
                                 if a.alias_info is not None and a.alias_info.is_write)
        self.is_inplace_or_out = bool(self.written)
        # For `x_copy` ops produced by functionalization, the view op `x` gives eager's strides.
        base = schema.name.split("::")[-1]
        self.view_op = None
        if base.endswith("_copy") and base not in ("_copy", "copy"):
            packet = getattr(torch.ops.aten, base[: -len("_copy")], None)
            if packet is not None:
                self.view_op = getattr(packet, schema.overload_name or "default", None)
        # The op a compiled program runs for this one (the TorchScript and Inductor tiers).
        # Values in a program are never mutated, so a view copy runs as its view: no copy, the
        # same values.  Except the copies that only set a lazy conjugate / negative bit, which
        # later ops (view_as_real) reject; and the reshape family, which runs as `reshape`: a
        # program's values need not have eager's strides (after a `contiguous()` that was the
        # identity on values), and `reshape` is a view wherever one is possible.
        if schema.name in _RESHAPES and schema.overload_name == "":
            self.compiled_as = torch.ops.aten.reshape.default
        elif (self.view_op is not None and base not in _LAZY_BIT_COPIES
              and len(self.view_op._schema.arguments) == len(schema.arguments)):
            self.compiled_as = self.view_op
        else:
            self.compiled_as = op

        # A random op without a Generator argument (`rand.default`, `rand_like.default`) is
        # traced as its overload that takes one, so it draws from the per-device seed.
        self.generator_twin = None
        if self.seeded and not self.has_generator:
            packet = getattr(torch.ops.aten, schema.name.split("::")[-1], None)
            want = set(self.arg_names) | {"generator"}
            for name in (packet.overloads() if packet is not None else ()):
                cand = getattr(packet, name)
                names = [a.name for a in cand._schema.arguments]
                if set(names) == want and not cand._schema.is_mutable:
                    self.generator_twin = cand
                    break

    def split(self, full: list) -> tuple[list, dict]:
        """A bound argument list back into (positional args, keyword-only kwargs)."""
        n = self.n_positional_max
        return list(full[:n]), {self.arg_names[i]: full[i] for i in range(n, len(full))}

    def bind(self, args: tuple, kwargs: dict) -> list[Any]:
        """Full argument list in schema order, defaults filled in."""
        n = len(self.kinds)
        if len(args) == n:
            return list(args)
        full = list(args)
        defaults = self.defaults
        for i in range(len(args), n):
            v = kwargs.get(self.arg_names[i], _NO_DEFAULT) if kwargs else _NO_DEFAULT
            if v is _NO_DEFAULT:
                v = defaults[i]
                if v is _NO_DEFAULT:
                    raise TypeError(f"{self.name}() missing argument '{self.arg_names[i]}'")
            full.append(v)
        return full


_aten_schemas: list | None = None


def aten_schemas() -> list:
    """Every `aten::` schema PyTorch knows, read once (the one-time registrations all scan them)."""
    global _aten_schemas
    if _aten_schemas is None:
        _aten_schemas = [s for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")]
    return _aten_schemas


_infos: dict[int, OpInfo] = {}  # by id(op): OpOverloads live as long as the process


def op_info(op: torch._ops.OpOverload) -> OpInfo:
    info = _infos.get(id(op))
    if info is None:
        info = _infos[id(op)] = OpInfo(op)
    return info


_SCALAR_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                 torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
                 torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
                 torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}


def type_name(dtype: torch.dtype) -> str:
    """PyTorch's ScalarType name (`Float`, `Long`, ...), as eager's error messages spell it."""
    return _SCALAR_NAMES.get(dtype, str(dtype))
