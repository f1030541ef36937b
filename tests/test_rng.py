"""Random ops on a lazy device (API.md, "Tensors"): a per-device generator seeded by
`torch.manual_seed`; same seed + same program -> identical values, different seed -> different
values, every step draws fresh numbers, and a drawn value never changes however often it is read.
The values need not equal the host generator's, so only distributions are compared with eager.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.torch_version import TorchVersion

from conftest import assert_same_outcome

import ltc_async as ltc

DEV = "ltc:0"
N = 100_000


def _program(seed: int, steps: int = 3):
    """Seed, then draw a few tensors of various kinds across `steps` steps; return host copies."""
    torch.manual_seed(seed)
    out = []
    for _ in range(steps):
        a = torch.randn(64, device=DEV)
        b = torch.rand(4, 8, device=DEV)
        c = torch.randint(0, 100, (16,), device=DEV)
        d = F.dropout(torch.ones(32, device=DEV), p=0.5, training=True)
        out.append((a * 1, b + 0, c, d))
        ltc.mark_step()
    return [tuple(t.cpu() for t in group) for group in out]


def _assert_all_equal(x, y):
    for gx, gy in zip(x, y):
        for tx, ty in zip(gx, gy):
            assert tx.dtype == ty.dtype and tx.shape == ty.shape
            torch.testing.assert_close(tx, ty, rtol=0, atol=0)


# -- reproducibility ----------------------------------------------------------------------------

def test_same_seed_same_program_identical():
    first = _program(1234)
    second = _program(1234)
    _assert_all_equal(first, second)


def test_different_seed_different_values():
    a = _program(1)
    b = _program(2)
    for ga, gb in zip(a, b):
        assert not torch.equal(ga[0], gb[0])
        assert not torch.equal(ga[1], gb[1])
        assert not torch.equal(ga[2], gb[2])


def test_reseeding_mid_program_repeats_draws():
    torch.manual_seed(7)
    x1 = torch.randn(50, device=DEV)
    ltc.mark_step()
    torch.manual_seed(7)
    x2 = torch.randn(50, device=DEV)
    torch.testing.assert_close(x1.cpu(), x2.cpu(), rtol=0, atol=0)


def test_reproducible_with_reads_in_between():
    """The same program with the same reads in it gives the same numbers."""
    def prog():
        torch.manual_seed(99)
        a = torch.randn(10, device=DEV)
        first = a.sum().item()
        b = torch.randn(10, device=DEV) + first
        ltc.mark_step()
        c = torch.rand(10, device=DEV)
        return a.cpu(), b.cpu(), c.cpu()
    r1, r2 = prog(), prog()
    for x, y in zip(r1, r2):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_explicit_cpu_generator_reproducible():
    g1 = torch.Generator().manual_seed(5)
    g2 = torch.Generator().manual_seed(5)
    a = torch.randn(20, device=DEV, generator=g1)
    b = torch.randn(20, device=DEV, generator=g2)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    c = torch.randn(20, device=DEV, generator=g1)  # the generator advanced
    assert not torch.equal(a.cpu(), c.cpu())


_REFUSED_SAMPLES = {
    "rand_int": lambda d: torch.rand(3, dtype=torch.int64, device=d),
    "randn_int": lambda d: torch.randn(3, dtype=torch.int64, device=d),
    "normal_int": lambda d: torch.zeros(3, dtype=torch.int64, device=d).normal_(),
    "uniform_int": lambda d: torch.zeros(3, dtype=torch.int64, device=d).uniform_(),
    "bernoulli_int": lambda d: torch.bernoulli(torch.ones(3, dtype=torch.int64, device=d)),
    "poisson_int": lambda d: torch.poisson(torch.ones(3, dtype=torch.int64, device=d)),
    "multinomial_int": lambda d: torch.multinomial(torch.ones(3, dtype=torch.int64, device=d), 1),
    "multinomial_none": lambda d: torch.multinomial(torch.ones(3, device=d), 0),
    "randperm_bool": lambda d: torch.randperm(3, dtype=torch.bool, device=d),
    "random_empty_range": lambda d: torch.zeros(3, device=d).random_(5, 5),
}


@pytest.mark.parametrize("case", list(_REFUSED_SAMPLES))
def test_samplers_refuse_at_the_line_like_eager(case):
    """Meta kernels accept these; the device refused them at the next barrier, as a
    ComputationError.  Eager's exception, type and message, now comes at the line, and the
    user's random streams do not move for the check."""
    state = torch.get_rng_state()
    error = assert_same_outcome(_REFUSED_SAMPLES[case], values=False)   # as on the backing device
    assert error is not None or ltc.backend_device(DEV).type != "cpu"    # eager CPU refuses them all
    if ltc.backend_device(DEV).type == "cpu":
        assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(torch.ones(2, device=DEV).cpu() * 2, torch.full((2,), 2.0))


