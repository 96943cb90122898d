"""Sampling ops whose values cannot match CPU's draws: checked on their distribution, on what
they must never draw, on determinism under a seed, and on CPU's errors in Debug mode."""
import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes, check_raises_like_cpu
from deferfuse.config import CONFIG
from deferfuse.target import jax_device

W = torch.tensor([[1.0, 0.0, 3.0, 4.0, 2.0], [0.0, 5.0, 0.0, 5.0, 0.0]])  # unnormalised, with zeros


def _draw(mode, w, n, replacement, seed=0):
    torch.manual_seed(seed)
    with deferfuse.mode(mode):
        return torch.multinomial(w.to("tpu"), n, replacement=replacement).cpu()


@pytest.mark.parametrize("mode", MODES)
def test_multinomial_with_replacement_follows_the_weights(mode):
    n = 20000
    got = _draw(mode, W, n, True)
    assert got.dtype == torch.int64 and got.shape == (2, n)
    for row in range(2):
        freq = torch.bincount(got[row], minlength=5).double() / n
        p = W[row].double() / W[row].sum()
        torch.testing.assert_close(freq, p, atol=0.015, rtol=0)
        assert (freq[p == 0] == 0).all()  # a zero weight is never drawn
    one = _draw(mode, W[0], 7, True)
    assert one.shape == (7,)


@pytest.mark.parametrize("mode", MODES)
def test_multinomial_without_replacement_draws_distinct_categories(mode):
    rows = 4000
    w = W[0].expand(rows, 5).contiguous()
    got = _draw(mode, w, 3, False)
    assert got.shape == (rows, 3)
    assert all(len(set(r.tolist())) == 3 for r in got[:200])
    assert not (got == 1).any()  # only 4 nonzero weights for 3 draws: the zero one never comes
    first = torch.bincount(got[:, 0], minlength=5).double() / rows
    torch.testing.assert_close(first, W[0].double() / W[0].sum(), atol=0.03, rtol=0)
    # as many draws as nonzero weights: exactly the nonzero categories, in some order
    allnz = _draw(mode, W[1], 2, False)
    assert sorted(allnz.tolist()) == [1, 3]
    # more draws than nonzero weights: as on CPU, the zero ones come after them (in an order
    # CPU does not define)
    more = _draw(mode, W[1:].expand(3, 5), 5, False)
    assert all(sorted(r[:2].tolist()) == [1, 3] and sorted(r[2:].tolist()) == [0, 2, 4] for r in more)


def test_multinomial_is_seeded_identically_in_every_mode_and_fresh_per_call():
    draws = [_draw(m, W, 50, True, seed=7) for m in MODES]
    for d in draws[1:]:
        assert torch.equal(d, draws[0])
    torch.manual_seed(7)
    a = torch.multinomial(W.to("tpu"), 50, replacement=True).cpu()
    b = torch.multinomial(W.to("tpu"), 50, replacement=True).cpu()
    assert torch.equal(a, draws[0]) and not torch.equal(a, b)


def test_multinomial_rejects_what_cpu_rejects_from_shapes_alone():
    for w, n in [(W, 6), (W, 0), (torch.ones(2, 2, 2), 1)]:
        check_raises_like_cpu(lambda d: torch.multinomial(w.to(d), n), "defer_and_fuse")


def test_multinomial_sampling_loop_is_lowered_and_fuses():
    """A generation loop (softmax, sample, append) records without CPU fallbacks or flushes."""
    torch.manual_seed(0)
    logits = torch.randn(2, 16).to("tpu")
    deferfuse.reset_metrics()
    with deferfuse.mode():
        seq = torch.zeros(2, 1, dtype=torch.long, device="tpu")
        for _ in range(5):
            nxt = torch.multinomial(torch.softmax(logits + seq.sum(), -1), 1)
            seq = torch.cat([seq, nxt], 1)
        m = deferfuse.metrics()
        assert m["flushes"] == 0 and not m["cpu_fallbacks"]
        out = seq.cpu()
    assert out.shape == (2, 6) and ((out >= 0) & (out < 16)).all()


