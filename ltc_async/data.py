"""`DeviceLoader`: put the next batches on the lazy devices while the current step runs.

The role PyTorch/XLA's `ParallelLoader` / `MpDeviceLoader` play.  A background thread pulls
batches from any iterable, uploads them (all tensors in nested tuples/lists/dicts), and keeps
up to `prefetch` ready.  With several devices each batch is split along dim 0 into one shard
per device (what `DataParallel.step` expects).  Iterate it from threads (`for`) or from trio
(`async for`): the async side sleeps on the same futures the thread completes, woken through
the trio token, without parking a thread.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import weakref
from typing import Any, Iterable, Iterator

import torch

from .executor import arena
from .executor.futures import wait_async

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
    shard per device.  `prefetch` batches are uploaded ahead of the consumer.  An iterator
    stops its producer thread when exhausted, on `close()`, when leaving a `with` block, and
    when it is garbage collected (an abandoned loop leaks no thread).
    """

    def __init__(self, source: Iterable[Any], devices: Any = None, prefetch: int = 2) -> None:
        if prefetch < 1:
            raise ValueError("DeviceLoader: prefetch must be at least 1")
        self.source = source
        self.devices = [c.device for c in arena.resolve(devices if devices is not None else "ltc:0")]
        self.prefetch = prefetch
        self._iterators: weakref.WeakSet = weakref.WeakSet()

    def __iter__(self) -> "_LoaderIterator":
        it = _LoaderIterator(self)
        self._iterators.add(it)
        return it

    def __aiter__(self) -> "_LoaderIterator":
        return self.__iter__()

    def close(self) -> None:
        """Stop the producer threads of every iterator made so far."""
        for it in list(self._iterators):
            it.close()

    def __enter__(self) -> "DeviceLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Pipe:
    """What the producer thread and the consumer share.  The thread holds only this, never the
    iterator, so an abandoned iterator can be collected and close the pipe."""

    def __init__(self, prefetch: int) -> None:
        self.slots: dict[int, cf.Future] = {}
        self.lock = threading.Lock()
        self.space = threading.Semaphore(prefetch)
        self.closed = False

    def slot(self, i: int) -> cf.Future:
        with self.lock:
            f = self.slots.get(i)
            if f is None:
                f = self.slots[i] = cf.Future()
            return f

    def close(self) -> None:
        self.closed = True
        self.space.release()  # wake a producer waiting for room


def _produce(pipe: _Pipe, source: Iterable[Any], devices: list[torch.device]) -> None:
    i = 0
    try:
        it = iter(source)
        while True:
            pipe.space.acquire()  # before pulling: never more than `prefetch` ahead
            if pipe.closed:
                return
            try:
                batch = next(it)
            except StopIteration:
                break
            if len(devices) == 1:
                item = _move(batch, devices[0])
            else:
                item = [_move(_shard(batch, len(devices), k), d) for k, d in enumerate(devices)]
            pipe.slot(i).set_result(item)
            i += 1
        pipe.slot(i).set_result(_END)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer
        pipe.slot(i).set_exception(e)


class _LoaderIterator:
    def __init__(self, loader: DeviceLoader) -> None:
        self._pipe = _Pipe(loader.prefetch)
        self._next = 0
        self._finished = False
        self._thread = threading.Thread(target=_produce, name="ltc-device-loader", daemon=True,
                                         args=(self._pipe, loader.source, loader.devices))
        self._thread.start()

    def _take(self, f: cf.Future) -> Any:
        try:
            item = f.result()  # the producer's error, if any, is raised here
        except BaseException:
            self._finish()
            raise
        with self._pipe.lock:
            self._pipe.slots.pop(self._next, None)
        if item is _END:
            self._finish()
            raise StopIteration
        self._next += 1
        self._pipe.space.release()
        return item

    def _finish(self) -> None:
        self._finished = True
        self._pipe.close()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        return self._take(self._pipe.slot(self._next))

    def __aiter__(self) -> "_LoaderIterator":
        return self

    async def __anext__(self) -> Any:
        """Cancellation leaves the batch in place for the next `__anext__`."""
        if self._finished:
            raise StopAsyncIteration
        f = self._pipe.slot(self._next)
        await wait_async([f])
        try:
            return self._take(f)
        except StopIteration:
            raise StopAsyncIteration from None

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the producer thread (it finishes the batch it is uploading) and join it."""
        self._finish()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> "_LoaderIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "_LoaderIterator":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._finish()

    def __del__(self) -> None:
        pipe = getattr(self, "_pipe", None)
        if pipe is not None:
            pipe.close()