@pytest.mark.parametrize("fill", ["exponential_", "geometric_", "cauchy_", "log_normal_", "uniform_", "normal_"])
def test_every_in_place_sampler_takes_a_generator(fill):
    """`t.exponential_(generator=g)` and kin raised PyTorch's "generator is not supported in
    refs" from the in-place meta check; eager takes a generator in all of them."""
    args = (0.5,) if fill == "geometric_" else ()

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return getattr(torch.empty(50, device=DEV), fill)(*args, generator=g).cpu()
    a, b, c = draw(3), draw(3), draw(4)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    assert torch.isfinite(a).all() and a.shape == (50,)


@pytest.mark.skipif(not __import__("ltc_async.patches.native", fromlist=["x"]).loaded,
                    reason="torch.Generator(device='ltc:N') needs the optional native hooks (make setup builds them)")
def test_a_generator_on_the_device_as_sampling_code_makes_one():
    """`torch.Generator(device=x.device).manual_seed(s)` (diffusers' pipelines, samplers): a
    generator on `ltc:0`; seeding it again repeats the draws, its state saves and restores them,
    and each draw advances it."""
    x = torch.zeros(3, device=DEV)
    g = torch.Generator(device=x.device).manual_seed(7)
    assert g.device == torch.device(DEV) and g.initial_seed() == 7
    a = torch.randn(20, device=DEV, generator=g)
    noise = torch.rand(8, device=DEV, generator=g)
    g.manual_seed(7)
    torch.testing.assert_close(torch.randn(20, device=DEV, generator=g).cpu(), a.cpu(), rtol=0, atol=0)
    state = g.get_state()
    c = torch.randint(0, 1000, (10,), device=DEV, generator=g)
    g.set_state(state)
    assert torch.equal(torch.randint(0, 1000, (10,), device=DEV, generator=g).cpu(), c.cpu())
    assert not torch.equal(torch.randint(0, 1000, (10,), device=DEV, generator=g).cpu(), c.cpu())
    assert ((noise.cpu() >= 0) & (noise.cpu() < 1)).all()
    assert torch.Generator(device="ltc:1").device == torch.device("ltc:1")


# -- freshness ----------------------------------------------------------------------------------

def test_consecutive_steps_draw_fresh_numbers():
    torch.manual_seed(0)
    a = torch.randn(1000, device=DEV)
    ltc.mark_step()
    b = torch.randn(1000, device=DEV)
    ltc.mark_step()
    a_h, b_h = a.cpu(), b.cpu()
    assert not torch.equal(a_h, b_h)
    # not even correlated / shifted copies
    assert abs(torch.corrcoef(torch.stack([a_h, b_h]))[0, 1].item()) < 0.2


