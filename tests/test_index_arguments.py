"""Index, mask, fill-value and alpha arguments that CPU's kernels check and PyTorch's meta kernels
do not: tpu ran, wrapped a number or failed at the flush where CPU raises at the call (or
converts), so each case here holds tpu to CPU's error or result, in the mode where it went wrong."""
from __future__ import annotations

import warnings

import pytest
import torch

import deferfuse
from conftest import MODES, check_all_modes, check_raises_like_cpu


@pytest.mark.parametrize("call", [
    lambda x, i: x[i],
    lambda x, i: x.__setitem__(i, 1.0),
    lambda x, i: x.index_put_((i,), torch.tensor(1.0).to(x.device)),
], ids=["getitem", "setitem", "index_put_"])
def test_float_index_tensors_raise_index_error_like_cpu(call):
    err = check_raises_like_cpu(lambda d: call(torch.zeros(3).to(d), torch.tensor([0.0, 1.0]).to(d)), "strict")
    assert isinstance(err, IndexError)


_FILLS = {
    "setitem 300 into int8": lambda d: torch.zeros(2, dtype=torch.int8).to(d).__setitem__(0, 300),
    "setitem 1e40 into float32": lambda d: torch.zeros(2).to(d).__setitem__(1, 1e40),
    "fill_ 400 into int8": lambda d: torch.zeros(2, dtype=torch.int8).to(d).fill_(400),
    "full 256 as uint8": lambda d: torch.full((2,), 256, dtype=torch.uint8, device=d),
    "full 1e40 as the default dtype": lambda d: torch.full((2,), 1e40, device=d),
    "full_like 1000 as int8": lambda d: torch.full_like(torch.zeros(2, dtype=torch.int8).to(d), 1000),
    "new_full 1000 as int8": lambda d: torch.zeros(2, dtype=torch.int8).to(d).new_full((3,), 1000),
}


@pytest.mark.parametrize("case", sorted(_FILLS))
def test_a_number_that_does_not_fit_the_dtype_raises_like_cpu(case):
    """XLA wrapped it (x[0] = 300 into int8 gave 44)."""
    assert isinstance(check_raises_like_cpu(_FILLS[case], "defer_and_fuse"), RuntimeError)


def test_numbers_that_fit_still_fill():
    def run(d):
        a, b = torch.zeros(2, dtype=torch.int8).to(d), torch.zeros(2).to(d)
        a[0] = -128
        b[1] = float("inf")
        return [a, b, torch.full((2,), 255, dtype=torch.uint8, device=d), torch.zeros(2, dtype=torch.int32).to(d).fill_(2.7),
                torch.full((2,), 3.5, device=d)]

    check_all_modes(run)


def _put(call: str, x, i, v):
    """x[i] = v through one of the three ways in."""
    if call == "setitem":
        x[i] = v
    elif call == "index_put_":
        x.index_put_((i,), v)
    else:
        x.index_put((i,), v)


@pytest.mark.parametrize("values", [torch.tensor([1.5, 2.5], dtype=torch.float64), torch.tensor(7)], ids=["f64", "i64"])
@pytest.mark.parametrize("call", ["setitem", "index_put_", "index_put"])
def test_index_put_of_another_dtype_raises_like_cpu(values, call):
    def run(d):
        x, i = torch.zeros(3, dtype=torch.int32).to(d), torch.tensor([0, 1]).to(d)
        _put(call, x, i, values.to(d) if values.dim() else values)

    assert isinstance(check_raises_like_cpu(run, "defer_and_fuse"), RuntimeError)


