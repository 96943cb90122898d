"""Fuzzer findings (issue 31; the others are in test_fuzz_findings.py) about values: XLA's
arithmetic parts from CPU's at NaNs, infinities, signed zeros, integer overflow and half-precision
rounding, and CPU is the oracle, so each case here is one where the lowering follows CPU's rule."""
from __future__ import annotations

import itertools

import pytest
import torch

import deferfuse
from conftest import MODES, check_all_modes


# Seed 307: XLA rewrites convert(bool) * y as select(bool, y, 0) (and convert(bool) / broadcast(y)
# through a reciprocal), so a false element times inf, or 0 / 0, gave 0 where CPU gives NaN.
_BOOL_ARITHMETIC = {
    "eq(a, False) / b broadcast": lambda d: torch.eq(torch.tensor([[[1., 0, 2], [0, 0, 1], [3, 0, 0]]] * 2, device=d),
                                                     False) / torch.tensor([True, False], device=d).reshape(2, 1, 1),
    "bool / bool broadcast": lambda d: torch.zeros(2, 3, dtype=torch.bool, device=d) / torch.zeros(2, 1, dtype=torch.bool,
                                                                                                   device=d),
    "bool * inf": lambda d: torch.tensor([True, False], device=d) * torch.full((2,), float("inf"), device=d),
    "mask.float() * inf": lambda d: torch.tensor([True, False], device=d).float() * torch.tensor([float("inf")], device=d),
    "mask.float() * nan + 1": lambda d: torch.tensor([False, True], device=d).float() * float("nan") + 1,
    "mask.float() / zeros broadcast": lambda d: torch.tensor([False, True], device=d).float() / torch.zeros(1, device=d),
}


@pytest.mark.parametrize("case", list(_BOOL_ARITHMETIC))
def test_arithmetic_on_converted_bools_keeps_cpus_nans(case):
    check_all_modes(_BOOL_ARITHMETIC[case], equal_nan=True)


