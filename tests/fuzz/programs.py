"""Random tensor programs for differential testing: ltc against eager PyTorch on the CPU.

A `Program` is a list of `Step`s over an environment of variables `v0, v1, ...`.  Steps create
inputs (seeded values, random layouts: transposed, sliced with steps, expanded, offset, made on
the host or as views on the device), apply ops (elementwise with type promotion and Python
scalars, reductions, matmul, views, in-place ops on views, indexing, scatter/gather, cat/stack,
casts, a round trip through another device), and mark observation points (`.cpu()` reads,
`.item()`, `ltc.mark_step()`, `ltc.sync`).  `run(program, device)` executes it and returns
what it observed; eager on `cpu` is the reference.

Determinism: a program is a pure function of the hypothesis draw (values come from seeded
generators).  Generation runs each candidate step eagerly on the CPU and drops the ones eager
rejects, except that a program sometimes ends on such a step: ltc must reject it at the same
step (or, for errors only the values can tell, when the result is read).

Twin constants: every Python scalar is drawn with a *twin* that Python calls equal or nearly so
(`1`/`1.0`/`True`, `0.0`/`-0.0`, NaN of the other sign).  `run(..., twin=True)` uses the twins:
the same structure with other constants, which must not hit a cache entry made for the first.
`str(program)` prints the program as Python source (with `a|b` for twin constants).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from hypothesis import strategies as st

import ltc_async as ltc
from ltc_async.patches.inplace import aliasing

FLOATS = (torch.float32, torch.float64)
INTS = (torch.int64, torch.int32)
DTYPES = FLOATS + INTS + (torch.bool,)
NAN = float("nan")

# Python scalars and their confusable twins (type or sign differs, Python may call them equal)
SCALAR_PAIRS = [
    (1, 1.0), (1.0, True), (True, 1), (0, 0.0), (0.0, -0.0), (-0.0, 0.0), (False, 0), (2, 2.0),
    (-1, -1.0), (0.5, 0.5), (-2.5, -2.5), (3, 3), (NAN, -NAN), (math.inf, -math.inf),
    (-math.inf, math.inf), (2 ** 31, 2 ** 31 + 1), (2 ** 40, 2 ** 40), (-2 ** 63, -2 ** 63 + 1),
    (2 ** 63, 2 ** 63 + 5), (1e-3, 1e-3), (7, -7), (1e30, -1e30),
]


@dataclass
class Ctx:
    """What a running step sees: the device, the twin switch, observations, autograd leaves."""
    dev: str
    twin: bool
    other: str | None = None            # a second device for round trips (None: same)
    observed: list = field(default_factory=list)
    leaves: list = field(default_factory=list)

    def const(self, pair: tuple) -> Any:
        return pair[1] if self.twin else pair[0]

    @property
    def lazy(self) -> bool:
        return self.dev.startswith("ltc")


@dataclass
class Step:
    text: str                                   # source, `{0}`.. name the operands
    fn: Callable[..., Any]                      # fn(ctx, *operands) -> value | None
    operands: tuple[int, ...] = ()
    out: bool = True                            # the result becomes a new variable
    expands: bool = False                       # ... a view ltc writes on the host
                                                # (through `expand`, `unfold`, `as_strided`)

    def source(self, index: int) -> str:
        body = self.text.format(*(f"v{i}" for i in self.operands))
        return f"v{index} = {body}" if self.out else body


class Program:
    """Steps, printed as source (also in hypothesis' failure reports)."""

    def __init__(self, steps: list[Step], autograd: bool) -> None:
        self.steps = steps
        self.autograd = autograd

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text("Program:\n" + str(self))

    def __str__(self) -> str:
        lines, n = [], 0
        for s in self.steps:
            lines.append(s.source(n))
            n += s.out
        return "\n".join(lines)

    __repr__ = __str__


# -- running --------------------------------------------------------------------------------

class StepError(Exception):
    """A step raised: which one, and what (compared between eager and ltc)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"step {index}: {type(error).__name__}: {error}")
        self.index = index
        self.error = error


def _host(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().to("cpu", copy=True)
    return v


def run(program: Program, dev: str, twin: bool = False, other: str | None = None) -> list:
    """Execute on `dev`; return the observations: (label, value) pairs.  A step that raises
    ends the run with `StepError` (the observations so far are in `.observed`)."""
    ctx = Ctx(dev, twin, other)
    env: list[Any] = []
    k = 0
    for k, step in enumerate(program.steps):
        try:
            value = step.fn(ctx, *(env[i] for i in step.operands))
        except Exception as e:  # noqa: BLE001 - compared with eager's behaviour
            err = StepError(k, e)
            err.observed = ctx.observed
            raise err from e
        if step.out:
            env.append(value)
    try:
        for i, v in enumerate(env):  # final state of every variable (views and bases alike)
            if isinstance(v, torch.Tensor):
                ctx.observed.append((f"final v{i}", _host(v)))
        if program.autograd:
            _backward(ctx, env)
    except Exception as e:  # noqa: BLE001
        err = StepError(len(program.steps), e)
        err.observed = ctx.observed
        raise err from e
    return ctx.observed


def _backward(ctx: Ctx, env: list) -> None:
    outs = [v for v in env if isinstance(v, torch.Tensor) and v.requires_grad]
    if not outs or not ctx.leaves:
        return
    loss = sum((o.float() * (k + 1)).sum() for k, o in enumerate(outs))
    grads = torch.autograd.grad(loss, ctx.leaves, allow_unused=True)
    for i, g in enumerate(grads):
        ctx.observed.append((f"grad leaf{i}", None if g is None else _host(g)))


def compare(got: list, expected: list, where: str = "", loose: bool = False) -> None:
    """Observations must agree: labels, dtypes, shapes, values (NaN equal to NaN).  `loose`:
    floating values within float32's tolerance whatever their dtype (a compiler's reduction
    order: a float64 gradient that flowed through a float32 sum)."""
    tol = {"rtol": 1.3e-6, "atol": 1e-5} if loose else {}
    assert [lbl for lbl, _ in got] == [lbl for lbl, _ in expected], f"different observation points {where}"
    for (label, a), (_, e) in zip(got, expected):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), (label, a, where)
            assert a.dtype == e.dtype, (label, a.dtype, e.dtype, where)
            assert a.shape == e.shape, (label, a.shape, e.shape, where)
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m: f"{label}: {m} {where}",
                                       **(tol if e.dtype.is_floating_point or e.dtype.is_complex else {}))
        elif isinstance(e, float) and math.isnan(e):
            assert isinstance(a, float) and math.isnan(a), (label, a, where)
        elif isinstance(e, float):   # a float's .item(): the tolerance of a float32 tensor
            # (a reduction's order may differ: `outer(v, v).sum()` of 65536 products, 3e-7 apart)
            assert type(a) is float and math.isclose(a, e, rel_tol=1.3e-6, abs_tol=1e-5), (label, a, e, where)
        else:
            assert type(a) is type(e) and a == e, (label, a, e, where)


# -- generation ------------------------------------------------------------------------------

@dataclass
class Gen:
    """Generation state: the program so far, run eagerly on the CPU as it grows."""
    autograd: bool
    steps: list[Step] = field(default_factory=list)
    env: list[Any] = field(default_factory=list)
    ctx: Ctx = field(default_factory=lambda: Ctx("cpu", False))
    expanding: set = field(default_factory=set)  # variables that are such views (Step.expands)

    def add(self, step: Step) -> str:
        """Run `step` eagerly and append it: "ok", or "error" if eager raised (the caller keeps
        it as the last step or drops it).  Steps eager lacks a kernel for ("not implemented for
        'Float'") are dropped: ltc only finds that out when the graph runs."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = step.fn(self.ctx, *(self.env[i] for i in step.operands))
        except NotImplementedError:
            return "dropped"
        except Exception:  # noqa: BLE001 - a step eager rejects
            return "error"
        self.steps.append(step)
        if step.out:
            if step.expands:
                self.expanding.add(len(self.env))
            self.env.append(value)
        return "ok"

    def tensors(self, pred: Callable[[torch.Tensor], bool] = lambda t: True) -> list[int]:
        return [i for i, v in enumerate(self.env) if isinstance(v, torch.Tensor) and pred(v)]


def _values(seed: int, shape: tuple, dtype: torch.dtype, special: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in INTS:
        return torch.randint(-6, 7, shape, generator=g, dtype=dtype)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype)
    if special and x.numel() > 2:
        flat = x.view(-1)
        flat[0], flat[-1] = NAN, -0.0
    return x


LAYOUTS = ("contiguous", "transposed", "sliced", "expanded", "offset")


def _storage_shape(shape: tuple, layout: str) -> tuple:
    if layout == "transposed":
        return tuple(reversed(shape))
    if layout == "sliced":
        return shape[:-1] + (shape[-1] * 2,)
    if layout == "expanded":
        return tuple(1 if i % 2 == 0 else s for i, s in enumerate(shape))
    if layout == "offset":
        return (shape[0] + 1,) + shape[1:]
    return shape


def _apply_layout(t: torch.Tensor, shape: tuple, layout: str) -> torch.Tensor:
    if layout == "transposed":
        return t.permute(*reversed(range(t.dim())))
    if layout == "sliced":
        return t[..., ::2]
    if layout == "expanded":
        return t.expand(shape)
    if layout == "offset":
        return t[1:]
    return t


@st.composite
def input_step(draw: Any, gen: Gen) -> Step:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from(FLOATS if gen.autograd else DTYPES))
    layout = draw(st.sampled_from(LAYOUTS)) if shape else "contiguous"
    on_device = draw(st.booleans())          # views made on the device, or a strided host tensor
    special = draw(st.booleans()) and dtype in FLOATS and not gen.autograd
    seed = draw(st.integers(0, 2 ** 16))
    grad = gen.autograd
    stored = _storage_shape(shape, layout)

    def fn(ctx: Ctx) -> torch.Tensor:
        data = _values(seed, stored, dtype, special)
        if on_device:
            t = data.to(ctx.dev) if ctx.dev != "cpu" else data.clone()
            if grad:
                t.requires_grad_()
                ctx.leaves.append(t)
            return _apply_layout(t, shape, layout)
        host = _apply_layout(data, shape, layout)
        t = host.to(ctx.dev) if ctx.dev != "cpu" else host.clone()  # what `.to(device)` makes
        if grad:
            t.requires_grad_()
            ctx.leaves.append(t)
        return t
    where = "device" if on_device else "host"
    return Step(f"input({list(shape)}, {dtype}, {layout} on {where}, seed={seed}{', grad' if grad else ''})",
                fn, expands=on_device and layout == "expanded")


