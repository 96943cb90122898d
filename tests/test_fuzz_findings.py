"""Disagreements with CPU PyTorch that the differential fuzzer (tests/fuzz/) found, each fixed at
its root and checked here in every mode (issue 31)."""
from __future__ import annotations

import itertools

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


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 3, 2), (0, 3)])
def test_nonzero_is_column_major_like_cpu(shape):
    """CPU's nonzero (and argwhere) returns strides (1, n); tpu returned (ndim, 1)."""
    base = (torch.arange(max(1, torch.Size(shape).numel())) % 3).reshape(-1)[: torch.Size(shape).numel()]
    x_cpu = base.reshape(shape) if shape else torch.tensor(1)
    expected = [x_cpu.nonzero(), torch.argwhere(x_cpu)]
    for mode in MODES:
        with deferfuse.mode(mode):
            x = x_cpu.to("tpu")
            got = [x.nonzero(), torch.argwhere(x)]
            for g, e in zip(got, expected):
                assert g.shape == e.shape
                if e.numel():
                    assert g.stride() == e.stride(), (mode, g.stride(), e.stride())
                torch.testing.assert_close(g.cpu(), e)
            for g, e in zip(x.nonzero(as_tuple=True), x_cpu.nonzero(as_tuple=True)):
                torch.testing.assert_close(g.cpu(), e)


def _index_add_wrong_source(d):
    x = torch.zeros(3, 2).to(d)
    x.index_add_(0, torch.tensor([0, 1]).to(d), torch.ones(2, 3).to(d))
    return x