def test_same_program_in_a_loop_draws_fresh_numbers_each_step():
    """A cached graph replayed every step must get a new seed each time."""
    torch.manual_seed(0)
    seen = []
    for _ in range(4):
        x = torch.rand(8, device=DEV) * 2
        ltc.mark_step()
        seen.append(x.cpu())
    for i in range(len(seen)):
        for j in range(i + 1, len(seen)):
            assert not torch.equal(seen[i], seen[j]), (i, j)


def test_two_draws_in_one_step_differ():
    torch.manual_seed(0)
    a = torch.randn(100, device=DEV)
    b = torch.randn(100, device=DEV)
    assert not torch.equal(a.cpu(), b.cpu())
    u = torch.rand(3, 100, device=DEV)
    uh = u.cpu()
    assert not torch.equal(uh[0], uh[1])


def test_in_place_random_fills_fresh():
    torch.manual_seed(3)
    x = torch.empty(200, device=DEV)
    x.normal_()
    first = x.cpu()
    x.normal_()
    second = x.cpu()
    assert not torch.equal(first, second)


# -- a drawn value never changes ----------------------------------------------------------------

def test_value_stable_across_reads_and_mark_step():
    torch.manual_seed(0)
    r = torch.randn(64, device=DEV)
    v1 = r.cpu()
    v2 = r.cpu()
    ltc.mark_step()
    v3 = r.cpu()
    ltc.mark_step(wait=True)
    v4 = r.cpu()
    for v in (v2, v3, v4):
        torch.testing.assert_close(v, v1, rtol=0, atol=0)


def test_value_stable_when_not_read_before_mark_step():
    torch.manual_seed(0)
    r = torch.rand(64, device=DEV)
    ltc.mark_step()
    v1 = r.cpu()
    ltc.mark_step()
    torch.testing.assert_close(r.cpu(), v1, rtol=0, atol=0)


def test_value_consistent_across_separately_synced_consumers():
    """A random tensor used by two graphs synced separately must be the same value in both."""
    torch.manual_seed(0)
    r = torch.randn(256, device=DEV)
    p = r + 1
    q = r * 2
    p_h = p.cpu()            # first graph: r + 1
    q_h = q.cpu()            # second graph: r * 2 (r must not be re-drawn)
    r_h = r.cpu()
    torch.testing.assert_close(p_h, r_h + 1)
    torch.testing.assert_close(q_h, r_h * 2)
    s = r.sum()
    torch.testing.assert_close(s.cpu(), r_h.sum())


def test_value_consistent_with_item_and_tolist():
    torch.manual_seed(0)
    r = torch.rand(5, device=DEV)
    first = r[0].item()
    lst = r.tolist()
    assert lst[0] == first
    torch.testing.assert_close(torch.tensor(lst), r.cpu(), rtol=0, atol=0)


def test_random_value_stable_after_later_draws_and_mutation_of_other_tensors():
    torch.manual_seed(0)
    r = torch.randn(32, device=DEV)
    ref = r.cpu()
    other = torch.randn(32, device=DEV)
    other.add_(1)
    ltc.mark_step()
    torch.randn(1000, device=DEV).sum().item()
    torch.testing.assert_close(r.cpu(), ref, rtol=0, atol=0)


def test_dropout_mask_same_in_forward_and_backward():
    torch.manual_seed(0)
    x = torch.ones(1000, device=DEV, requires_grad=True)
    p = 0.3
    y = F.dropout(x, p=p, training=True)
    y.sum().backward()
    y_h = y.detach().cpu()
    g_h = x.grad.cpu()
    torch.testing.assert_close(g_h, y_h)  # d(sum(x*mask/(1-p)))/dx == mask/(1-p) == y for x == 1
    assert (y_h == 0).any() and (y_h != 0).any()


def test_dropout_mask_same_across_mark_step_before_backward():
    torch.manual_seed(1)
    x = torch.full((500,), 2.0, device=DEV, requires_grad=True)
    y = F.dropout(x, p=0.5, training=True)
    y_h = y.detach().cpu()
    ltc.mark_step()
    (y * 3).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), 3 * (y_h != 0).float() / 0.5)