@pytest.mark.parametrize("value", [torch.tensor(2.5, dtype=torch.float64), torch.tensor([7]), torch.tensor(True),
                                   torch.tensor(-3.7)], ids=["f64", "i64 one element", "bool", "f32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_mask_put_of_one_value_of_any_dtype_fills_like_cpu(value, dtype):
    """x[mask] = v with a one-element v is CPU's masked_fill_, taken before the dtype check: v
    of any dtype fills, cast as a number (tpu raised the dtype error of other index_puts)."""
    def run(d):
        m = torch.tensor([True, False, True, False]).to(d)
        x = torch.arange(4).to(dtype).to(d)
        x[m] = value.to(d)
        y = torch.zeros(2, 3, dtype=dtype).to(d).index_put((m[:2],), value.to(d))
        return [x, y]

    check_all_modes(run)


@pytest.mark.parametrize("call", ["setitem", "index_put_", "index_put"])
def test_uint8_mask_with_one_value_raises_like_cpu(call):
    """CPU's masked_fill_ path refuses a uint8 mask; tpu assigned through it. With more values
    than one, CPU takes a uint8 mask (deprecated), and so does tpu."""
    def run(d):
        _put(call, torch.zeros(4).to(d), torch.tensor([1, 0, 1, 0], dtype=torch.uint8).to(d), torch.tensor(1.0).to(d))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "indexing with dtype torch.uint8 is now deprecated"
        assert isinstance(check_raises_like_cpu(run, "strict"), RuntimeError)

        def several(d):
            x = torch.zeros(4).to(d)
            x[torch.tensor([1, 0, 1, 0], dtype=torch.uint8).to(d)] = torch.tensor([5.0, 6.0]).to(d)
            return x

        check_all_modes(several)


_SOURCE_OF_ANOTHER_DTYPE = {
    "index_add": lambda x, i, s: x.index_add(0, i, s),
    "index_add_": lambda x, i, s: x.index_add_(0, i, s),
    "index_copy": lambda x, i, s: x.index_copy(0, i, s),
    "index_copy_": lambda x, i, s: x.index_copy_(0, i, s),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", sorted(_SOURCE_OF_ANOTHER_DTYPE))
def test_index_add_and_copy_of_a_source_of_another_dtype_raise_like_cpu(call, mode):
    """CPU wants the source in self's dtype; the meta kernels do not check, so tpu cast it and ran."""
    x_cpu = torch.zeros(3, 2)

    def run(d):
        x = x_cpu.to(d)
        _SOURCE_OF_ANOTHER_DTYPE[call](x, torch.tensor([0, 2]).to(d), torch.ones(2, 2, dtype=torch.int64).to(d))

    check_raises_like_cpu(run, mode)


_FLOAT_INDEX_CALLS = {
    "index_select": lambda d: torch.zeros(3).to(d).index_select(0, torch.tensor([0.0, 1.0]).to(d)),
    "gather": lambda d: torch.zeros(3).to(d).gather(0, torch.tensor([0.0, 1.0]).to(d)),
    "scatter": lambda d: torch.zeros(3).to(d).scatter(0, torch.tensor([0.0, 1.0]).to(d), torch.ones(2).to(d)),
    "index_add": lambda d: torch.zeros(3).to(d).index_add(0, torch.tensor([0.0, 1.0]).to(d), torch.ones(2).to(d)),
    "embedding_bag offsets": lambda d: torch.nn.functional.embedding_bag(
        torch.tensor([0, 1]).to(d), torch.zeros(3, 2).to(d), torch.tensor([0.0]).to(d)),
}


@pytest.mark.parametrize("case", sorted(_FLOAT_INDEX_CALLS))
def test_index_ops_given_a_float_index_raise_cpus_error_at_the_call(case):
    """They failed at the flush as FlushError (index_select, index_add), with another message
    (gather), or ran (embedding_bag with float offsets)."""
    check_raises_like_cpu(_FLOAT_INDEX_CALLS[case], "defer_and_fuse")


@pytest.mark.parametrize("alpha", [2.5, -2.7, 3])
def test_index_add_converts_alpha_to_an_integer_tensors_dtype_as_cpu_does(alpha):
    """CPU's kernel truncates a float alpha for integers (2.5 adds the source twice); PyTorch's
    meta kernel refused it, so tpu raised where CPU runs."""
    def run(d):
        x = torch.arange(8).reshape(4, 2).to(d)
        idx, src = torch.tensor([0, 2, 0]).to(d), torch.tensor([[3, 4], [5, 6], [7, 8]]).to(d)
        out = torch.empty_like(x)
        torch.index_add(x, 0, idx, src, alpha=alpha, out=out)
        y = x.clone()
        y.index_add_(0, idx, src, alpha=alpha)
        y.index_add_(0, idx, src, alpha=alpha + 0.6)  # the same signature: the in-place fast path
        return [x.index_add(0, idx, src, alpha=alpha), out, y]

    check_all_modes(run)


_ALPHAS_THAT_DO_NOT_FIT = {"300 on int8": (torch.int8, 300), "-1.5 on uint8": (torch.uint8, -1.5),
                           "1j on int64": (torch.int64, 1j)}


@pytest.mark.parametrize("case", sorted(_ALPHAS_THAT_DO_NOT_FIT))
@pytest.mark.parametrize("inplace", [False, True])
def test_index_add_given_an_alpha_the_tensor_cannot_hold_raises_like_cpu(case, inplace):
    dtype, alpha = _ALPHAS_THAT_DO_NOT_FIT[case]

    def run(d):
        x = torch.zeros(3, dtype=dtype).to(d)
        args = (0, torch.tensor([0, 1]).to(d), torch.ones(2, dtype=dtype).to(d))
        return x.index_add_(*args, alpha=alpha) if inplace else x.index_add(*args, alpha=alpha)

    check_raises_like_cpu(run, "defer_and_fuse")


_BAD_MASKS = {
    "3 on a dim of 2": lambda x, m: x[m[:3]],
    "1 on a dim of 2": lambda x, m: x[m[:1]],
    "2x2 on 2x3": lambda x, m: x[m[:4].view(2, 2)],
    "2 on the second dim": lambda x, m: x[:, m[:2]],
    "setitem 3 on a dim of 2": lambda x, m: x.__setitem__(m[:3], 0.0),
    "setitem tensor value": lambda x, m: x.__setitem__(m[:3], torch.zeros(2).to(x.device)),
}


@pytest.mark.parametrize("case", sorted(_BAD_MASKS))
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_mask_of_the_wrong_shape_raises_like_cpu(case, mode):
    """Its nonzero positions were taken as indices: the wrong rows came back, silently."""
    mask = torch.tensor([True, False, True, True, False, True])
    check_raises_like_cpu(lambda d: _BAD_MASKS[case](torch.arange(6.0).reshape(2, 3).to(d), mask.to(d)), mode)


@pytest.mark.parametrize("mode", MODES)
def test_masked_select_with_a_mask_that_does_not_broadcast_raises_like_cpu(mode):
    """JAX's ValueError and its wording came through; the inputs, pending ones too, stay usable."""
    def run(d):
        x = torch.arange(6.0).reshape(2, 3).to(d) * 2
        mask = torch.tensor([True, False, True]).to(d)
        with pytest.raises(RuntimeError) as err:
            torch.masked_select(x, mask[:2])
        return err.value, torch.masked_select(x, mask), x, mask

    cpu_err, *expected = run("cpu")
    with deferfuse.mode(mode):
        err, *got = run("tpu")
        got = [t.cpu() for t in got]
    assert type(err) is type(cpu_err) and str(err) == str(cpu_err)
    torch.testing.assert_close(got, expected)