def _pair(draw: Any) -> tuple:
    return draw(st.sampled_from(SCALAR_PAIRS))


def _fmt(pair: tuple) -> str:
    return repr(pair[0]) if pair[0] is pair[1] or repr(pair[0]) == repr(pair[1]) else f"{pair[0]!r}|{pair[1]!r}"


UNARY = {
    "neg": lambda a: -a if a.dtype != torch.bool else ~a,
    "abs": torch.abs, "exp": torch.exp, "sin": torch.sin, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "sqrt_abs": lambda a: a.abs().sqrt(), "log1p_abs": lambda a: a.abs().log1p(),
    "floor": torch.floor, "round": torch.round, "sign": torch.sign, "square": torch.square,
    "reciprocal": torch.reciprocal, "logical_not": torch.logical_not, "isnan": torch.isnan,
    "bitwise_not": torch.bitwise_not, "nan_to_num": lambda a: torch.nan_to_num(a, nan=-0.0, posinf=1.0),
    "contiguous": lambda a: a.contiguous(), "clone": lambda a: a.clone(), "detach": lambda a: a.detach().clone() if a._is_view() else a.detach(),  # see inplace.base_of
    "float": lambda a: a.float(), "double": lambda a: a.double(), "long": lambda a: a.long(),
    "int": lambda a: a.int(), "bool": lambda a: a.bool(), "half_float": lambda a: a.half().float(),
}
BINARY = {
    "add": torch.add, "sub": lambda a, b: a - b, "mul": torch.mul, "div": torch.div,
    "floor_divide": lambda a, b: torch.floor_divide(a, (b.abs() % 3 + 1).to(b.dtype)
                                                    if not b.is_floating_point() else b),
    "remainder": lambda a, b: torch.remainder(a, (b.abs() % 3 + 1).to(b.dtype)
                                              if not b.is_floating_point() else b),
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "lt": torch.lt,
    "ge": torch.ge, "logical_and": torch.logical_and, "bitwise_xor": torch.bitwise_xor,
    "atan2": torch.atan2, "where": lambda a, b: torch.where(a > 0, a, b),
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2), "pow_abs": lambda a, b: a.abs() ** b,
    "copysign": torch.copysign, "hypot": torch.hypot, "lerp": lambda a, b: torch.lerp(a, b, 0.25),
}
SCALAR_OPS = {
    "add_s": (lambda a, s: a + s, "{0} + {s}"), "radd_s": (lambda a, s: s + a, "{s} + {0}"),
    "mul_s": (lambda a, s: a * s, "{0} * {s}"), "sub_s": (lambda a, s: a - s, "{0} - {s}"),
    "rsub_s": (lambda a, s: s - a, "{s} - {0}"), "div_s": (lambda a, s: a / s, "{0} / {s}"),
    "rdiv_s": (lambda a, s: s / a, "{s} / {0}"), "pow_s": (lambda a, s: a.abs() ** s, "{0}.abs() ** {s}"),
    "gt_s": (lambda a, s: a > s, "{0} > {s}"), "eq_s": (lambda a, s: a == s, "{0} == {s}"),
    "clamp_min": (lambda a, s: a.clamp(min=s), "{0}.clamp(min={s})"),
    "clamp_max": (lambda a, s: a.clamp(max=s), "{0}.clamp(max={s})"),
    "fill_like": (lambda a, s: torch.full_like(a, s), "torch.full_like({0}, {s})"),
    "where_s": (lambda a, s: torch.where(a > 0, a, s), "torch.where({0} > 0, {0}, {s})"),
    "masked_fill": (lambda a, s: a.masked_fill(a < 0, s), "{0}.masked_fill({0} < 0, {s})"),
    "full": (lambda a, s: torch.full((2,), s, device=a.device), "torch.full((2,), {s})"),
    "arange": (lambda a, s: torch.arange(s, device=a.device) if abs(s) < 50 else a,
               "torch.arange({s})"),
    "threshold": (lambda a, s: torch.nn.functional.threshold(a, s, s), "F.threshold({0}, {s}, {s})"),
}