def test_native_dropout_output_matches_its_mask():
    torch.manual_seed(0)
    x = torch.ones(200, device=DEV)
    y, mask = torch.native_dropout(x, 0.3, True)
    y_h, mask_h = ltc.to_cpu([y, mask])
    assert mask_h.dtype == torch.bool
    torch.testing.assert_close(y_h != 0, mask_h)
    torch.testing.assert_close(y_h, mask_h.float() / 0.7)


# -- statistical sanity -------------------------------------------------------------------------

def test_randn_mean_std():
    torch.manual_seed(0)
    x = torch.randn(N, device=DEV).cpu()
    assert x.dtype == torch.float32 and x.shape == (N,)
    assert abs(x.mean().item()) < 0.02
    assert abs(x.std().item() - 1) < 0.02
    assert x.unique().numel() > N * 0.99


def test_randn_float64_and_like():
    torch.manual_seed(0)
    x = torch.randn(N, dtype=torch.float64, device=DEV)
    y = torch.randn_like(x)
    xh, yh = x.cpu(), y.cpu()
    assert xh.dtype == torch.float64 and yh.dtype == torch.float64
    for v in (xh, yh):
        assert abs(v.mean().item()) < 0.02
        assert abs(v.std().item() - 1) < 0.02


def test_normal_with_mean_std():
    torch.manual_seed(0)
    x = torch.empty(N, device=DEV).normal_(mean=3.0, std=0.5).cpu()
    assert abs(x.mean().item() - 3.0) < 0.01
    assert abs(x.std().item() - 0.5) < 0.01
    y = torch.normal(-2.0, 2.0, size=(N,), device=DEV).cpu()
    assert abs(y.mean().item() + 2.0) < 0.04
    assert abs(y.std().item() - 2.0) < 0.04


def test_rand_in_unit_interval():
    torch.manual_seed(0)
    x = torch.rand(N, device=DEV).cpu()
    assert x.dtype == torch.float32
    assert x.min().item() >= 0.0 and x.max().item() < 1.0
    assert abs(x.mean().item() - 0.5) < 0.01
    assert abs(x.var().item() - 1 / 12) < 0.005
    hist = torch.histc(x, bins=10, min=0, max=1)
    assert (hist > N / 10 * 0.9).all() and (hist < N / 10 * 1.1).all()


def test_uniform_range():
    torch.manual_seed(0)
    x = torch.empty(N, device=DEV).uniform_(-3.0, 5.0).cpu()
    assert x.min().item() >= -3.0 and x.max().item() < 5.0
    assert abs(x.mean().item() - 1.0) < 0.05
    y = torch.rand_like(torch.zeros(N, device=DEV)).cpu()
    assert y.min().item() >= 0 and y.max().item() < 1


def test_randint_range():
    torch.manual_seed(0)
    x = torch.randint(3, 10, (N,), device=DEV).cpu()
    assert x.dtype == torch.int64
    assert x.min().item() == 3 and x.max().item() == 9
    counts = torch.bincount(x - 3, minlength=7).float()
    assert counts.numel() == 7
    assert ((counts / N - 1 / 7).abs() < 0.01).all()
    y = torch.randint(5, (1000,), dtype=torch.int32, device=DEV).cpu()
    assert y.dtype == torch.int32 and y.min().item() >= 0 and y.max().item() <= 4


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_bernoulli_rate(p):
    torch.manual_seed(0)
    x = torch.bernoulli(torch.full((N,), p, device=DEV)).cpu()
    assert set(x.unique().tolist()) <= {0.0, 1.0}
    assert abs(x.mean().item() - p) < 0.01
    y = torch.empty(N, device=DEV).bernoulli_(p).cpu()
    assert abs(y.mean().item() - p) < 0.01