def test_floor_division_gives_zero_quotients_cpus_sign():
    """Seed 263: 0 / -2 floored is -0.0 on CPU (c10 takes the sign of x / y), and `3 // q` then
    gives -inf; NumPy's rule, which jnp.floor_divide follows, gave +0.0. Seen through 1 / q."""
    def run(d):
        a = torch.tensor([0., 0., -0., -0., 1., 3., 7.5, -7.5, 1., -1., 0.], device=d)
        b = torch.tensor([-2., 2., 2., -2., -2., -2., 2., 2., 0., 0., 0.], device=d)
        return (1 / (a // b), 1 / torch.div(a, b, rounding_mode="floor"), 1 / (a // -2.0),
                1 / torch.floor_divide(a.bfloat16(), b.bfloat16()), torch.tensor([7, -7], device=d) // 2)
    check_all_modes(run, equal_nan=True)


def test_true_division_of_bools_by_a_false_gives_cpus_nans():
    """Seed 488: div's rounding_mode=None overload let jnp convert the bools, and XLA folded
    `convert(False) / 0` to 0 where CPU gives NaN."""
    check_all_modes(lambda d: (torch.div(torch.zeros(2, 3, dtype=torch.bool, device=d), False, rounding_mode=None),
                               torch.div(torch.tensor([True, False], device=d), torch.zeros((), dtype=torch.bool, device=d),
                                         rounding_mode=None),
                               torch.div(torch.tensor([3, 0], device=d), 0, rounding_mode=None)), equal_nan=True)


_SIGNED_ZERO_MAXMIN = {
    "relu": lambda x, z: torch.relu(x), "relu_": lambda x, z: x.clone().relu_(), "clamp": lambda x, z: x.clamp(min=0.0),
    "clamp_min": lambda x, z: x.clamp_min(0.0), "clamp by tensors": lambda x, z: x.clamp(z, z + 1),
    "maximum": lambda x, z: torch.maximum(x, z), "maximum reversed": lambda x, z: torch.maximum(z, x),
    "minimum reversed": lambda x, z: torch.minimum(z, x), "fmax": lambda x, z: torch.fmax(x, z),
    "fmin": lambda x, z: torch.fmin(z, x), "hardtanh": lambda x, z: torch.nn.functional.hardtanh(x, 0.0, 1.0),
    "relu6": lambda x, z: torch.nn.functional.relu6(x), "foreach maximum": lambda x, z: torch._foreach_maximum([x], [z])[0],
    "foreach clamp_min": lambda x, z: torch._foreach_clamp_min([x], 0.0)[0],
}


@pytest.mark.parametrize("case", list(_SIGNED_ZERO_MAXMIN))
def test_max_and_min_keep_cpus_signed_zeros_and_nans(case):
    """Seed 897: CPU's max is `b if a < b else a` (NaN if either is), so relu_(-0.0) is -0.0;
    XLA's max gave 0.0, and a later 1 / it gave inf where CPU gives -inf. Seen through 1 / y."""
    def run(d):
        x = torch.tensor([-0.0, 0.0, -1.0, float("nan"), 2.0, float("inf"), -float("inf")], device=d)
        z = torch.tensor([0.0, -0.0, float("nan"), 1.0, 3.0, 0.0, -0.0], device=d)
        return 1 / _SIGNED_ZERO_MAXMIN[case](x, z)
    check_all_modes(run, equal_nan=True)


def test_a_python_number_to_tensor_powers_like_cpu():
    """Seed 3357: `False ** float_tensor` took the bool rule (0) where CPU computes 0.0 ** y
    (inf for a negative y)."""
    def run(d):
        y = torch.tensor([-1.5, 0.0, 2.0, -2.0], device=d)
        return False ** y, True ** y, 0 ** y, 2 ** torch.tensor([-1, 0, 3], device=d), False ** torch.tensor([1, 0], device=d)
    check_all_modes(run, equal_nan=True)


def test_integer_pow_wraps_like_cpu_for_any_exponent():
    """Seed 708: jnp.power's integer pow stops after six bits of the exponent (any more overflows),
    so 512 ** 512 was 1 where CPU's wrapped result is 0."""
    b = [512, 2, 2, 3, 24389, 7, 3, -3, 0, 1, -1, 5, -7]
    e = [512, 64, 63, 100, 24389, 2 ** 40, 2 ** 62, 5, 0, -3, -3, -1, 3]
    check_all_modes(lambda d: (torch.tensor(b, device=d) ** torch.tensor(e, device=d),
                               torch.tensor(b[1:4] + b[7:], dtype=torch.int8, device=d) ** torch.tensor(9, dtype=torch.int8,
                                                                                                     device=d)))


def test_complex_zero_to_a_power_of_negative_real_part_like_cpu():
    """Seed 893: CPU gives inf+nanj (exp(y * log(0))); XLA gave nan+nanj for a tensor exponent.
    Compared part by part: which parts are NaN is the point here."""
    x = torch.tensor([0j, 0j, 0j, 1 + 1j])
    y = torch.tensor([-6 + 0j, -1.5 + 2j, 2 + 0j, -2 + 0j])
    for mode in MODES:
        with deferfuse.mode(mode):
            got = torch.view_as_real((x.to("tpu") ** y.to("tpu")).cpu())
            torch.testing.assert_close(got, torch.view_as_real(x ** y), equal_nan=True)


def test_complex_addcdiv_by_zero_multiplies_value_first_like_cpu():
    """CPU computes `value * t1 / t2` in that order: a complex t1 over zero is infinite in both
    parts, where `value * (t1 / t2)` made NaN of 0 * inf (seed 6076)."""
    def run(d):
        x = torch.tensor([[1.0, -2.0], [0.0, 3.0]], dtype=torch.bfloat16, device=d)
        t1 = torch.tensor([[1 + 2j], [-3 + 0.5j]], dtype=torch.complex64, device=d)
        return torch.view_as_real(torch.addcdiv(x, t1, x, value=3.0))
    check_all_modes(run, equal_nan=True)


@pytest.mark.parametrize("fn", [torch.var_mean, torch.std_mean])
def test_var_mean_over_infinities_follows_cpus_welford_mean(fn):
    """CPU's Welford mean is NaN once an element follows an infinity; an infinity met last (in
    memory order) survives (seeds 4383, 6391)."""
    inf = float("inf")
    x = torch.ones(4, 3, dtype=torch.float64)
    x[3, 2] = inf
    calls = [(torch.tensor([-inf, 1.0, 2.0]), {}), (torch.tensor([1.0, 2.0, inf]), {}), (x, {}), (x.t(), {}),
             (x, {"dim": 0}), (x.t(), {"dim": 1, "keepdim": True}), (x.t(), {"dim": 0})]
    for t, kwargs in calls:
        check_all_modes(lambda d, t=t, kwargs=kwargs: fn(t.to(d), **kwargs), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_division_of_zeros_and_infinities_matches_cpu(dtype):
    """CPU divides complex numbers by c10::complex's rule (Smith's algorithm; a zero divisor
    divides each part by its magnitude), XLA by C99's: `1 / (inf+infj)` was 0 where CPU gives
    NaN (seeds 4091, 6076)."""
    inf, nan = float("inf"), float("nan")
    parts = [0.0, -0.0, 1.5, -2.0, inf, -inf, nan]
    x = torch.tensor([complex(r, i) for r, i in itertools.product(parts, parts)], dtype=dtype)
    a, b = x.repeat_interleave(len(x)), x.repeat(len(x))

    def run(d):
        return [torch.view_as_real(v) for v in (a.to(d) / b.to(d), x.to(d).reciprocal(), 2.5 / x.to(d),
                                                 torch.addcdiv(a.to(d), a.to(d), b.to(d), value=2.0),
                                                 torch.div(a.to(d), b.to(d), rounding_mode=None))]
    check_all_modes(run, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_logsumexp_rounds_each_step_like_cpu(dtype):
    """CPU's logsumexp of a half type rounds after every op; rounding once was a last place off
    (seed 9008)."""
    x = torch.tensor([[-0.5, 0.5, 0.5], [-2.5, 1.5, -2.5]], dtype=dtype)
    inf = float("inf")
    y = torch.tensor([[inf, 1.0], [-inf, -inf]], dtype=dtype)
    check_all_modes(lambda d: [torch.logsumexp(x.to(d), 0), torch.logsumexp(x.to(d), 1, True),
                               torch.logsumexp(y.to(d), 1)], rtol=0, atol=0)


def test_an_infinite_complex_base_to_a_negative_real_part_vanishes_like_cpu():
    """exp(-inf + i*t) is 0 in CPU's C99 arithmetic, NaN in XLA's pow (seed 9030)."""
    inf = float("inf")
    x = torch.tensor([inf, -inf, complex(inf, 1), complex(1, -inf), 2 + 1j], dtype=torch.complex64)
    y = torch.tensor([-1.5 + 1.5j, -1 + 0.5j, -2 + 0j, -0.5 - 3j, 0.5 + 0j], dtype=torch.complex64)
    check_all_modes(lambda d: torch.view_as_real(x.to(d) ** y.to(d)), equal_nan=True)


def test_softmax_of_a_non_finite_scalar_is_nan_like_cpu():
    """A 0-dim softmax was 1 (log_softmax 0) whatever its value; CPU gives NaN for NaN and
    infinities (seed 7227)."""
    x = torch.tensor([2.0, float("nan"), float("inf"), -float("inf")])
    check_all_modes(lambda d: [f(x.to(d)[i], 0) for i in range(4) for f in (torch.softmax, torch.log_softmax)],
                    equal_nan=True)


def test_variance_of_nothing_is_nan_in_a_fused_program_too():
    """var of an empty tensor is NaN; fused with a multiply it came out 0 (seed 9577)."""
    def run(d):
        v = torch.zeros(0, dtype=torch.float64, device=d).var(correction=0)
        return v * 3.0, torch.zeros(0, 2, device=d).std(0) + 1
    with pytest.warns(UserWarning):
        check_all_modes(run, equal_nan=True)
