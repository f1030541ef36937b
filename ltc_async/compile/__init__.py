"""`torch.compile(model_or_fn, backend="ltc")` on lazy devices (see `backend.py`).

`register()` (called by `import ltc_async`) makes Dynamo fake-ify `ltc` tensors correctly
(`fakeify.py`), registers the backend name "ltc" with Dynamo's backend registry, and tells
Dynamo never to trace into ltc_async itself: `ltc.mark_step()` (or any other API call) inside
a compiled function is a graph break and runs as it is, not a half-traced walk through the
executor's locks and threads.  Importing Dynamo takes over a second, so when it is not
imported yet, both happen the moment Dynamo's modules load (an import hook): every
`torch.compile(...)` call loads them first.

`torch.compile(model)` with its default backend, Inductor, on a graph of `ltc` tensors runs it
through the "ltc" backend (`_route_inductor`): Inductor has no code generation for the `ltc`
device (a `KeyError: 'ltc'` deep in its lowering), while "ltc" runs the graph on the device
and builds it with Inductor in the background once hot (tiered compilation), so a program
that only changed its device string compiles as before.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ltc_backend", "register"]

_REGISTRY = "torch._dynamo.backends.registry"
_TRACE_RULES = "torch._dynamo.trace_rules"
_SKIPPED = ("ltc_async", "ltc_async_devices")


def ltc_backend(gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The "ltc" Dynamo backend (imports the compiler machinery on first use)."""
    # lazy: AOTAutograd and the capture machinery load on the first compile
    from .backend import ltc_backend as impl
    return impl(gm, example_inputs, **kwargs)


def _on_ltc(gm: Any, example_inputs: Sequence[Any]) -> bool:
    if any(isinstance(t, torch.Tensor) and t.device.type == "ltc" for t in example_inputs):
        return True
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):   # a factory with device="ltc"
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor) and val.device.type == "ltc":
            return True
    return False


def _route_inductor() -> None:
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__
    if getattr(original, "_ltc_routed", False):
        return

    def __call__(self: Any, model_: Any, inputs_: Sequence[Any]) -> Any:
        if _on_ltc(model_, inputs_):
            return ltc_backend(model_, inputs_)
        return original(self, model_, inputs_)
    __call__._ltc_routed = True  # type: ignore[attr-defined]
    wrapper.__call__ = __call__


def _register_with(registry: Any) -> None:
    if "ltc" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=ltc_backend, name="ltc")


def _skip_in(trace_rules: Any) -> None:
    for package in _SKIPPED:
        trace_rules.add(package)


_AFTER = {_REGISTRY: _register_with, _TRACE_RULES: _skip_in}


class _DynamoHook(importlib.abc.MetaPathFinder):
    """Runs `_AFTER[name](module)` right after Dynamo's module `name` finishes executing."""

    def __init__(self, pending: set[str]) -> None:
        self.pending = pending

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.pending:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_hook(module: Any) -> None:
            exec_module(module)
            self.pending.discard(name)
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)
            _AFTER[name](module)
        loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec


_hook: _DynamoHook | None = None


def register() -> None:
    """Install the fake-ification fix, register the "ltc" backend and skip ltc_async in
    Dynamo's tracing, now or when Dynamo loads (idempotent)."""
    global _hook
    # lazy: torch's fake-tensor machinery (part of Dynamo's load)
    from . import fakeify
    fakeify.install()
    _route_inductor()
    if _hook is not None:
        return
    pending = set()
    for name, then in _AFTER.items():
        if name in sys.modules:
            then(sys.modules[name])
        else:
            pending.add(name)
    if pending:
        _hook = _DynamoHook(pending)
        sys.meta_path.insert(0, _hook)
