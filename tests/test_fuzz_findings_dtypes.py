"""Fuzzer findings (issue 31; the others are in test_fuzz_findings.py) about dtypes: PyTorch's
meta kernels promote, convert and refuse Python numbers, bools and complex values less strictly
than CPU's kernels do, so tpu typed a result, or ran, where CPU converts otherwise or raises."""
from __future__ import annotations

import pytest
import torch

import deferfuse
from conftest import MODES, check_all_modes, check_raises_like_cpu


@pytest.mark.parametrize("value", [2, -1.5, True, 0.5 + 2j])
def test_copy_of_a_python_number_fills_like_cpu(value):
    """`t.copy_(2)` raised AttributeError: 'int' object has no attribute 'shape'."""
    dtype = torch.complex64 if isinstance(value, complex) else torch.float32

    def run(d):
        x = torch.zeros(3, dtype=dtype).to(d)
        y = torch.zeros(2, 3, 3, dtype=torch.float64).to(d)
        x.copy_(value)
        y.diagonal(0, 1, 2).copy_(value.real if isinstance(value, complex) else value)  # through a view
        return x, y

    check_all_modes(run)


_BOOL_SUBTRACTIONS = {
    "sub alpha": lambda x: torch.sub(x, True, alpha=-1),
    "minus True": lambda x: x - True,
    "True minus": lambda x: True - x,
    "sub_": lambda x: x.sub_(False),
    "rsub": lambda x: torch.rsub(x, True),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", sorted(_BOOL_SUBTRACTIONS))
def test_subtracting_a_python_bool_raises_like_cpu(call, mode):
    """CPU refuses to subtract a bool; tpu returned a value (the meta kernel does not check)."""
    check_raises_like_cpu(lambda d: _BOOL_SUBTRACTIONS[call](torch.ones(3).to(d)), mode)


@pytest.mark.parametrize("mode", MODES)
def test_adding_a_python_bool_still_works(mode):
    check_all_modes(lambda d: (torch.ones(3).to(d) + True, torch.mul(torch.ones(3).to(d), True)))


_BOOL_KERNELS = {
    "matmul": lambda d: torch.ones(2, 3, dtype=torch.bool).to(d) @ torch.ones(3, dtype=torch.bool).to(d),
    "mm": lambda d: torch.mm(torch.ones(2, 3, dtype=torch.bool).to(d), torch.ones(3, 2, dtype=torch.bool).to(d)),
    "arange": lambda d: torch.arange(1, 4, 0.5, dtype=torch.bool, device=d),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", sorted(_BOOL_KERNELS))
def test_ops_cpu_has_no_bool_kernel_for_raise_like_cpu(call, mode):
    check_raises_like_cpu(_BOOL_KERNELS[call], mode)


def test_shifting_a_bool_tensor_gives_cpus_int64_result():
    """PyTorch's meta kernel refuses a bool shift that CPU's kernel takes: tpu raised."""
    def run(d):
        x = torch.tensor([True, False]).to(d)
        return x << 1, x >> 1, torch.tensor(True).to(d) << 3, 1 << x

    check_all_modes(run)


_NO_COMPLEX_KERNEL = {
    "arange": lambda d: torch.arange(1, 4, 0.5, dtype=torch.complex64, device=d),
    "xlogy of 1j": lambda d: torch.xlogy(torch.ones(3).to(d), 1j),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", sorted(_NO_COMPLEX_KERNEL))
def test_ops_cpu_has_no_complex_kernel_for_raise_like_cpu(call, mode):
    check_raises_like_cpu(_NO_COMPLEX_KERNEL[call], mode)


def test_nan_to_num_of_complex_and_bfloat16_like_cpu():
    """PyTorch's decomposition refused complex inputs (isneginf): RuntimeError where CPU runs."""
    vals = [float("nan"), float("inf"), -float("inf"), 1.5]

    def run(d):
        x = torch.tensor(vals).to(d)
        return (torch.nan_to_num(x.to(torch.complex64) * (1 + 1j)), torch.nan_to_num(x.to(torch.bfloat16)),
                torch.nan_to_num(x, 1.0, 2.0, -3.0), x.double().nan_to_num_(posinf=5.0))

    check_all_modes(run)


def test_a_bool_tensor_to_a_bool_power_stays_bool_like_cpu():
    """Seed 304: result_type(bool tensor, bool) is bool; the meta kernel said int64."""
    check_all_modes(lambda d: (torch.tensor([True, False], device=d) ** False, torch.tensor([True, False], device=d) ** True,
                               torch.tensor([True, False], device=d) ** 2))


@pytest.mark.parametrize("mode", MODES)
def test_nansum_of_a_complex_tensor_raises_like_cpu(mode):
    """Seed 286: CPU has no complex nansum (CUDA has; the oracle is CPU)."""
    check_raises_like_cpu(lambda d: torch.tensor([1 + 1j, 2], device=d).nansum(), mode)


def test_nansum_like_cpu():
    """nansum has a lowering of its own; `nansum(x, [])` reduces every dim (the meta kernel none)."""
    def run(d):
        x = torch.tensor([[1., float("nan")], [2., 3.]], device=d)
        return (x.nansum(), x.nansum(1, keepdim=True), x.nansum([]), x.nansum([], keepdim=True),
                x.bfloat16().nansum(0, dtype=torch.float64), torch.tensor([[1, 5], [2, 3]], device=d).nansum(0))
    check_all_modes(run)


def test_masked_fill_with_a_complex_value_into_a_real_tensor_like_cpu():
    """Seed 1013: CPU converts a complex fill value into bool (value != 0), and into any real dtype
    when its imaginary part is 0; the meta kernel refused them all."""
    def run(d):
        m = torch.tensor([True, False], device=d)
        return (torch.tensor([True, False], device=d).masked_fill(m, -1 + 0.5j),
                torch.tensor([False, True], device=d).masked_fill(~m, 0j), torch.tensor([1, 0], device=d).masked_fill(m, 2 + 0j),
                torch.tensor([1., 0], device=d).masked_fill_(m, 2 + 0j))
    check_all_modes(run)


@pytest.mark.parametrize("mode", MODES)
def test_masked_fill_with_an_imaginary_value_into_a_real_tensor_raises_like_cpu(mode):
    check_raises_like_cpu(lambda d: torch.tensor([1., 0], device=d).masked_fill(torch.tensor([True, False], device=d), 2 + 1j),
                          mode)


def test_complex_to_real_conversions_like_cpu():
    """Seed 20238: complex to bool is true when either part is nonzero (XLA looked at the real
    part only); to other dtypes CPU drops the imaginary part."""
    x = [0j, 1j, 0.5 + 0j, 0.5j, -3.5 + 1j, 300 + 2j]
    check_all_modes(lambda d: tuple(torch.tensor(x, device=d).to(dt) for dt in (torch.bool, torch.int64, torch.uint8,
                                                                               torch.float32, torch.bfloat16)))


_COMPLEX_VALUE = {
    "addcmul": lambda d: torch.addcmul(torch.ones(3, device=d), torch.ones(3, device=d), torch.ones(3, device=d), value=0.5 - 1j),
    "addcdiv": lambda d: torch.addcdiv(torch.ones(3, device=d), torch.ones(3, device=d), torch.ones(3, device=d), value=1j),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", list(_COMPLEX_VALUE))
def test_a_complex_value_for_a_real_addcmul_raises_like_cpu(call, mode):
    """Seed 20400: a complex `value=` keyword was not rehearsed on CPU (a complex positional one was)."""
    check_raises_like_cpu(_COMPLEX_VALUE[call], mode)


def test_floor_division_of_floats_by_a_python_bool_like_cpu():
    """Seeds 20490, 20535: `x // True` and `floor_divide(x, False)` on floats failed in XLA's rem."""
    check_all_modes(lambda d: (torch.tensor([1.0, 3.0], device=d) // True, torch.floor_divide(torch.tensor([1.0, -3.0], device=d), False),
                               torch.tensor([1, 3], device=d) // True), equal_nan=True)


def test_clamp_of_a_float_tensor_by_a_complex_bound_with_no_imaginary_part_like_cpu():
    """Seed 20554: CPU keeps a floating tensor's dtype and converts such a bound (in place too);
    the meta kernels promoted to complex or refused the in-place call."""
    def run(d):
        x = torch.tensor([1.0, 3.0, -2.0], dtype=torch.bfloat16, device=d)
        return x.clamp(min=2 + 0j), x.clamp(0, 2.5 + 0j), x.clone().clamp_(min=2 + 0j)
    check_all_modes(run)


@pytest.mark.parametrize("mode", MODES)
def test_clamp_by_a_complex_bound_cpu_refuses_raises_like_cpu(mode):
    check_raises_like_cpu(lambda d: torch.tensor([1.0, 3.0], device=d).clamp(min=2 + 1j), mode)
    check_raises_like_cpu(lambda d: torch.tensor([1, 3], device=d).clamp(min=2 + 0j), mode)
    check_raises_like_cpu(lambda d: torch.tensor([1.0, 3.0], device=d).clamp_min(2 + 0j), mode)


def test_addcmul_of_integer_tensors_converts_its_value_first_like_cpu():
    """Seed 4050: CPU converts `value` to the integer type (-1.5 is -1) before multiplying."""
    check_all_modes(lambda d: (torch.addcmul(torch.tensor([3, -3], device=d), torch.tensor(2, device=d),
                                             torch.tensor(1, device=d), value=-1.5),
                               torch.addcmul(torch.tensor([3.0, -3.0], device=d), torch.tensor(2.0, device=d),
                                             torch.tensor(1.0, device=d), value=-1.5)))


@pytest.mark.parametrize("mode", MODES)
def test_integer_addmm_with_a_float_beta_over_an_empty_contraction_raises_like_cpu(mode):
    """CPU refuses a float beta for an integer result only when the contraction is empty (seed
    2943); with a non-empty one, or an integral beta, it computes."""
    def addmm(k, beta):
        def run(d):
            a = torch.ones(2, 2, dtype=torch.long, device=d)
            return torch.addmm(a, torch.ones(2, k, dtype=torch.long, device=d),
                               torch.ones(k, 2, dtype=torch.long, device=d), beta=beta)
        return run
    check_raises_like_cpu(addmm(0, 0.5), mode)
    for k, beta in ((0, 2), (1, 0.5)):
        with deferfuse.mode(mode):
            got = addmm(k, beta)("tpu").cpu()
        torch.testing.assert_close(got, addmm(k, beta)("cpu"))


def test_integer_division_by_a_python_bool_with_a_rounding_mode():
    """`div(int_tensor, True, rounding_mode=...)` failed inside the lowering (seed 5859)."""
    for rounding in ("trunc", "floor"):
        check_all_modes(lambda d, r=rounding: torch.div(torch.tensor([[3, -5, 0], [7, 2, -1]], device=d).t(), True,
                                                        rounding_mode=r))


@pytest.mark.parametrize("value", [2 + 0j, -1.5, 2 ** 40 + 0.5])
def test_integer_addcmul_converts_value_and_stays_integer(value):
    """A complex `value` failed in the lowering (seed 6177); a float one made the product
    float32, which rounded int64 values past 2^24."""
    def run(d):
        a = torch.tensor([-5, 1, 3], device=d)
        b = torch.arange(12, device=d).view(3, 4)[:, ::2] - 5
        b.addcmul_(torch.full((1, 1), 3, device=d), torch.full((1, 1), -2, device=d), value=value)
        return torch.addcmul(a, a, a, value=value), b
    check_all_modes(run, rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_index_add_converts_alpha_only_where_cpu_does(mode):
    """CPU's kernel returns before converting alpha when self has more than one dim and the index
    or self is empty, so a complex alpha for a real tensor raises only otherwise (seeds 7404,
    9063, 9117)."""
    def index_add(shape, n, source, dtype):
        def run(d):
            a = torch.zeros(shape, dtype=dtype, device=d)
            return a.index_add(0, torch.zeros(n, dtype=torch.int64, device=d),
                               torch.ones(source, dtype=dtype, device=d), alpha=-1 + 0.5j)
        return run
    for dtype in (torch.int64, torch.float32):
        for shape, n, source in (((2, 3), 0, (0, 3)), ((2, 0), 2, (2, 0))):
            with deferfuse.mode(mode):
                got = index_add(shape, n, source, dtype)("tpu").cpu()
            torch.testing.assert_close(got, index_add(shape, n, source, dtype)("cpu"))
        for shape, n, source in (((3,), 0, (0,)), ((3,), 1, (1,)), ((2, 3), 2, (2, 3))):
            check_raises_like_cpu(index_add(shape, n, source, dtype), mode)
