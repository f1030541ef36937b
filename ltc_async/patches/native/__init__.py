"""An optional native piece: the `ltc` device's PrivateUse1 hooks with a pinned host allocator,
and its device guard in C++.

Design note.  One thing a backend registered from Python cannot give PyTorch is pinned host
memory: `torch._C._acc.PrivateUse1Hooks` forwards only `is_available`, `has_primary_context` and
`is_built`, and PyTorch's DistributedDataParallel with `find_unused_parameters=True` or
`static_graph=True` allocates pinned memory for any PrivateUse1 device (its reducer's
used-parameter map), failing with "implement `getPinnedMemoryAllocator`".  `pinned_hooks.cpp`
(about 120 lines) implements the hooks in C++; PyTorch keeps the first hooks object registered
in a process, so `load()` must run before the Python registration (`patches/registration.py`
calls it first).  Building needs a C++ compiler and ninja, and takes ~40 s once per torch
version: `python -m ltc_async.patches.native` (run by `make setup`) builds into
`$LTC_ASYNC_NATIVE_DIR` (default `~/.cache/ltc_async/native/<torch version>-py<X.Y>`); import
only loads a build that is there (milliseconds), never compiles.  Without one, everything but
those two DDP options works as before.  `LTC_ASYNC_NATIVE=0` turns the loading off.

The device guard: PyTorch's Python-backed PrivateUse1 guard calls Python for the device type on
every guard operation, and the autograd engine makes several per backward node; the C++ guard
answers the same without Python (`pinned_hooks.cpp`, "The device guard"), and is registered
by `install` before the Python one is offered (PyTorch keeps the first).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import warnings

import torch

NAME = "ltc_async_pinned_hooks"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pinned_hooks.cpp")
loaded = False   # the C++ hooks are the process's PrivateUse1 hooks


def source_hash() -> str:
    """What a build was made from: a build of another version of `pinned_hooks.cpp` (an older
    ltc_async's, in the shared cache directory) is not loaded."""
    with open(SOURCE, "rb") as f:
        return "h" + hashlib.sha256(f.read()).hexdigest()[:16]   # an identifier: passed as -D


def build_dir() -> str:
    tag = f"{torch.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}"
    root = os.environ.get("LTC_ASYNC_NATIVE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "ltc_async", "native")
    return os.path.join(root, tag)


def _library() -> str:
    return os.path.join(build_dir(), NAME + ".so")


def load() -> bool:
    """Install the C++ hooks if they were built for this torch; False (and nothing done)
    otherwise.  Call before the Python hooks are registered."""
    global loaded
    if loaded:
        return True
    path = _library()
    if os.environ.get("LTC_ASYNC_NATIVE", "1") == "0" or not os.path.exists(path):
        return False
    try:
        spec = importlib.util.spec_from_file_location(NAME, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if getattr(module, "source_hash", None) != source_hash():
            warnings.warn("ltc_async: the native hooks in the cache were built from another version "
                          "of their source and are not loaded; rebuild them with "
                          "`python -m ltc_async.patches.native`", RuntimeWarning, stacklevel=2)
            return False
        module.install()
    except (ImportError, OSError, RuntimeError):   # a stale or foreign build: Python hooks only
        return False
    loaded = True
    return True


def build(verbose: bool = False) -> str:
    """Compile `pinned_hooks.cpp` for this torch (a C++ compiler and ninja needed)."""
    from torch.utils import (
        cpp_extension,  # deliberately lazy: only the build step needs it
    )
    os.makedirs(build_dir(), exist_ok=True)
    cpp_extension.load(name=NAME, sources=[SOURCE], build_directory=build_dir(), verbose=verbose,
                       extra_cflags=[f"-DLTC_SOURCE_HASH={source_hash()}"])
    return _library()
