"""trio twins: the event loop keeps running while devices work; cancellation is prompt."""
from __future__ import annotations

import time

import pytest
import torch
import trio

import ltc_async as ltc
from conftest import backing_ref, heavy, heavy_steps


def _input(size: int = 768) -> torch.Tensor:
    return torch.randn(size, size, generator=torch.Generator().manual_seed(3)) / size ** 0.5


@pytest.mark.trio
async def test_heartbeat_keeps_ticking_during_wait():
    host = _input()
    x = host.to("ltc:0")
    n = heavy_steps(x, 0.1)                  # compiled, warm, >= 0.1 s of device work
    y = heavy(x, n)
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.005)
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat)
        t0 = time.perf_counter()
        await ltc.mark_step_async()
        await ltc.wait_device_ops_async()
        elapsed = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    # a blocked loop would give 0-1 ticks; a free one about elapsed / 5 ms
    assert ticks >= max(3, int(elapsed / 0.005 * 0.3)), (ticks, elapsed)
    (out,) = await ltc.to_cpu_async([y])
    torch.testing.assert_close(out, backing_ref(heavy, host, n), rtol=1e-4, atol=1e-5)


@pytest.mark.trio
async def test_cancellation_is_prompt_and_results_stay_valid():
    host = _input()
    x = host.to("ltc:0")
    n = heavy_steps(x, 0.1)
    y = heavy(x, n)
    await ltc.mark_step_async()
    t0 = time.perf_counter()
    with trio.move_on_after(0.01) as scope:
        await ltc.wait_device_ops_async()
    assert scope.cancelled_caught
    assert time.perf_counter() - t0 < 0.2
    with trio.move_on_after(0.001):
        await ltc.to_cpu_async([y])
    await ltc.sync_async([y])                # the execution went on; results are valid
    (out,) = await ltc.to_cpu_async([y])
    torch.testing.assert_close(out, backing_ref(heavy, host, n), rtol=1e-4, atol=1e-5)


@pytest.mark.kernel_assert
@pytest.mark.trio
async def test_async_errors_are_reraised():
    x = torch.arange(4.0).to("ltc:0")
    bad = x.index_select(0, torch.tensor([9]).to("ltc:0"))
    await ltc.mark_step_async()
    with pytest.raises(ltc.ExecutionError):
        await ltc.wait_device_ops_async()
    with pytest.raises(ltc.ComputationError):
        await ltc.to_cpu_async([bad])
    (ok,) = await ltc.to_cpu_async([x * 2])
    assert ok.tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.trio
async def test_tasks_on_two_devices():
    results = {}

    async def job(dev: str, k: int) -> None:
        h = torch.randn(64, 64, generator=torch.Generator().manual_seed(k))
        x = h.to(dev)
        for _ in range(5):
            x = torch.sin(x @ x.t() / 64)
            h = torch.sin(h @ h.t() / 64)
            await ltc.mark_step_async(dev)
        (results[k],) = await ltc.to_cpu_async([x])
        results[k] = (results[k], h)

    async with trio.open_nursery() as nursery:
        for k in range(6):
            nursery.start_soon(job, f"ltc:{k % 2}", k)
    for lazy, ref in results.values():
        torch.testing.assert_close(lazy, ref, rtol=1e-4, atol=1e-5)
