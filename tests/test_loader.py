"""DeviceLoader: prefetching batches onto lazy devices, from threads and from trio."""
from __future__ import annotations

import pytest
import torch
import trio

import ltc_async as ltc
from ltc_async.data import DeviceLoader


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=g), torch.arange(4) + i) for i in range(n)]


def test_single_device_yields_device_batches_in_order():
    src = _batches(5)
    got = list(DeviceLoader(src, "ltc:0", prefetch=2))
    assert len(got) == 5
    for (x, y), (hx, hy) in zip(got, src):
        assert x.device == torch.device("ltc:0") and y.device == torch.device("ltc:0")
        torch.testing.assert_close(x.cpu(), hx)
        torch.testing.assert_close(y.cpu(), hy)


def test_several_devices_get_one_shard_each():
    src = _batches(3)
    for shards, (hx, hy) in zip(DeviceLoader(src, ["ltc:0", "ltc:1"]), src):
        assert [s[0].device for s in shards] == [torch.device("ltc:0"), torch.device("ltc:1")]
        torch.testing.assert_close(torch.cat([s[0].cpu() for s in shards]), hx)
        torch.testing.assert_close(torch.cat([s[1].cpu() for s in shards]), hy)


def test_source_errors_reach_the_consumer():
    def bad():
        yield torch.ones(2)
        raise OSError("disk on fire")
    it = iter(DeviceLoader(bad(), "ltc:0"))
    assert next(it).cpu().tolist() == [1.0, 1.0]
    with pytest.raises(OSError, match="disk on fire"):
        next(it)


def test_prefetch_runs_ahead_of_the_consumer():
    pulled = []

    def source():
        for i in range(10):
            pulled.append(i)
            yield torch.full((2,), float(i))
    it = iter(DeviceLoader(source(), "ltc:0", prefetch=3))
    first = next(it)
    import time
    deadline = time.monotonic() + 10
    while len(pulled) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(pulled) == 4          # the one consumed plus three prefetched, and no more
    assert first.cpu().tolist() == [0.0, 0.0]
    assert [b.cpu()[0].item() for b in it] == [float(i) for i in range(1, 10)]


@pytest.mark.trio
async def test_async_iteration_with_a_busy_loop():
    src = _batches(6)
    seen = []
    async for x, y in DeviceLoader(src, "ltc:0"):
        (hx,) = await ltc.to_cpu_async([x * 2])
        seen.append(hx)
    assert len(seen) == 6
    for got, (hx, _) in zip(seen, src):
        torch.testing.assert_close(got, hx * 2)
    with trio.move_on_after(5):
        pass
