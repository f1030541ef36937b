"""Shared fixtures.  Tests run on the devices LTC_ASYNC_DEVICES configures (default here: two
virtual CPU devices, ltc:0 and ltc:1)."""
from __future__ import annotations

import contextlib
import os
import sys
import time

# Two virtual CPU devices unless the caller chose: multi-device behaviour is tested in-process.
os.environ.setdefault("LTC_ASYNC_DEVICES", "cpu,cpu")
# The suite checks quick-tier (TorchScript) semantics with tiering off, unless the caller chose:
# background Inductor builds of every hot graph would compete for the CI machine's two cores
# and make results depend on build timing.  `tests/test_tiers.py` turns tiering on (per test).
os.environ.setdefault("LTC_ASYNC_TIERS", "ts")

import pytest
import torch

import ltc_async as ltc
from ltc_async.executor import arena


def build_inline(job, future):
    """A stand-in for the tier-up thread's `worker.submit`: the build runs at once, on the
    execution that made the graph hot, so the next steps of a short test run on Inductor (in a
    program, builds run in the background and nothing waits for them)."""
    try:
        future.set_result(job())
    except BaseException as e:  # noqa: BLE001 - handed to the future, as the worker does
        future.set_exception(e)
    return future


if os.environ.get("LTC_ASYNC_TEST_TIER_UP_INLINE") == "1":
    # `make test` runs the model tests again with tiering on (LTC_ASYNC_TIERS=ts,inductor, a
    # low LTC_ASYNC_TIER_UP_AFTER) and builds made inline
    from ltc_async.executor import tiers as _tiers
    _tiers.worker.submit = build_inline


# On CUDA-backed devices (LTC_ASYNC_DEVICES=cuda:0,... on a GPU machine) an index out of range
# found by a kernel is a device-side assert, which leaves the process's CUDA context unusable,
# as in eager CUDA (README, "Known limitations"): every later test of the process would fail.
# Tests that make a kernel fail on purpose carry the `kernel_assert` marker and run on
# CPU-backed devices only; a test that poisons the context without the marker ends its
# worker process (pytest-xdist starts a fresh one), so one such test fails, not the rest.
ON_CUDA = any(d.strip().startswith("cuda") for d in os.environ["LTC_ASYNC_DEVICES"].split(","))
_KERNEL_ASSERT = ("makes a kernel fail on purpose (an index out of range): on a CUDA-backed device that "
                  "is a device-side assert, which leaves the process's CUDA context unusable, as in eager "
                  "CUDA; it runs on CPU-backed devices")


def pytest_configure(config):
    config.addinivalue_line("markers", "kernel_assert: " + _KERNEL_ASSERT)
    if ON_CUDA:   # float32 convolutions in float32, as on the CPU references (cuDNN's default is TF32)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False


def pytest_collection_modifyitems(config, items):
    if ON_CUDA:
        for item in items:
            if item.get_closest_marker("kernel_assert"):
                item.add_marker(pytest.mark.skip(reason=_KERNEL_ASSERT))


def _cuda_context_lost() -> str | None:
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        if "device-side assert" in str(e) or "launch failure" in str(e):
            return str(e).splitlines()[0]
    return None


@pytest.fixture(autouse=True)
def _clean_state(request):
    """Each test starts with no pending device errors and no leftover queued work, and as a
    program of its own: whether a backward starts by cutting the forward follows the test's own
    host reads, not the previous test's (`graph_executor.before_backward`)."""
    try:
        ltc.wait_device_ops()
    except Exception:  # noqa: BLE001 - a previous test's deliberate failure
        pass
    for ctx in arena.started():
        ctx.read_since_backward, ctx.backward_seq = False, None
    yield
    try:
        ltc.wait_device_ops()
    except Exception:  # noqa: BLE001
        pass
    if ON_CUDA and (lost := _cuda_context_lost()):
        msg = f"{request.node.nodeid} left the CUDA context unusable ({lost}); this process ends"
        print(msg, flush=True)
        if os.environ.get("PYTEST_XDIST_WORKER"):
            os._exit(3)                      # xdist replaces the worker
        pytest.exit(msg, returncode=3)


@pytest.fixture
def metrics():
    ltc.metrics.reset()
    return ltc.metrics


def eager_device(dev: str = "ltc:0") -> torch.device:
    """The device whose eager kernels `dev` promises to behave like: its backing device (cuda:0
    behind ltc:0 on a GPU machine, else the CPU).  Errors and kernels differ between CPU and
    CUDA (`"bitwise_not_cuda" not implemented`, an integer matmul CUDA refuses)."""
    return ltc.backend_device(dev)


