"""Regressions: the tensor/IR/lowering layer never silently computes the wrong thing.

Each test pins one bug found by review or by the differential fuzzer (`tests/test_fuzz.py`) and
compares with eager PyTorch.  Cache keys are the recurring theme: two ops that differ only in a
constant Python calls equal (`1 == 1.0 == True`, `0.0 == -0.0`, NaN) must not share a shape
inference result, a compiled graph or a cached upload.
"""
from __future__ import annotations

import math

import pytest
import torch

import ltc_async as ltc

DEV = "ltc:0"
NAN = float("nan")


def same(lazy: torch.Tensor, eager: torch.Tensor) -> None:
    host = lazy.cpu()
    assert host.dtype == eager.dtype, (host.dtype, eager.dtype)
    assert host.shape == eager.shape, (host.shape, eager.shape)
    torch.testing.assert_close(host, eager, equal_nan=True, rtol=0, atol=0)
    # signs of zeros and NaNs too
    assert torch.equal(torch.signbit(host), torch.signbit(eager)), (host, eager)


def both(fn):
    """Run `fn(device)` eagerly and lazily (twice, with a step between: the second run hits
    every cache the first filled); compare each lazy result with eager."""
    expected = fn("cpu")
    for _ in range(2):
        same(fn(DEV), expected)
        ltc.mark_step()


# -- 1. constants that Python calls equal ------------------------------------------------------

@pytest.mark.parametrize("first,second", [(4, 4.0), (4.0, 4), (True, 1), (1, True), (1.0, True)])
def test_factory_scalar_type_decides_dtype(first, second):
    # `arange(4)` traced first must not make `arange(4.0)` int64 (and vice versa)
    for v in (first, second):
        both(lambda d: torch.arange(v, device=d))
        both(lambda d: torch.full((2,), v, device=d))


@pytest.mark.parametrize("order", [(0.0, -0.0), (-0.0, 0.0)])
def test_signed_zero_constants(order):
    for v in order:
        both(lambda d: 1 / torch.full((2,), v, device=d))
        both(lambda d: torch.nan_to_num(torch.tensor([NAN, 1.0], device=d), nan=v))
        both(lambda d: torch.tensor([1.0, 2.0], device=d) * v)          # runtime scalar
        both(lambda d: torch.tensor([1.0, -2.0], device=d).clamp(min=v))


@pytest.mark.parametrize("order", [(0, 0.0), (0.0, 0), (False, 0)])
def test_scalar_optional_type_decides_dtype(order):
    t = torch.tensor([1, -2, 3])
    for v in order:
        both(lambda d: t.to(d).clamp(min=v))


def test_nan_constants_match_and_reuse_the_compiled_graph():
    x = torch.tensor([1.0, NAN, -0.0])
    for v in (NAN, -NAN, NAN):
        both(lambda d: torch.copysign(torch.full((3,), v, device=d), x.to(d)))
        both(lambda d: torch.copysign(torch.ones(3, device=d), torch.full((3,), v, device=d)))
    # a NaN constant is equal to itself as a key: the same program does not recompile
    ltc.metrics.reset()
    for _ in range(3):
        y = torch.full((3,), float("nan"), device=DEV) + 1
        ltc.mark_step()
    assert ltc.metrics.counter_value("UncachedCompile") <= 1
    assert torch.isnan(y.cpu()).all()


def test_zero_dim_upload_cache_keeps_nan_sign_and_zero_sign():
    x = torch.tensor([1.0, 2.0])
    for v in (NAN, -NAN, 0.0, -0.0, 1, True):
        both(lambda d: torch.copysign(x.to(d), torch.tensor(v).to(d)))


def test_ir_dump_shows_constant_values():
    t = torch.tensor([1.0, 2.0], device=DEV).clamp(min=-0.0)
    assert "-0.0" in ltc.debug.dump_ir([t])