@pytest.mark.parametrize("w, n, replacement", [
    (torch.tensor([1.0, -1.0, 2.0]), 1, True),
    (torch.tensor([1.0, float("nan"), 2.0]), 1, True),
    (torch.tensor([[1.0, 2.0], [0.0, 0.0]]), 1, True),
])
def test_multinomial_debug_raises_cpus_error_for_invalid_weights(w, n, replacement):
    """Strict and DeferAndFuse cannot look at the weights without a sync; Debug does."""
    t = w.to("tpu")
    check_raises_like_cpu(lambda d: torch.multinomial(w if d == "cpu" else t, n, replacement=replacement), "debug")
    torch.testing.assert_close(t.cpu(), w, equal_nan=True)  # the input is intact


_DRAWS = {
    "randn": lambda g: torch.randn(3, device="tpu", generator=g),
    "rand": lambda g: torch.rand(2, 3, device="tpu", generator=g),
    "randint": lambda g: torch.randint(0, 100, (5,), device="tpu", generator=g),
    "normal_": lambda g: torch.empty(4, device="tpu").normal_(generator=g),
    "uniform_": lambda g: torch.empty(4, device="tpu").uniform_(generator=g),
    "exponential_": lambda g: torch.empty(4, device="tpu").exponential_(generator=g),
    "bernoulli": lambda g: torch.full((8,), 0.5, device="tpu").bernoulli(generator=g),
    # 8 of 64 classes: two draws agree by chance with odds of about 1e-14
    "multinomial": lambda g: torch.multinomial(torch.ones(64, device="tpu"), 8, generator=g),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("draw", sorted(_DRAWS))
def test_a_generator_decides_the_values(draw, mode):
    """torch.Generator(device="tpu") raised; a generator given to a tpu random op was ignored,
    so reseeding it did not repeat the values. (Values are not CPU's, as without a generator.)"""
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu" and isinstance(g, torch.Generator)
    f = _DRAWS[draw]
    with deferfuse.mode(mode):
        g.manual_seed(9)
        first = [f(g).cpu() for _ in range(2)]
        g.manual_seed(9)
        again = [f(g).cpu() for _ in range(2)]
    torch.testing.assert_close(again, first)
    assert not torch.equal(first[0], first[1])  # and it moves on per draw


# randperm has no lowering: it runs on the host, as a CPU fallback, and draws there
@pytest.mark.parametrize("mode", MODES)
def test_a_random_op_run_on_the_host_draws_from_the_generator_it_is_given(mode):
    """Recorded from its signature's second call on, the fallback kept the first call's generator:
    fresh generators seeded alike gave other permutations (transformers' watermarking logits
    processor builds one per `generate` call)."""
    want = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    with deferfuse.mode(mode):
        got = [torch.randperm(16, generator=torch.Generator(device="tpu").manual_seed(1), device="tpu")
               for _ in range(3)]
        got = [t.cpu() for t in got]
    torch.testing.assert_close(got, [want] * 3)


def test_a_random_op_run_on_the_host_draws_at_its_call():
    """Recorded, the draw waited for the flush, after the draws the generator made since."""
    def run(d):
        g = torch.Generator(device=d).manual_seed(0)
        return [torch.randperm(n, generator=g, device=d) for n in (16, 16, 5)]
    check_all_modes(run)


def test_cpu_generators_are_still_generators():
    g = torch.Generator().manual_seed(0)
    assert type(g) is torch._C.Generator and isinstance(g, torch.Generator)
    torch.testing.assert_close(torch.randn(3, generator=g), torch.randn(3, generator=torch.Generator().manual_seed(0)))


_BAD_RANDOM_ARGS = {
    "randint low >= high": lambda d: torch.randint(5, 2, (3,), device=d),
    "random_ from >= to": lambda d: torch.empty(3, device=d).random_(3, 3),
    "uniform_ from > to": lambda d: torch.empty(3, device=d).uniform_(1, 0),
    "bernoulli_ p > 1": lambda d: torch.empty(3, device=d).bernoulli_(1.5),
    "normal std < 0": lambda d: torch.normal(0.0, -1.0, (3,), device=d),
}


@pytest.mark.parametrize("case", sorted(_BAD_RANDOM_ARGS))
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_random_ops_check_their_arguments_like_cpu(case, mode):
    """They returned a constant (the low bound, 1.0) where CPU raises."""
    check_raises_like_cpu(_BAD_RANDOM_ARGS[case], mode)


def test_checking_a_random_op_leaves_cpus_random_stream_alone():
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    torch.empty(2, device="tpu").uniform_(0.25, 5.5)  # a new signature: its arguments are checked on CPU
    torch.testing.assert_close(torch.rand(3), want)


# --- RNG ---------------------------------------------------------------------------------------------


def _random_program():
    a = torch.rand(4, device="tpu")
    b = torch.randn(2, 3, device="tpu")
    c = torch.randint(0, 100, (5,), device="tpu")
    d = torch.empty(6, device="tpu").normal_(2.0, 0.5)
    e = torch.empty(6, device="tpu").uniform_(-1, 1)
    f = torch.bernoulli(torch.full((8,), 0.5, device="tpu"))
    g = F.dropout(torch.ones(10, device="tpu"), 0.3)
    return [t.cpu() for t in (a, b, c, d, e, f, g)]


def test_rng_is_deterministic_and_identical_across_modes():
    results = []
    for m in MODES:
        torch.manual_seed(123)
        with deferfuse.mode(m):
            results.append(_random_program())
    for other in results[1:]:
        for x, y in zip(results[0], other):
            assert torch.equal(x, y)
    torch.tpu.manual_seed(123)
    again = _random_program()
    for x, y in zip(results[0], again):
        assert torch.equal(x, y)


def test_rng_gives_fresh_values_and_sane_statistics():
    torch.manual_seed(0)
    with deferfuse.mode():
        a = torch.rand(20000, device="tpu")
        b = torch.rand(20000, device="tpu")
        n = torch.randn(20000, device="tpu")
        a, b, n = a.cpu(), b.cpu(), n.cpu()
    assert not torch.equal(a, b)
    assert 0.0 <= a.min() and a.max() < 1.0 and abs(a.mean().item() - 0.5) < 0.02
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05


def test_dropout_in_a_loop_does_not_recompile():
    x = torch.ones(64, device="tpu")
    before = deferfuse.metrics()["cache_misses"]
    with deferfuse.mode():
        outs = []
        for _ in range(6):
            outs.append(F.dropout(x, 0.5).sum().item())
    assert len(set(outs)) > 1
    assert deferfuse.metrics()["cache_misses"] == before + 1


def _draws(prng: str, modes=MODES):
    """`_random_program` and a larger uniform draw under CONFIG.prng = prng, in each mode."""
    was = CONFIG.prng
    CONFIG.prng = prng
    deferfuse.cache.clear()  # programs traced with the other implementation
    try:
        out = []
        for m in modes:
            torch.manual_seed(123)
            with deferfuse.mode(m):
                out.append(_random_program() + [torch.rand(20000, device="tpu").cpu()])
        return out
    finally:
        CONFIG.prng = was
        deferfuse.cache.clear()


@pytest.mark.parametrize("prng", ["threefry2x32", "rbg"])
def test_each_prng_draws_identically_in_every_mode(prng):
    results = _draws(prng)
    for other in results[1:]:
        for x, y in zip(results[0], other):
            assert torch.equal(x, y)
    u = results[0][-1]
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean().item() - 0.5) < 0.02


def test_the_prng_decides_the_values_and_auto_takes_rbg_off_the_cpu_backend():
    threefry, rbg, auto = (_draws(prng, ["defer_and_fuse"])[0] for prng in ("threefry2x32", "rbg", "auto"))
    assert not torch.equal(threefry[-1], rbg[-1])
    expected = threefry if jax_device().platform == "cpu" else rbg
    for x, y in zip(auto, expected):
        assert torch.equal(x, y)