@st.composite
def elementwise_step(draw: Any, gen: Gen) -> Step | None:
    pool = gen.tensors()
    if not pool:
        return None
    a = draw(st.sampled_from(pool))
    kind = draw(st.sampled_from(["unary", "binary", "scalar"]))
    if kind == "unary":
        name = draw(st.sampled_from(sorted(UNARY)))
        f = UNARY[name]
        return Step(f"{name}({{0}})", lambda ctx, x: f(x), (a,), expands=name == "detach" and a in gen.expanding)
    if kind == "binary":
        b = draw(st.sampled_from(pool))
        name = draw(st.sampled_from(sorted(BINARY)))
        f = BINARY[name]
        return Step(f"{name}({{0}}, {{1}})", lambda ctx, x, y: f(x, y), (a, b))
    name = draw(st.sampled_from(sorted(SCALAR_OPS)))
    f, text = SCALAR_OPS[name]
    pair = _pair(draw)
    return Step(text.replace("{s}", _fmt(pair)), lambda ctx, x: f(x, ctx.const(pair)), (a,))


REDUCTIONS = {
    "sum": lambda a, d, k: a.sum(d, keepdim=k), "mean": lambda a, d, k: a.mean(d, keepdim=k),
    "amax": lambda a, d, k: a.amax(d, keepdim=k), "amin": lambda a, d, k: a.amin(d, keepdim=k),
    "prod": lambda a, d, k: a.prod(d, keepdim=k), "argmax": lambda a, d, k: a.argmax(d, keepdim=k),
    "std": lambda a, d, k: a.std(d, keepdim=k), "var": lambda a, d, k: a.var(d, keepdim=k, correction=0),
    "any": lambda a, d, k: a.any(d, keepdim=k), "all": lambda a, d, k: a.all(d, keepdim=k),
    "logsumexp": lambda a, d, k: a.logsumexp(d, keepdim=k), "cumsum": lambda a, d, k: a.cumsum(d),
    "cummax": lambda a, d, k: a.cummax(d)[0], "softmax": lambda a, d, k: a.softmax(d),
    "sort": lambda a, d, k: a.sort(d, stable=True)[0], "max_dim": lambda a, d, k: a.max(d, keepdim=k)[0],
    "norm": lambda a, d, k: a.norm(dim=d, keepdim=k), "count_nonzero": lambda a, d, k: a.count_nonzero(d),
    "sum_all": lambda a, d, k: a.sum(), "mean_f64": lambda a, d, k: a.mean(d, dtype=torch.float64),
    "sum_int": lambda a, d, k: a.sum(d, dtype=torch.int64),
}


