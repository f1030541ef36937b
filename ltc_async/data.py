"""`DeviceLoader`: put the next batches on the lazy devices while the current step runs.

The role PyTorch/XLA's `ParallelLoader` / `MpDeviceLoader` play.  A background thread pulls
batches from any iterable, uploads them (all tensors in nested tuples/lists/dicts), and keeps
up to `prefetch` ready.  With several devices each batch is split along dim 0 into one shard
per device (what `DataParallel.step` expects).  Iterate it from threads (`for`) or from trio
(`async for`): the async side sleeps on the same futures the thread completes, woken through
the trio token, without parking a thread.
"""
from __future__ import annotations

import threading
from typing import Any, Iterable, Iterator

import torch

from .executor import arena
from .executor.futures import Future

__all__ = ["DeviceLoader"]

_END = object()


def _move(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _move(v, device) for k, v in batch.items()}
    return batch


def _shard(batch: Any, n: int, i: int) -> Any:
    if isinstance(batch, torch.Tensor):
        if batch.shape[0] % n:
            raise ValueError(f"DeviceLoader: batch dimension {batch.shape[0]} does not split evenly "
                             f"over {n} devices")
        return batch.chunk(n)[i]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_shard(b, n, i) for b in batch)
    if isinstance(batch, dict):
        return {k: _shard(v, n, i) for k, v in batch.items()}
    return batch


class DeviceLoader:
    """Wrap an iterable of host batches; iterate to get them on lazy devices, prefetched.

    One device: yields the batch on that device.  Several devices: yields a list with one
    shard per device.  `prefetch` batches are uploaded ahead of the consumer.
    """

    def __init__(self, source: Iterable[Any], devices: Any = None, prefetch: int = 2) -> None:
        if prefetch < 1:
            raise ValueError("DeviceLoader: prefetch must be at least 1")
        self.source = source
        self.devices = [c.device for c in arena.resolve(devices if devices is not None else "ltc:0")]
        self.prefetch = prefetch

    def __iter__(self) -> "_LoaderIterator":
        return _LoaderIterator(self)

    def __aiter__(self) -> "_LoaderIterator":
        return _LoaderIterator(self)


class _LoaderIterator:
    def __init__(self, loader: DeviceLoader) -> None:
        self._loader = loader
        self._slots: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._space = threading.Semaphore(loader.prefetch)
        self._next = 0
        self._closed = False
        self._thread = threading.Thread(target=self._produce, name="ltc-device-loader", daemon=True)
        self._thread.start()

    def _slot(self, i: int) -> Future:
        with self._lock:
            f = self._slots.get(i)
            if f is None:
                f = self._slots[i] = Future(f"DeviceLoader batch {i}")
            return f

    def _produce(self) -> None:
        devices = self._loader.devices
        i = 0
        try:
            source = iter(self._loader.source)
            while True:
                self._space.acquire()  # before pulling: never more than `prefetch` ahead
                if self._closed:
                    return
                try:
                    batch = next(source)
                except StopIteration:
                    break
                if len(devices) == 1:
                    item = _move(batch, devices[0])
                else:
                    item = [_move(_shard(batch, len(devices), k), d) for k, d in enumerate(devices)]
                self._slot(i).set_result(item)
                i += 1
            self._slot(i).set_result(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._slot(i).set_error(e)

    def _take(self, f: Future) -> Any:
        item = f.result()  # first wait: the producer may still have to find this slot
        with self._lock:
            self._slots.pop(self._next, None)
        self._next += 1
        if item is _END:
            raise StopIteration
        self._space.release()
        return item

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self._take(self._slot(self._next))

    def __aiter__(self) -> "_LoaderIterator":
        return self

    async def __anext__(self) -> Any:
        """Cancellation leaves the batch in place for the next `__anext__`."""
        from .aio import wait_future
        f = self._slot(self._next)
        await wait_future(f)
        try:
            return self._take(f)
        except StopIteration:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._closed = True
        self._space.release()
