"""`torch.compile(model_or_fn, backend="ltc")` on lazy devices (see `backend.py`).

`register()` (called by `import ltc_async`) makes Dynamo fake-ify `ltc` tensors correctly
(`fakeify.py`) and registers the backend name "ltc" with Dynamo's backend registry.  Importing
Dynamo takes over a second, so when it is not imported yet the name is registered the moment
the registry module loads (an import hook), which every `torch.compile(...)` call does first.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["ltc_backend", "register"]

_REGISTRY = "torch._dynamo.backends.registry"


def ltc_backend(gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The "ltc" Dynamo backend (imports the compiler machinery on first use)."""
    from .backend import ltc_backend as impl
    return impl(gm, example_inputs, **kwargs)


def _register_with(registry: Any) -> None:
    if "ltc" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=ltc_backend, name="ltc")


class _RegistryHook(importlib.abc.MetaPathFinder):
    """Registers "ltc" right after Dynamo's backend registry module executes."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _REGISTRY:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_register(module: Any) -> None:
            exec_module(module)
            _remove_hook()
            _register_with(module)
        loader.exec_module = exec_and_register  # type: ignore[method-assign]
        return spec


_hook: _RegistryHook | None = None


def _remove_hook() -> None:
    global _hook
    if _hook is not None and _hook in sys.meta_path:
        sys.meta_path.remove(_hook)
    _hook = None


def register() -> None:
    """Install the fake-ification fix and register the "ltc" backend (idempotent)."""
    global _hook
    from . import fakeify
    fakeify.install()
    registry = sys.modules.get(_REGISTRY)
    if registry is not None:
        _register_with(registry)
    elif _hook is None:
        _hook = _RegistryHook()
        sys.meta_path.insert(0, _hook)
