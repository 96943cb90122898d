"""Elementwise ops reached through Python operators, against CPU in every mode."""
import warnings

import pytest
import torch

from conftest import MODES, check_all_modes, check_raises_like_cpu, run_on


def test_shift_operators_are_lowered():
    """`a << 2` and `a >> b` reach aten.__lshift__/__rshift__, not bitwise_*_shift: they fell back
    to CPU with a flush each."""
    def run(d):
        b = torch.tensor([5, -8, 7], dtype=torch.int32).to(d)
        u = torch.tensor([1, 200, 3], dtype=torch.uint8).to(d)
        return [b << 2, b >> 1, b << torch.tensor([1, 40, 3]).to(d), b >> torch.tensor([1, 40, 0]).to(d),
                u << 9, u >> 1, u << 1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU fallback warns
        check_all_modes(run)


_T = torch.tensor
# each call is invalid on CPU; meta kernels let them through, so they ran (with wrong results) or
# failed later, at the flush, as FlushError
_CPU_REJECTS = {
    "bool subtraction": lambda d: _T([True, False]).to(d) - 1,
    "integer to a negative power": lambda d: _T([2, 1]).to(d) ** -1,
    "float result into an int tensor": lambda d: torch.ones(3, dtype=torch.int64).to(d).mul_(_T(2.5).to(d)),
    "float scalar into an int tensor": lambda d: torch.ones(3, dtype=torch.int64).to(d).mul_(2.5),
    "complex into a float tensor": lambda d: torch.ones(2).to(d).add_(_T([1j, 2j]).to(d)),
    "integer floor division by zero": lambda d: _T([7, -7]).to(d) // 0,
    "integer fmod by zero": lambda d: torch.fmod(_T([7, -7]).to(d), 0),
    "bitwise and on floats": lambda d: torch.bitwise_and(_T([1.0, 2.0]).to(d), 1),
    "abs of bool": lambda d: torch.abs(_T([True]).to(d)),
    "lerp on integers": lambda d: torch.lerp(_T([1, 2]).to(d), _T([3, 4]).to(d), 0.5),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(_CPU_REJECTS))
def test_elementwise_calls_cpu_rejects_raise_cpus_error_at_the_call(mode, case):
    check_raises_like_cpu(_CPU_REJECTS[case], mode)


def test_valid_integer_and_bool_elementwise_calls_still_run():
    def run(d):
        i, b = _T([7, -7, 3]).to(d), _T([True, False, True]).to(d)
        x = torch.ones(3).to(d)
        x.add_(i)
        j = i.clone()
        j.mul_(2)
        return [i + 3, i // 2, i % -4, i ** 2, b & _T([True, True, False]).to(d), ~b, torch.where(b, i, 0), x, j,
                i << 1, torch.bitwise_xor(i, 5), b.logical_not(), i.abs(), -i]

    check_all_modes(run)


@pytest.mark.parametrize("args", [(0.5, 5, 1.5), (-2.5, 3, 1.5), (0.5, 5.5, 1), (7.5,)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_arange_with_float_bounds_in_an_integer_dtype(args, dtype):
    """CPU counts the elements in double and steps from the truncated start by the truncated
    step: arange(0.5, 5, 1.5, dtype=int64) is 0..4. tpu stepped by 1.5 and gave 0, 2, 3, 5, 6."""
    check_all_modes(lambda d: torch.arange(*args, dtype=dtype, device=d))


def test_vdot_conjugates_its_first_argument():
    a, b = torch.tensor([1 + 2j, 3 - 1j]), torch.tensor([2 - 1j, 1 + 1j])
    check_all_modes(lambda d: [torch.vdot(a.to(d), b.to(d)), torch.vdot(a.real.to(d), b.real.to(d))])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.float64])
def test_float_to_integer_casts_out_of_range_like_cpu(dtype, src):
    """C++ leaves these undefined; CPU converts through a 32-bit integer for the narrower types
    and keeps its low bits (-1.0 as uint8 is 255), where XLA saturated (0)."""
    x = torch.tensor([-1.0, -2.5, 200.0, 300.0, 3.7, float("nan"), float("inf"), -float("inf"), 1e10])
    if src == torch.float16:
        x = x.clamp(-6e4, 6e4)
    x = x.to(src)

    def run(d):
        into = torch.zeros(x.shape, dtype=dtype).to(d)
        into.copy_(x.to(d))
        return [x.to(d).to(dtype), into]

    check_all_modes(run)


@pytest.mark.parametrize("call", [
    lambda z: z < z, lambda z: torch.maximum(z, z), lambda z: z.clamp(min=0), lambda z: torch.sort(z),
], ids=["lt", "maximum", "clamp", "sort"])
def test_ordering_complex_numbers_raises_like_cpu(call):
    """They have no order; tpu compared or sorted something anyway."""
    z = torch.tensor([1 + 2j, 3 - 1j])
    check_raises_like_cpu(lambda d: call(z.to(d)), "strict")


_ZERO_BASES = [0j, complex(-0.0, 0.0), complex(0.0, -0.0), complex(-0.0, -0.0)]


@pytest.mark.tpu_tolerance(times=4, why="complex pow is exp(w log z) in XLA:TPU's float32 exp and log: 3.2e-5 "
                                        "absolute measured, 2.7 times")
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_zero_to_a_power_of_positive_real_part_is_zero(dtype):
    """CPU computes exp(y * log(0)) = exp(-inf + ...) = 0; XLA's pow gave NaN."""
    base = torch.tensor(_ZERO_BASES + [1 + 1j], dtype=dtype)
    exp = torch.tensor([0.5 + 1j, 2 - 3j, 1e-3 + 0j, 3 + 0j, 0.5 + 1j], dtype=dtype)

    def run(d):
        x, y = base.to(d), exp.to(d)
        inplace = x.clone()
        inplace.pow_(0.5 + 1j)
        return [x ** y, torch.pow(x, 0.5 + 1j), torch.pow(x, 2 - 3j), inplace, torch.pow(0j, y),
                x.real ** y, x ** y.real]

    check_all_modes(run)


@pytest.mark.tpu_tolerance(times=4, why="complex pow is exp(w log z) in XLA:TPU's float32 exp and log: 2.5e-5 "
                                        "absolute measured, 2.2 times")
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])  # Debug raises on the NaNs
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_zero_to_other_powers_like_cpu(dtype, mode):
    """0 ** 0 with a tensor exponent is NaN on CPU (XLA gave 1); a pure imaginary exponent is
    NaN and a negative real part inf+nanj on both."""
    base = torch.tensor(_ZERO_BASES + [1 + 1j], dtype=dtype)
    exps = [0j, complex(-0.0, 0.0), 2j, -1 + 0j, -0.5 + 2j]

    def run(d):
        x = base.to(d)
        return [x ** torch.tensor([e] * len(_ZERO_BASES + [1]), dtype=dtype).to(d) for e in exps] + \
               [torch.pow(0j, torch.tensor(exps, dtype=dtype).to(d)), torch.pow(x, 0j), torch.pow(x, 2j)]

    expected = run_on(run, "cpu", None)
    torch.testing.assert_close(run_on(run, "tpu", mode), expected, equal_nan=True)