def test_bernoulli_per_element_probabilities():
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 1.0]).repeat_interleave(N // 2).to(DEV)
    x = torch.bernoulli(probs).cpu()
    assert x[: N // 2].sum().item() == 0
    assert x[N // 2:].sum().item() == N // 2


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_rate_and_scale(p):
    torch.manual_seed(0)
    x = torch.full((N,), 2.0, device=DEV)
    y = F.dropout(x, p=p, training=True).cpu()
    zeros = (y == 0).float().mean().item()
    assert abs(zeros - p) < 0.01
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - p)))


def test_dropout_module_train_eval():
    torch.manual_seed(0)
    m = torch.nn.Dropout(0.5).to(DEV)
    x = torch.ones(10_000, device=DEV)
    m.train()
    y = m(x).cpu()
    assert abs((y == 0).float().mean().item() - 0.5) < 0.03
    m.eval()
    torch.testing.assert_close(m(x).cpu(), torch.ones(10_000))


def test_randperm_is_permutation():
    torch.manual_seed(0)
    p = torch.randperm(1000, device=DEV).cpu()
    assert p.dtype == torch.int64 and p.shape == (1000,)
    torch.testing.assert_close(p.sort().values, torch.arange(1000))
    assert not torch.equal(p, torch.arange(1000))
    q = torch.randperm(1000, device=DEV).cpu()
    assert not torch.equal(p, q)


def test_multinomial_and_shuffle_by_randperm():
    torch.manual_seed(0)
    w = torch.tensor([0.0, 1.0, 3.0]).to(DEV)
    s = torch.multinomial(w, 30_000, replacement=True).cpu()
    assert (s != 0).all()
    frac2 = (s == 2).float().mean().item()
    assert abs(frac2 - 0.75) < 0.02
    data = torch.arange(10.0).to(DEV)
    perm = torch.randperm(10, device=DEV)
    shuffled = data[perm].cpu()
    torch.testing.assert_close(shuffled.sort().values, torch.arange(10.0))
    torch.testing.assert_close(shuffled, perm.cpu().float())


def test_random_values_not_constant_across_elements():
    torch.manual_seed(0)
    for t in (torch.randn(1000, device=DEV), torch.rand(1000, device=DEV),
              torch.randint(0, 1 << 30, (1000,), device=DEV)):
        h = t.cpu()
        assert h.unique().numel() > 990


def test_devices_draw_independently_of_host_rng_use():
    """Drawing on the host between lazy draws does not change the lazy program's values."""
    torch.manual_seed(11)
    a1 = torch.randn(20, device=DEV)
    b1 = torch.randn(20, device=DEV)
    torch.manual_seed(11)
    a2 = torch.randn(20, device=DEV)
    torch.randn(5)  # host draw
    b2 = torch.randn(20, device=DEV)
    torch.testing.assert_close(a1.cpu(), a2.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(b1.cpu(), b2.cpu(), rtol=0, atol=0)


def test_rng_state_save_and_restore():
    """torch.ltc.get_rng_state / set_rng_state (what torch.testing's freeze_rng_state uses)."""
    from torch.testing._utils import freeze_rng_state
    torch.manual_seed(5)
    state = torch.ltc.get_rng_state()
    a = torch.randn(8, device=DEV).cpu()
    torch.ltc.set_rng_state(state)
    b = torch.randn(8, device=DEV).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.random.fork_rng(device_type="ltc"):     # (the default device type: below)
        inside = torch.rand(4, device=DEV).cpu()
    torch.testing.assert_close(inside, torch.rand(4, device=DEV).cpu(), rtol=0, atol=0)
    if TorchVersion(torch.__version__) >= (2, 12):      # (before, it saves CUDA's generator only)
        with freeze_rng_state():
            inside = torch.rand(4, device=DEV).cpu()
        after = torch.rand(4, device=DEV).cpu()
        torch.testing.assert_close(inside, after, rtol=0, atol=0)
    assert len(torch.ltc.get_rng_state_all()) == len(ltc.devices())