def backing_ref(fn, *args):
    """`fn(*args)` computed eagerly on ltc:0's backing device, as CPU tensors: the reference for
    long chains where CPU and CUDA kernels' last-bit differences grow (sin/cos iterated 500 times)."""
    dev = eager_device()
    out = fn(*[a.to(dev) if isinstance(a, torch.Tensor) else a for a in args])
    return torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)


def assert_same_outcome(make, dev: str = "ltc:0", values: bool = True):
    """`make(device)` on `dev` does what it does eagerly on `dev`'s backing device: raises the
    same exception type with the same first message line (returned), or returns the same values
    (dtypes and shapes only where `values` is false: samplers)."""
    try:
        expected = make(eager_device(dev))
    except Exception as e:  # noqa: BLE001 - the outcome under test
        with pytest.raises(type(e)) as lazy:
            make(dev)
        assert str(lazy.value).splitlines()[0] == str(e).splitlines()[0]
        return e
    got, want = torch.utils._pytree.tree_leaves(make(dev)), torch.utils._pytree.tree_leaves(expected)
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        if values:
            torch.testing.assert_close(g.cpu(), w.cpu())
    return None


def assert_eager(lazy: torch.Tensor, eager: torch.Tensor, **kw) -> None:
    """Compare a lazy result with its eager reference: dtype, shape and values."""
    host = lazy.cpu()
    assert host.dtype == eager.dtype, (host.dtype, eager.dtype)
    assert host.shape == eager.shape, (host.shape, eager.shape)
    torch.testing.assert_close(host, eager, **kw)


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> str:
    """Run `code` in a fresh interpreter (device configuration is per process); return stdout."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout


def run_in_threads(fn, arg_lists: list[tuple], timeout: float,
                   switch_interval: float | None = None) -> None:
    """Run `fn(*args)` on one thread per entry; fail on a hang (deadlock) or on any exception.
    `switch_interval`: Python's thread switch interval meanwhile (a short one makes the threads
    interleave within a few milliseconds of work), restored after."""
    import threading
    errors: list[BaseException] = []

    def guarded(*args) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=guarded, args=a, daemon=True) for a in arg_lists]
    interval = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=timeout)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "deadlock: threads still running"
    assert not errors, errors


@contextlib.contextmanager
def busy_python_thread():
    """A thread running pure Python meanwhile (a training loop tracing its next step): it gives
    the GIL up only when another thread has waited for it a switch interval."""
    import threading
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.02)
        yield
    finally:
        stop.set()
        spinner.join()


def heavy(x: torch.Tensor, n: int) -> torch.Tensor:
    """A compute-bound chain of n matmuls (lazy or eager, whatever `x` is)."""
    for _ in range(n):
        x = torch.tanh(x @ x)
    return x


_calibrated: dict[tuple, int] = {}


def heavy_steps(x: torch.Tensor, seconds: float, limit: int = 200) -> int:
    """How many `heavy` steps on `x`'s lazy device take at least `seconds` to execute here
    (compiled and warmed up), so timing tests hold on slow and fast machines alike."""
    key = (tuple(x.shape), str(x.device), seconds)
    n = _calibrated.get(key)
    if n is not None:
        return n
    if ON_CUDA:
        limit *= 20        # a GPU runs a step of small matmuls in microseconds
    n = 8
    while True:
        warm = heavy(x, n)
        ltc.sync([warm])                      # compile + TorchScript profiling runs
        probe = heavy(x, n)
        t0 = time.perf_counter()
        ltc.sync([probe])
        took = time.perf_counter() - t0
        if took >= seconds or n >= limit:
            break
        n = min(limit, int(n * 1.25 * seconds / max(took, 1e-3)) + 1)
    _calibrated[key] = n
    return n


@contextlib.contextmanager
def watchdog(seconds: float):
    """Fail loudly instead of hanging: if the block is still running after `seconds`, every
    thread's stack is dumped to stderr and the process exits (so CI shows where it hung)."""
    import faulthandler
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def heavy_prelude(seconds: float) -> str:
    """Source for a subprocess: `x` on ltc:0 and `heavy(x, n)` with `n` sized so that one
    step takes at least `seconds` of device work here (compiled and warm)."""
    return f"""
import time, torch, ltc_async as ltc
torch.manual_seed(0)
x = (torch.randn(384, 384) / 20).to("ltc:0")
def heavy(x, n):
    for _ in range(n):
        x = torch.tanh(x @ x)
    return x
n = 4
while True:
    ltc.sync([heavy(x, n)]); t0 = time.perf_counter(); ltc.sync([heavy(x, n)])
    if time.perf_counter() - t0 > {seconds} or n > (8000 if ltc.backend_device("ltc:0").type == "cuda" else 400): break
    n *= 2
"""