_BAD_SHAPES = {
    "index_add_ source": _index_add_wrong_source,
    "index_add source": lambda d: torch.zeros(3, 2).to(d).index_add(0, torch.tensor([0, 1]).to(d), torch.ones(2, 3).to(d)),
    "index_add 0-dim": lambda d: torch.zeros(()).to(d).index_add(0, torch.tensor([0]).to(d), torch.ones(2).to(d)),
    "index_put_ value": lambda d: torch.zeros(3, 2).to(d).index_put_((torch.tensor([0, 1]).to(d),),
                                                                      torch.ones(2, 3).to(d)),
    "index_put accumulate": lambda d: torch.zeros(3, 2).to(d).index_put_((torch.tensor([0, 1]).to(d),),
                                                                          torch.ones(2, 3).to(d), accumulate=True),
    "index_select 2-dim index": lambda d: torch.zeros(3, 2).to(d).index_select(0, torch.zeros(2, 2, dtype=torch.long).to(d)),
    "put_ source": lambda d: torch.zeros(3, 2).to(d).put_(torch.zeros(2, 2, dtype=torch.long).to(d), torch.ones(3).to(d)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(_BAD_SHAPES))
def test_a_wrong_shape_raises_cpus_error_at_the_call(case, mode):
    """PyTorch's meta kernels of these ops let the shapes through: DeferAndFuse raised a
    FlushError at the next flush, Strict and Debug JAX's message. A CPU rehearsal of the call on
    stand-ins of its real shapes now raises CPU's own error, once per signature."""
    check_raises_like_cpu(_BAD_SHAPES[case], mode)


@pytest.mark.parametrize("mode", MODES)
def test_the_same_ops_with_the_right_shapes_still_run(mode):
    def run(d):
        x = torch.zeros(3, 2).to(d)
        i = torch.tensor([0, 2]).to(d)
        x.index_add_(0, i, torch.ones(2, 2).to(d))
        y = torch.zeros(4).to(d).index_add(0, torch.tensor([3, 3]).to(d), torch.ones(2).to(d))  # the last row
        z = torch.zeros(3, 2).to(d).index_put_((i,), torch.ones(2).to(d), accumulate=True)
        w = torch.zeros(3, 2).to(d)
        w.put_(torch.tensor([5, 0]).to(d), torch.tensor([1.0, 2.0]).to(d))
        return x, y, z, w, x.index_select(1, torch.tensor([1]).to(d))

    check_all_modes(run)


_EMPTY_REDUCTIONS = {
    "max": lambda x: x.max(),
    "amax": lambda x: x.amax(),
    "argmax": lambda x: x.argmax(),
    "max dim 0": lambda x: x.max(0),
    "amin dim 0": lambda x: x.amin(0),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", sorted(_EMPTY_REDUCTIONS))
def test_a_reduction_of_nothing_without_identity_raises_like_cpu(call, mode):
    """XLA has no identity for max of nothing: a FlushError (JAX's zero-size ValueError)."""
    check_raises_like_cpu(lambda d: _EMPTY_REDUCTIONS[call](torch.zeros(0, 3).to(d)), mode)


@pytest.mark.parametrize("mode", MODES)
def test_reductions_of_nothing_with_an_identity_or_a_dim_still_run(mode):
    check_all_modes(lambda d: (torch.zeros(0, 3).to(d).sum(), torch.zeros(0, 3).to(d).amax(1),
                               torch.zeros(0, 3).to(d).max(1).values, torch.zeros(0, 3).to(d).prod(0)))


def _overlapping(d):
    return torch.arange(4.0).to(d).as_strided((3, 2), (1, 1))  # elements share memory


_FILLS = {
    "fill_": lambda x: x.fill_(2),
    "zero_": lambda x: x.zero_(),
    "setitem number": lambda x: x.__setitem__(Ellipsis, 2.0),
    "copy_ number": lambda x: x.copy_(-1),
    "copy_ 0-dim": lambda x: x.copy_(torch.tensor(3.0).to(x.device)),
    "fill_ unfold": lambda x: x.flatten().unfold(0, 2, 1).fill_(5),
    "fill_ expanded": lambda x: x[0].expand(3, 2).fill_(5),
    "zero_ expanded": lambda x: x[1].expand(2, 2).zero_(),
}


@pytest.mark.parametrize("call", sorted(_FILLS))
def test_a_fill_of_a_view_whose_elements_share_memory_writes_like_cpu(call):
    """One value written everywhere is well defined where elements alias: CPU writes it (fill_
    even into an expanded view); tpu refused with 'more than one element ... refers to a single
    memory location', or failed at the flush."""
    def run(d):
        x = _overlapping(d)
        _FILLS[call](x)
        return x, x._base if x._base is not None else x

    check_all_modes(run)


@pytest.mark.parametrize("mode", MODES)
def test_other_writes_into_an_expanded_view_still_raise_like_cpu(mode):
    check_raises_like_cpu(lambda d: torch.zeros(3).to(d).expand(2, 3).add_(1), mode)
    check_raises_like_cpu(lambda d: torch.zeros(3).to(d).expand(2, 3).copy_(torch.ones(2, 3).to(d)), mode)


def test_index_fill_and_index_copy_of_no_index_into_a_0_dim_tensor_change_nothing():
    """The 0-dim lowering wrote the value whatever the index: a wrong number, silently."""
    def run(d):
        none = torch.tensor([], dtype=torch.int64).to(d)
        one = torch.tensor([0]).to(d)
        x = torch.tensor(3.0).to(d)
        return (x.index_fill(0, none, 0.25), x.index_fill(0, one, 0.25), x.index_copy(0, none, torch.ones(0).to(d)),
                x.index_copy(0, one, torch.tensor([7.0]).to(d)))

    check_all_modes(run)


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


@pytest.mark.parametrize("mode", MODES)
def test_a_composite_op_refused_by_an_inner_op_raises_cpus_error(mode):
    """stack of a 3-dim and a 2-dim tensor: its expansion's unsqueeze raised IndexError, CPU a
    RuntimeError naming the sizes."""
    check_raises_like_cpu(lambda d: torch.stack([torch.zeros(2, 3, 3).to(d), torch.zeros(1, 3).to(d)], -1), mode)


def test_one_hot_of_a_transposed_tensor_is_contiguous_like_cpu():
    x_cpu = torch.tensor([[0, 1, 2], [2, 1, 0]]).t()
    expected = torch.nn.functional.one_hot(x_cpu, 3)
    for mode in MODES:
        with deferfuse.mode(mode):
            got = torch.nn.functional.one_hot(x_cpu.to("tpu"), 3)
            assert got.stride() == expected.stride(), mode
            torch.testing.assert_close(got.cpu(), expected)


def test_a_write_into_an_empty_expanded_view_writes_nothing_like_cpu():
    def run(d):
        x = torch.zeros(1, 0).to(d)
        x.expand(2, 0).copy_(torch.ones(2, 0).to(d))
        return x

    check_all_modes(run)


def test_nan_to_num_of_complex_and_bfloat16_like_cpu():
    """PyTorch's decomposition refused complex inputs (isneginf): RuntimeError where CPU runs."""
    vals = [float("nan"), float("inf"), -float("inf"), 1.5]

    def run(d):
        x = torch.tensor(vals).to(d)
        return (torch.nan_to_num(x.to(torch.complex64) * (1 + 1j)), torch.nan_to_num(x.to(torch.bfloat16)),
                torch.nan_to_num(x, 1.0, 2.0, -3.0), x.double().nan_to_num_(posinf=5.0))

    check_all_modes(run)


_SELF_AS_SOURCE = {
    "scatter_": lambda x, i: x.scatter_(0, i, x),
    "scatter_add_": lambda x, i: x.scatter_add_(0, i, x),
    "scatter_reduce_": lambda x, i: x.scatter_reduce_(0, i, x, "sum"),
    "index_add_": lambda x, i: x.index_add_(0, i, x),
    "index_copy_": lambda x, i: x.index_copy_(0, i, x),
    "put_": lambda x, i: x.put_(i, x),
    "index_add_ of a part": lambda x, i: x.index_add_(0, i[:2], x[1:]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", sorted(_SELF_AS_SOURCE))
def test_a_scatter_whose_source_is_its_target_raises_like_cpu(call, mode):
    """CPU refuses a source sharing elements with the target; tpu computed as if it were cloned."""
    check_raises_like_cpu(lambda d: _SELF_AS_SOURCE[call](torch.ones(3).to(d), torch.tensor([0, 1, 2]).to(d)), mode)


def test_floor_division_of_a_transposed_tensor_keeps_its_layout_like_cpu():
    """floor_divide's meta kernel returns a contiguous result where CPU's follows its inputs."""
    a_cpu, b_cpu = torch.arange(9.0).reshape(3, 3).t(), torch.full((3, 3), 2.0)
    calls = [lambda a, b: a // b, lambda a, b: torch.div(a, b, rounding_mode="floor"),
             lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda a, b: a // 2]
    for mode in MODES:
        with deferfuse.mode(mode):
            for call in calls:
                got, expected = call(a_cpu.to("tpu"), b_cpu.to("tpu")), call(a_cpu, b_cpu)
                assert got.stride() == expected.stride(), mode
                torch.testing.assert_close(got.cpu(), expected)


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


def test_setitem_of_a_tensor_from_its_own_zero_dim_value_like_cpu():
    """Seed 20004: `a.view(1, 1)[...] = a` works on CPU (a 0-dim CPU value is written with fill_,
    which makes no overlap check); tpu raised the partial-overlap error of copy_."""
    def run(d):
        a = torch.tensor(3.0, device=d)
        a.view(1, 1)[...] = a
        b = torch.arange(4.0, device=d)
        b[:2] = b[3]
        b[2:] = b[0] + 1
        return a, b
    check_all_modes(run)


@pytest.mark.parametrize("mode", MODES)
def test_copy_from_a_partially_overlapping_view_still_raises_like_cpu(mode):
    a_cpu = torch.zeros(1, 1)
    with pytest.raises(RuntimeError, match="single memory location"):
        a_cpu.view(1, 1).copy_(a_cpu.view(()))
    with deferfuse.mode(mode), pytest.raises(RuntimeError, match="single memory location"):
        a = torch.zeros(1, 1, device="tpu")
        a.view(1, 1).copy_(a.view(()))


@pytest.mark.tpu_tolerance(times=24, why="xlogy's XLA:TPU float32 log, measured at 8 times per element "
                                         "(docs/testing.md); on the chip at 1b49775, 2.5e-4 absolute on 5.38, "
                                         "15.9 times. This test checks layouts")
def test_copysign_and_xlogy_lay_out_their_result_like_cpu():
    """Seed 20052: their meta kernels took the second operand's layout, CPU the first's."""
    a_cpu, b_cpu = torch.arange(1.0, 7.0).reshape(2, 3), torch.arange(2.0, 8.0).reshape(3, 2).t()
    for mode in MODES:
        with deferfuse.mode(mode):
            for x, y in ((a_cpu, b_cpu), (b_cpu, a_cpu)):
                for call in (torch.copysign, torch.xlogy):
                    got, expected = call(x.to("tpu"), y.to("tpu")), call(x, y)
                    assert got.stride() == expected.stride(), (mode, call)
                    torch.testing.assert_close(got.cpu(), expected)


def test_debug_integer_division_of_nothing_by_zero_runs_like_cpu():
    """Seed 20062: `torch.arange(0) // 0` divides nothing, and CPU raises nothing."""
    with deferfuse.mode("debug"):
        assert torch.arange(0, device="tpu").floor_divide(0).cpu().shape == (0,)
        assert torch.fmod(torch.zeros(0, 3, dtype=torch.long, device="tpu"), torch.zeros(3, dtype=torch.long, device="tpu")).shape == (0, 3)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            torch.arange(3, device="tpu") // 0


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


def test_true_division_of_bools_by_a_false_gives_cpus_nans():
    """Seed 488: div's rounding_mode=None overload let jnp convert the bools, and XLA folded
    `convert(False) / 0` to 0 where CPU gives NaN."""
    check_all_modes(lambda d: (torch.div(torch.zeros(2, 3, dtype=torch.bool, device=d), False, rounding_mode=None),
                               torch.div(torch.tensor([True, False], device=d), torch.zeros((), dtype=torch.bool, device=d),
                                         rounding_mode=None),
                               torch.div(torch.tensor([3, 0], device=d), 0, rounding_mode=None)), equal_nan=True)


@pytest.mark.parametrize("mode", MODES)
def test_a_scatter_into_its_own_source_with_a_bad_dim_raises_cpus_index_error(mode):
    """Seed 634: CPU checks the dim before the overlap of target and source."""
    def call(d):
        v = torch.tensor(2.0, device=d)
        return v[None].scatter_add_(1, torch.tensor([[1, 4]], device=d), v)
    check_raises_like_cpu(call, mode)


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


def test_an_elementwise_result_cpus_kernel_types_keeps_its_inputs_layout():
    """Seed 908: `transposed_bool << 1` (int64 on CPU, refused by the meta kernel) was laid out
    contiguously; CPU's TensorIterator follows the input."""
    for mode in MODES:
        with deferfuse.mode(mode):
            x = torch.tensor([[True, False, True], [False, True, True]]).t()
            got = x.to("tpu") << 1
            assert got.stride() == (x << 1).stride() and got.dtype == torch.int64, mode
            torch.testing.assert_close(got.cpu(), x << 1)


def test_a_scatter_from_a_sparse_view_of_its_own_target_runs_like_cpu():
    """Seed 910: CPU's overlap check lets another view that is not dense through (too hard to
    judge); the very same tensor it refuses."""
    def run(d):
        v = torch.arange(1.0, 13.0, device=d).reshape(3, 4)[:, ::2][::2]
        v.scatter_add_(1, torch.tensor([[0, 1], [0, 1]], device=d), v[:])
        return v
    check_all_modes(run)
    for mode in MODES:
        check_raises_like_cpu(lambda d: (lambda v: v.scatter_add_(1, torch.tensor([[0, 1]], device=d), v))(
            torch.arange(1.0, 13.0, device=d).reshape(3, 4)[:, ::2][::2]), mode)


def test_debug_index_writes_into_an_empty_tensor_check_no_index_like_cpu():
    """Seed 1256: CPU's index_add_/index_copy_/index_fill_ into a tensor of no elements check no index."""
    with deferfuse.mode("debug"):
        x = torch.zeros(1, 0, device="tpu")
        x.index_add_(0, torch.tensor([-1], device="tpu"), torch.zeros(1, 0, device="tpu"))
        x.index_copy_(0, torch.tensor([5], device="tpu"), torch.zeros(1, 0, device="tpu"))
        torch.zeros(2, 0, device="tpu").index_fill_(0, torch.tensor([5], device="tpu"), 1.0)
        with pytest.raises(RuntimeError, match="out of bounds"):  # CPU's type and words
            torch.zeros(1, 2, device="tpu").index_add_(0, torch.tensor([-2], device="tpu"), torch.zeros(1, 2, device="tpu"))


@pytest.mark.parametrize("mode", MODES)
def test_softmax_over_a_dim_out_of_range_raises_like_cpu(mode):
    """Seed 1812: the meta kernels wrapped the dim."""
    check_raises_like_cpu(lambda d: torch.softmax(torch.ones(3, device=d), 2), mode)
    check_raises_like_cpu(lambda d: torch.log_softmax(torch.ones(3, device=d), -2), mode)


def test_a_fallback_whose_meta_kernel_lays_out_unlike_cpu_is_never_recorded():
    """Seed 1449: angle of a transposed complex tensor runs on CPU (contiguous result); its meta
    kernel follows the input. The first call ran at once and later ones were recorded with the
    meta kernel's layout, so calls disagreed with each other and with CPU."""
    a = torch.tensor([[1 + 1j, 2, 3], [4, 5j, 6], [7, 8, 9]]).t()
    for mode in MODES:
        with deferfuse.mode(mode):
            for _ in range(3):
                got = a.to("tpu").angle()
                assert got.stride() == a.angle().stride(), mode
                torch.testing.assert_close(got.cpu(), a.angle())


def test_a_python_number_to_tensor_powers_like_cpu():
    """Seed 3357: `False ** float_tensor` took the bool rule (0) where CPU computes 0.0 ** y
    (inf for a negative y)."""
    def run(d):
        y = torch.tensor([-1.5, 0.0, 2.0, -2.0], device=d)
        return False ** y, True ** y, 0 ** y, 2 ** torch.tensor([-1, 0, 3], device=d), False ** torch.tensor([1, 0], device=d)
    check_all_modes(run, equal_nan=True)


def test_addcmul_of_integer_tensors_converts_its_value_first_like_cpu():
    """Seed 4050: CPU converts `value` to the integer type (-1.5 is -1) before multiplying."""
    check_all_modes(lambda d: (torch.addcmul(torch.tensor([3, -3], device=d), torch.tensor(2, device=d),
                                             torch.tensor(1, device=d), value=-1.5),
                               torch.addcmul(torch.tensor([3.0, -3.0], device=d), torch.tensor(2.0, device=d),
                                             torch.tensor(1.0, device=d), value=-1.5)))


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


@pytest.mark.parametrize("mode", MODES)
def test_integer_division_by_zero_after_a_nonzero_number_raises_like_cpu(mode):
    """A call's CPU rehearsal runs once per signature and a number's value is not part of it, so
    `x // 2` (or `x // True`) made a later `x // 0` return a value instead of CPU's error."""
    def after_two(call):
        def run(d):
            x = torch.tensor([7, -7], device=d)
            call(x, 2)
            return call(x, 0)
        return run
    for call in (lambda x, k: x // k, lambda x, k: x % k, lambda x, k: torch.fmod(x, k),
                 lambda x, k: x.clone().floor_divide_(k)):
        check_raises_like_cpu(after_two(call), mode)


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


@pytest.mark.parametrize("mode", MODES)
def test_index_fill_of_a_strided_tensor_is_laid_out_like_cpu(mode):
    """CPU fills a clone laid out as self is; the meta kernel says row-major (seed 4669)."""
    x = torch.arange(12.0).view(3, 4)[:, ::2]
    for src in (x, x.t()):
        expected = src.index_fill(0, torch.tensor([0, 0]), 3.0)
        with deferfuse.mode(mode):
            got = src.to("tpu").index_fill(0, torch.tensor([0, 0], device="tpu"), 3.0)
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got.cpu(), expected)


def test_integer_division_by_a_python_bool_with_a_rounding_mode():
    """`div(int_tensor, True, rounding_mode=...)` failed inside the lowering (seed 5859)."""
    for rounding in ("trunc", "floor"):
        check_all_modes(lambda d, r=rounding: torch.div(torch.tensor([[3, -5, 0], [7, 2, -1]], device=d).t(), True,
                                                        rounding_mode=r))


@pytest.mark.parametrize("mode", MODES)
def test_roll_of_an_empty_tensor_ignores_its_dims_like_cpu(mode):
    """CPU returns a clone of an empty tensor before looking at roll's dims (seed 5860)."""
    with deferfuse.mode(mode):
        got = torch.empty(0, 3, device="tpu").roll(1, 3)
        assert got.shape == (0, 3)
    check_raises_like_cpu(lambda d: torch.empty(0, 3, device=d).roll([1, 2], [0]), mode)  # still CPU's checks
    check_raises_like_cpu(lambda d: torch.ones(2, 3, device=d).roll(1, 3), mode)


@pytest.mark.parametrize("mode", MODES)
def test_complex_clamp_in_place_over_itself_raises_cpus_error(mode):
    """CPU refuses a complex clamp_ before it looks at the overlap of its operands (seed 5158);
    other in-place ops report the overlap first."""
    def clamp(d):
        a = torch.tensor(1 + 2j, device=d)
        a.unsqueeze(0).clamp_(min=a)

    def lt(d):
        a = torch.tensor([1 + 2j, 3j, 1j], device=d)
        a[:2].lt_(a[1:])
    assert type(check_raises_like_cpu(clamp, mode)) is NotImplementedError
    check_raises_like_cpu(lt, mode)


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


@pytest.mark.parametrize("mode", MODES)
def test_a_number_to_tensor_powers_is_row_major_like_cpu(mode):
    """CPU lays `number ** tensor` out row-major whatever the exponent's layout (seeds 8582, 9231)."""
    for e in (torch.arange(9).view(3, 3).t(), torch.arange(12.0).view(3, 4)[:, ::2],
              torch.arange(24.0).view(1, 2, 3, 4).permute(0, 2, 3, 1)):
        for base in (0, 2, 0.5, True):
            expected = base ** e
            with deferfuse.mode(mode):
                got = base ** e.to("tpu")
                assert got.stride() == expected.stride()
                torch.testing.assert_close(got.cpu(), expected)


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
