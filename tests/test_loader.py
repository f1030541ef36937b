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


def test_exhausted_iterator_keeps_raising_stop_iteration():
    it = iter(DeviceLoader(_batches(2), "ltc:0"))
    assert len(list(it)) == 2
    for _ in range(3):                       # no hang on a second next() after the end
        with pytest.raises(StopIteration):
            next(it)


def _loader_threads() -> list:
    import threading
    return [t for t in threading.enumerate() if t.name == "ltc-device-loader" and t.is_alive()]


def _endless():
    i = 0
    while True:
        yield torch.full((2,), float(i))
        i += 1


def _wait_no_loader_threads(before: list, timeout: float = 10.0) -> None:
    """No producer thread is alive but those of `before` (an earlier test's may still be
    ending: counting them would fail when one ends during this test)."""
    import gc
    import time
    deadline = time.monotonic() + timeout

    def new() -> list:
        return [t for t in _loader_threads() if t not in before]
    while new() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert not new(), "a producer thread outlived its iterator"


def test_abandoned_iterator_does_not_leak_its_thread():
    before = _loader_threads()
    for _ in range(5):
        it = iter(DeviceLoader(_endless(), "ltc:0", prefetch=2))
        next(it)
        del it                               # abandoned mid-stream, producer blocked on room
    _wait_no_loader_threads(before)


def test_close_and_context_managers_stop_the_producer():
    before = _loader_threads()
    it = iter(DeviceLoader(_endless(), "ltc:0"))
    assert next(it).cpu().tolist() == [0.0, 0.0]
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    with DeviceLoader(_endless(), "ltc:0") as loader:
        for k, batch in enumerate(loader):
            if k == 3:
                assert batch.cpu().tolist() == [3.0, 3.0]
                break
    with iter(DeviceLoader(_endless(), "ltc:0")) as it2:
        next(it2)
    _wait_no_loader_threads(before)


@pytest.mark.trio
async def test_async_iteration_after_exhaustion_and_close():
    it = DeviceLoader(_batches(2), "ltc:0").__aiter__()
    got = [b async for b in it]
    assert len(got) == 2
    with pytest.raises(StopAsyncIteration):
        await it.__anext__()
    async with DeviceLoader(_endless(), "ltc:0").__aiter__() as endless:
        assert (await endless.__anext__())[0].item() == 0.0