def test_scalar_shifted_by_a_tensor():
    """`1 << t` and `100 >> t` reach bitwise_*_shift.Scalar_Tensor, whose expansion handed the
    lowered .Tensor overload a Python int and raised RuntimeError in every mode."""
    def run(d):
        out = []
        for dt in (torch.uint8, torch.int8, torch.int32, torch.int64):
            t = _T([0, 1, 3, 7], dtype=dt).to(d)
            out += [1 << t, 100 >> t, -100 >> t, torch.bitwise_left_shift(5, t)]
        return out

    check_all_modes(run)


def test_complex_scalar_takes_part_in_type_promotion():
    """A complex Scalar is a static argument, so it was left out of the computation dtype: a bool
    tensor times 1+2j computed a logical and and gave 1+0j."""
    def run(d):
        b = _T([True, False]).to(d)
        return [b * (1 + 2j), torch.mul(b, 2j), _T([1, 0]).to(d) * (1 + 2j), torch.ones(2).to(d) * (1 + 2j)]

    check_all_modes(run)


def test_complex_fill_value_into_a_real_tensor_like_cpu():
    """CPU writes 2+0j into float32 as 2.0 and raises for 1j; tpu failed at the flush for the
    first and silently dropped the imaginary part for the second."""
    check_all_modes(lambda d: [torch.full((2,), 2 + 0j, dtype=torch.float32, device=d),
                               torch.ones(2).to(d).fill_(3 + 0j)])
    for mode in MODES:
        check_raises_like_cpu(lambda d: torch.ones(2, dtype=torch.int32).to(d).fill_(1j), mode)
        check_raises_like_cpu(lambda d: torch.full((2,), 1j, dtype=torch.float32, device=d), mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", [
    lambda x, m: x.masked_fill(m, 1.0),
    lambda x, m: x.masked_fill_(m, 2.0),
    lambda x, m: x.masked_fill_(m, torch.tensor(3.0).to(x.device)),
], ids=["masked_fill", "masked_fill_", "masked_fill_tensor_value"])
def test_masked_fill_with_a_uint8_mask_raises_like_cpu(call, mode):
    """CPU takes only bool masks here; PyTorch's meta kernel takes any, and the in-place form's
    decomposition words its refusal its own way ("expected predicate to be bool")."""
    mask = torch.tensor([1, 0, 1], dtype=torch.uint8)
    check_raises_like_cpu(lambda d: call(torch.zeros(3).to(d), mask.to(d)), mode)


@pytest.mark.parametrize("call", [
    lambda: torch.ones(2, dtype=torch.float16, device="tpu") * (1 + 2j),  # CPU: a complex32 result
    lambda: torch.ones(2, dtype=torch.complex32, device="tpu"),
    lambda: torch.ones(2, dtype=torch.complex32).to("tpu"),
], ids=["half_times_complex", "factory", "host_copy"])
def test_a_dtype_jax_lacks_raises_a_runtime_error_naming_it(call):
    """complex32 has no JAX dtype. The error was a TypeError, which PyTorch's binary operators
    turn into Python's "unsupported operand type(s) for *", hiding the dtype; a host copy said
    NumPy's "unsupported ScalarType ComplexHalf"."""
    with pytest.raises(RuntimeError, match="torch.complex32 is not supported on the tpu device"):
        call()