@st.composite
def reduction_step(draw: Any, gen: Gen) -> Step | None:
    pool = gen.tensors(lambda t: t.dim() > 0)
    if not pool:
        return None
    a = draw(st.sampled_from(pool))
    name = draw(st.sampled_from(sorted(REDUCTIONS)))
    dim = draw(st.integers(-gen.env[a].dim(), gen.env[a].dim() - 1))
    keep = draw(st.booleans())
    f = REDUCTIONS[name]
    return Step(f"{name}({{0}}, dim={dim}, keepdim={keep})", lambda ctx, x: f(x, dim, keep), (a,))


@st.composite
def matmul_step(draw: Any, gen: Gen) -> Step | None:
    pool = gen.tensors(lambda t: t.dim() >= 1 and t.dtype in FLOATS)
    if not pool:
        return None
    a = draw(st.sampled_from(pool))
    b = draw(st.sampled_from(pool))
    how = draw(st.sampled_from(["matmul", "matmul_t", "outer", "einsum", "linear"]))
    if how == "matmul":
        return Step("{0} @ {1}", lambda ctx, x, y: x @ y.to(x.dtype), (a, b))
    if how == "matmul_t":
        return Step("{0} @ {1}.mT", lambda ctx, x, y: x @ y.to(x.dtype).mT, (a, b))
    if how == "outer":
        return Step("outer({0}.flatten(), {1}.flatten())",
                    lambda ctx, x, y: torch.outer(x.flatten(), y.flatten().to(x.dtype)), (a, b))
    if how == "einsum":
        return Step("einsum('...i,...i->...', {0}, {1})",
                    lambda ctx, x, y: torch.einsum("...i,...i->...", x, y.to(x.dtype)), (a, b))
    return Step("F.linear({0}, {1})", lambda ctx, x, y: torch.nn.functional.linear(x, y.to(x.dtype)), (a, b))


