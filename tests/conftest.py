"""Shared fixtures.  Tests run on the devices LTC_ASYNC_DEVICES configures (default here: two
virtual CPU devices, ltc:0 and ltc:1)."""
from __future__ import annotations

import os

# Two virtual CPU devices unless the caller chose: multi-device behaviour is tested in-process.
os.environ.setdefault("LTC_ASYNC_DEVICES", "cpu,cpu")

import pytest
import torch

import ltc_async as ltc


@pytest.fixture(autouse=True)
def _clean_state():
    """Each test starts with no pending device errors and no leftover queued work."""
    try:
        ltc.wait_device_ops()
    except Exception:  # noqa: BLE001 - a previous test's deliberate failure
        pass
    yield
    try:
        ltc.wait_device_ops()
    except Exception:  # noqa: BLE001
        pass


@pytest.fixture
def metrics():
    ltc.metrics.reset()
    return ltc.metrics


def assert_eager(lazy: torch.Tensor, eager: torch.Tensor, **kw) -> None:
    """Compare a lazy result with its eager reference: dtype, shape and values."""
    host = lazy.cpu()
    assert host.dtype == eager.dtype, (host.dtype, eager.dtype)
    assert host.shape == eager.shape, (host.shape, eager.shape)
    torch.testing.assert_close(host, eager, **kw)
