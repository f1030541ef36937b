"""Reference backend: interprets the IR by calling each aten op eagerly on the CPU.

No compiler, no TorchScript: the executor, cache, scheduler and error paths can be tested
against it in isolation, and its results define what a lowering must reproduce.
Select with `ltc.init(backend="reference")` or `LTC_ASYNC_BACKEND=reference`.
"""
from .backend import ReferenceBackend as Backend

__all__ = ["Backend"]