VIEWS = {
    "t": lambda a, r: a.t() if a.dim() <= 2 else a.transpose(0, -1),
    "transpose": lambda a, r: a.transpose(r % a.dim(), (r // 3) % a.dim()),
    "permute": lambda a, r: a.permute(*reversed(range(a.dim()))),
    "unsqueeze": lambda a, r: a.unsqueeze(r % (a.dim() + 1)),
    "squeeze": lambda a, r: a.squeeze(),
    "flatten": lambda a, r: a.flatten(),
    "view_flat": lambda a, r: a.view(-1),
    "reshape": lambda a, r: a.reshape(a.shape[::-1]) if a.dim() else a.reshape(1),
    "expand": lambda a, r: a.unsqueeze(0).expand(2, *a.shape),
    "expand_as1": lambda a, r: a[..., :1].expand(a.shape) if a.dim() else a.expand(3),
    "select": lambda a, r: a.select(r % a.dim(), 0),
    "narrow": lambda a, r: a.narrow(r % a.dim(), a.shape[r % a.dim()] // 2, (a.shape[r % a.dim()] + 1) // 2),
    "slice_step": lambda a, r: a[::2],
    "slice_neg": lambda a, r: a[..., 1:],
    "diagonal": lambda a, r: a.diagonal(),
    "unfold": lambda a, r: a.unfold(-1, 2, 1),
    "movedim": lambda a, r: a.movedim(0, -1),
    "chunk": lambda a, r: a.chunk(2, r % a.dim())[-1],
    "split": lambda a, r: a.split(1, r % a.dim())[0],
    "unbind": lambda a, r: a.unbind(r % a.dim())[-1],
    "as_strided": lambda a, r: a.as_strided((2,), (1 + r % 2,)),
    "index_int": lambda a, r: a[r % a.shape[0]],
    "index_ellipsis": lambda a, r: a[..., None, :1],
}


@st.composite
def view_step(draw: Any, gen: Gen) -> Step | None:
    pool = gen.tensors()
    if not pool:
        return None
    a = draw(st.sampled_from(pool))
    name = draw(st.sampled_from(sorted(VIEWS)))
    r = draw(st.integers(0, 8))
    f = VIEWS[name]
    return Step(f"{name}({{0}}, {r})", lambda ctx, x: f(x, r), (a,),
                expands=name in ("expand", "expand_as1", "unfold", "as_strided") or a in gen.expanding)


INPLACE = {
    "add_": lambda x, y: x.add_(y), "mul_": lambda x, y: x.mul_(y), "sub_": lambda x, y: x.sub_(y, alpha=2),
    "copy_": lambda x, y: x.copy_(y), "div_": lambda x, y: x.div_(y),
    "clamp_": lambda x, y: x.clamp_(min=y.min().item() if y.numel() else 0),
    "masked_fill_": lambda x, y: x.masked_fill_(y > 0, 3.0),
    "where_": lambda x, y: x.copy_(torch.where(y > 0, x, y)),
    "lerp_": lambda x, y: x.lerp_(y, 0.5),
}
INPLACE_SCALAR = {
    "fill_": lambda x, s: x.fill_(s), "add_s_": lambda x, s: x.add_(s), "mul_s_": lambda x, s: x.mul_(s),
    "clamp_min_": lambda x, s: x.clamp_(min=s), "iadd": lambda x, s: x.__iadd__(s),
    "zero_": lambda x, s: x.zero_(), "setitem_col": lambda x, s: x.__setitem__((Ellipsis, 0), s),
    "setitem_all": lambda x, s: x.__setitem__(Ellipsis, s), "pow_": lambda x, s: x.abs_().pow_(s),
}
INPLACE_VIEW = {
    "t_": lambda x: x.t_(), "unsqueeze_": lambda x: x.unsqueeze_(0), "squeeze_": lambda x: x.squeeze_(),
    "transpose_": lambda x: x.transpose_(0, -1), "as_strided_": lambda x: x.as_strided_((1,), (1,)),
}


def _autograd_writable(t: torch.Tensor, expanding: bool) -> bool:
    """May the fuzzer write `t` in place in autograd mode?  Not leaves (eager forbids it), not
    through views ltc writes on the host (`expand`/`unfold`/`as_strided`, aliasing elements),
    which it refuses to record for autograd (a documented limit, see `ltc_async/tensor/inplace.py`)."""
    try:  # reading grad_fn raises for a multi-output view whose base was written
        return not t.requires_grad or (t.grad_fn is not None and not expanding
                                       and not (t._is_view() and aliasing(t)))
    except RuntimeError:
        return False


def _same_storage(x: torch.Tensor, y: torch.Tensor) -> bool:
    try:
        return x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    except RuntimeError:   # no storage to compare (a lazy tensor): treat as shared
        return True


@st.composite
def inplace_step(draw: Any, gen: Gen) -> Step | None:
    pool = [i for i in gen.tensors()
            if not gen.autograd or _autograd_writable(gen.env[i], i in gen.expanding)]
    if not pool:
        return None
    a = draw(st.sampled_from(pool))
    kind = draw(st.sampled_from(["tensor", "scalar", "view"]))
    if kind == "tensor":
        b = draw(st.sampled_from(gen.tensors()))
        if gen.autograd and b in gen.expanding and _same_storage(gen.env[a], gen.env[b]):
            # `v.add_(v[..., :1].expand(v.shape))`: eager reads the expanded argument while it
            # writes (its result depends on the kernel's element order; no overlap check sees
            # stride 0); a write autograd records keeps the functional semantics (documented,
            # `ltc_async/patches/inplace.py`)
            return None
        name = draw(st.sampled_from(sorted(INPLACE)))
        f = INPLACE[name]
        return Step(f"{{0}}.{name}({{1}})", lambda ctx, x, y: f(x, y), (a, b), out=False)
    if kind == "scalar":
        name = draw(st.sampled_from(sorted(INPLACE_SCALAR)))
        pair = _pair(draw)
        g = INPLACE_SCALAR[name]
        return Step(f"{{0}}.{name}({_fmt(pair)})", lambda ctx, x: g(x, ctx.const(pair)), (a,), out=False)
    if gen.autograd and gen.env[a].requires_grad:
        return None  # ltc rejects in-place view ops on tensors that require grad (see inplace.py)
    name = draw(st.sampled_from(sorted(INPLACE_VIEW)))
    f = INPLACE_VIEW[name]
    return Step(f"{{0}}.{name}()", lambda ctx, x: f(x), (a,), out=False)


def _index(ctx: Ctx, size: int, seed: int, n: int, unique: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(size, generator=g)[:n] if unique else torch.randint(0, size, (n,), generator=g)
    return idx if ctx.dev == "cpu" else idx.to(ctx.dev)


@st.composite
def indexing_step(draw: Any, gen: Gen) -> Step | None:
    pool = gen.tensors(lambda t: t.dim() > 0 and t.shape[0] > 0)
    if not pool:
        return None
    a = draw(st.sampled_from(pool))
    x = gen.env[a]
    seed = draw(st.integers(0, 2 ** 16))
    n = draw(st.integers(1, 4))
    size = x.shape[0]
    how = draw(st.sampled_from(["getitem", "getitem_host", "index_select", "gather", "scatter", "scatter_add",
                                "index_put", "index_put_acc", "index_add", "mask", "take_along",
                                "setitem_idx", "index_copy", "cat", "stack", "roundtrip"]))
    if how == "getitem":
        return Step(f"{{0}}[idx({size}, {seed}, {n})]", lambda ctx, x: x[_index(ctx, size, seed, n, False)], (a,))
    if how == "getitem_host":
        return Step(f"{{0}}[host idx({size}, {seed}, {n})]",
                    lambda ctx, x: x[_index(Ctx("cpu", False), size, seed, n, False)], (a,))
    if how == "index_select":
        return Step(f"{{0}}.index_select(0, idx({size}, {seed}, {n}))",
                    lambda ctx, x: x.index_select(0, _index(ctx, size, seed, n, False)), (a,))
    if how == "gather":
        return Step(f"{{0}}.gather(0, idx-like)",
                    lambda ctx, x: x.gather(0, _index(ctx, size, seed, x[:1].numel(), False)
                                            .view(x[:1].shape)), (a,))
    if how in ("scatter", "scatter_add"):
        def scatter(ctx: Ctx, x: torch.Tensor) -> torch.Tensor:
            idx = _index(ctx, size, seed, x[:1].numel(), how == "scatter").view(x[:1].shape) \
                if size >= x[:1].numel() or how == "scatter_add" else None
            if idx is None:
                raise ValueError("not enough distinct rows")
            src = torch.ones_like(x[:1])
            return x.scatter(0, idx, src) if how == "scatter" else x.scatter_add(0, idx, src)
        return Step(f"{{0}}.{how}(0, idx, ones)", scatter, (a,))
    if how in ("index_put", "index_put_acc"):
        acc = how == "index_put_acc"
        return Step(f"{{0}}.index_put((idx,), 2, accumulate={acc})",
                    lambda ctx, x: x.index_put((_index(ctx, size, seed, min(n, size), not acc),),
                                               torch.tensor(2, dtype=x.dtype).to(x.device), accumulate=acc), (a,))
    if how == "index_add":
        return Step("{0}.index_add(0, idx, ones)",
                    lambda ctx, x: x.index_add(0, _index(ctx, size, seed, n, False),
                                               torch.ones((n,) + x.shape[1:], dtype=x.dtype, device=x.device)), (a,))
    if how == "mask":
        return Step("{0}[{0} > 0]", lambda ctx, x: x[x > 0], (a,))
    if how == "take_along":
        return Step("take_along_dim({0}, argsort({0}), 0)",
                    lambda ctx, x: torch.take_along_dim(x, x.argsort(dim=0, stable=True), 0), (a,))
    if how == "setitem_idx":
        if gen.autograd and not _autograd_writable(x, a in gen.expanding):
            return None

        def setitem(ctx: Ctx, x: torch.Tensor) -> None:
            x[_index(ctx, size, seed, min(n, size), True)] = 5
        return Step("{0}[idx] = 5", setitem, (a,), out=False)
    if how == "index_copy":
        return Step("{0}.index_copy(0, idx, zeros)",
                    lambda ctx, x: x.index_copy(0, _index(ctx, size, seed, min(n, size), True),
                                                torch.zeros((min(n, size),) + x.shape[1:], dtype=x.dtype,
                                                            device=x.device)), (a,))
    if how in ("cat", "stack"):
        b = draw(st.sampled_from(pool))
        f = torch.cat if how == "cat" else torch.stack
        return Step(f"torch.{how}([{{0}}, {{1}}])", lambda ctx, x, y: f([x, y.to(x.dtype)]), (a, b))

    def roundtrip(ctx: Ctx, x: torch.Tensor) -> torch.Tensor:
        if ctx.other is None or ctx.dev == "cpu":
            return (x * 2).to(x.device)
        return (x.to(ctx.other) * 2).to(ctx.dev)
    return Step("({0}.to(other) * 2).to(dev)", roundtrip, (a,))


@st.composite
def observe_step(draw: Any, gen: Gen) -> Step | None:
    how = draw(st.sampled_from(["read", "item", "mark_step", "mark_step_wait", "sync", "wait"]))
    pool = gen.tensors()
    if how in ("read", "item", "sync") and not pool:
        return None
    if how == "read":
        a = draw(st.sampled_from(pool))

        def read(ctx: Ctx, x: torch.Tensor) -> None:
            ctx.observed.append((f"read step {len(ctx.observed)}", _host(x)))
        return Step("read({0})", read, (a,), out=False)
    if how == "item":
        a = draw(st.sampled_from(pool))

        def item(ctx: Ctx, x: torch.Tensor) -> None:
            v = x.sum().item() if x.dtype != torch.bool else bool(x.any())
            ctx.observed.append((f"item {len(ctx.observed)}", v))
        return Step("{0}.sum().item()", item, (a,), out=False)
    if how == "sync":
        chosen = tuple(sorted(set(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))))

        def sync(ctx: Ctx, *xs: torch.Tensor) -> None:
            if ctx.lazy:
                ltc.sync(list(xs))
        return Step("ltc.sync([" + ", ".join("{%d}" % k for k in range(len(chosen))) + "])", sync, chosen,
                    out=False)

    def step(ctx: Ctx) -> None:
        if ctx.lazy:
            if how == "wait":
                ltc.wait_device_ops()
            else:
                ltc.mark_step(wait=how == "mark_step_wait")
    return Step(f"ltc.{how}()", step, (), out=False)


# binary ops eager CUDA lets a CPU 0-dim tensor join as a scalar (declared `device_check:
# NoCheck`, TensorIterator kernels)
CPU_SCALAR_BINARY = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "div": torch.div,
                     "maximum": torch.maximum, "atan2": torch.atan2, "eq": torch.eq,
                     "where": lambda a, b: torch.where(a > 0, a, b), "rsub": lambda a, b: b - a}


@st.composite
def seam_step(draw: Any, gen: Gen) -> Step | None:
    """ltc meeting CPU tensors where eager CUDA accepts the mix: a host tensor written from a
    device one (`cpu.copy_(x)`, broadcast, another dtype, into a view), a device tensor written
    from a host one or a Python number, a CPU 0-dim tensor as a scalar.  Host results are only
    observed, never used again (any later mix with a device tensor would be refused)."""
    pool = gen.tensors()
    if not pool:
        return None
    a = draw(st.sampled_from(pool))
    how = draw(st.sampled_from(["to_host", "to_host_view", "from_host", "number_src", "cpu_scalar"]))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2 ** 16))
    if how == "to_host":
        lead = draw(st.integers(0, 1))   # a broadcast row in front, or none

        def to_host(ctx: Ctx, x: torch.Tensor) -> None:
            h = torch.zeros((2,) * lead + tuple(x.shape), dtype=dtype)
            h.copy_(x.detach(), non_blocking=draw_nb)
            ctx.observed.append((f"host copy {len(ctx.observed)}", h))
        draw_nb = draw(st.booleans())
        return Step(f"torch.zeros({'(2,) + ' if lead else ''}{{0}}.shape, dtype={dtype}).copy_({{0}}"
                    f"{', non_blocking=True' if draw_nb else ''})", to_host, (a,), out=False)
    if how == "to_host_view":
        def to_host_view(ctx: Ctx, x: torch.Tensor) -> None:
            h = torch.zeros(tuple(x.shape)[::-1] + (3,), dtype=dtype)
            h[..., 1].permute(*reversed(range(x.dim()))).copy_(x.detach())
            ctx.observed.append((f"host view copy {len(ctx.observed)}", h))
        return Step(f"torch.zeros(reversed {{0}}.shape + (3,), dtype={dtype})[..., 1].mT.copy_({{0}})",
                    to_host_view, (a,), out=False)
    if how == "from_host":
        def from_host(ctx: Ctx, x: torch.Tensor) -> torch.Tensor:
            y = x.detach().clone()
            y.copy_(_values(seed, tuple(x.shape), dtype, False))   # a host source, any dtype
            return y
        return Step(f"{{0}}.detach().clone().copy_(host values {dtype}, seed={seed})", from_host, (a,))
    if how == "number_src":
        # ints past int64: eager's copy_ takes them into 0-dim targets only (a corner of its own)
        pair = draw(st.sampled_from([p for p in SCALAR_PAIRS
                                     if all(-2 ** 63 <= v < 2 ** 63 for v in p if type(v) is int)]))

        def number_src(ctx: Ctx, x: torch.Tensor) -> torch.Tensor:
            y = x.detach().clone()
            y.view(-1).copy_(ctx.const(pair)) if y.is_contiguous() else y.copy_(ctx.const(pair))
            return y
        return Step(f"{{0}}.detach().clone().copy_({_fmt(pair)})", number_src, (a,))
    name = draw(st.sampled_from(sorted(CPU_SCALAR_BINARY)))
    op = CPU_SCALAR_BINARY[name]
    value = _values(seed, (), dtype, False)
    return Step(f"{name}({{0}}, torch.tensor({value.item()!r}, dtype={dtype}))",
                lambda ctx, x: op(x, value.clone()), (a,))


FAMILIES = [elementwise_step, elementwise_step, reduction_step, matmul_step, view_step, view_step,
            inplace_step, inplace_step, indexing_step, observe_step, observe_step, seam_step]


@st.composite
def programs(draw: Any, autograd: bool = False, max_ops: int = 24) -> Program:
    gen = Gen(autograd)
    for _ in range(draw(st.integers(1, 4))):
        gen.add(draw(input_step(gen)))
    for _ in range(draw(st.integers(4, max_ops))):
        family = draw(st.sampled_from(FAMILIES))
        step = draw(family(gen))
        if step is None or gen.add(step) != "error":
            continue
        if draw(st.integers(0, 9)) == 0:  # sometimes end on a step eager rejects
            gen.steps.append(step)
            break
    return Program(gen.steps, autograd)
