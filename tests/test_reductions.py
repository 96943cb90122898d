"""Reductions at their edges, against CPU in every mode."""
import pytest
import torch

import deferfuse
from conftest import MODES, check_all_modes, check_raises_like_cpu


@pytest.mark.parametrize("correction", [0, 1, 2, 3, 4, 0.5])
def test_var_and_std_divide_by_n_minus_correction_clamped_at_zero(correction, monkeypatch):
    """Once the correction reaches N, PyTorch divides by zero: inf, or NaN for a constant row
    (jnp.var gave NaN everywhere)."""
    from deferfuse.config import CONFIG

    monkeypatch.setattr(CONFIG, "debug_nan_check", False)  # inf and NaN are the expected results
    x = torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, 5.0]])
    z = torch.complex(x, x.flip(1))

    def run(d):
        t, c = x.to(d), z.to(d)
        return [t.var(correction=correction), t.var(1, correction=correction), t.std(0, correction=correction),
                *torch.var_mean(t, 1, correction=correction), *torch.std_mean(t, 1, correction=correction, keepdim=True),
                c.var(1, correction=correction)]

    check_all_modes(run, equal_nan=True)


_CPU_REJECTS = {
    "std of integers": lambda d: torch.tensor([1, 2, 4]).to(d).std(),
    "var of integers over a dim": lambda d: torch.tensor([[1, 2], [4, 5]]).to(d).var(1),
    "argmax of bool": lambda d: torch.tensor([True, False]).to(d).argmax(),
    "softmax of integers": lambda d: torch.softmax(torch.tensor([1, 2]).to(d), 0),
    # tpu ran these (CPU has no bool topk or kthvalue kernel)
    "topk of bool": lambda d: torch.tensor([[True, False, True]]).to(d).topk(2),
    "kthvalue of bool": lambda d: torch.tensor([[True, False, True]]).to(d).kthvalue(1),
}


@pytest.mark.parametrize("case", sorted(_CPU_REJECTS))
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_reductions_cpu_rejects_raise_cpus_error(case, mode):
    """Integer std and softmax returned integer results; CPU has no such kernels."""
    check_raises_like_cpu(_CPU_REJECTS[case], mode)


def test_integer_and_bool_reductions_still_run():
    def run(d):
        i, b = torch.tensor([[1, 5], [4, 2]]).to(d), torch.tensor([[True, False], [True, True]]).to(d)
        return [i.sum(1), b.sum(), i.mean(dtype=torch.float32), i.amax((0, 1)), i.cumsum(0), i.max(1)[1],
                b.any(1), b.all(), i.argmin(), i.prod(0)]

    check_all_modes(run)


@pytest.mark.parametrize("values,bins,lo,hi", [
    ([0.0, 1, 2, 3, 3, 5, -1], 4, 0, 3),  # outside the range dropped, max in the last bin
    ([1.0, 1.0], 4, 0, 0),  # min == max: the data's range, one value widened by one
    ("randn", 7, -1, 1),
    ("randn", 10, 0, 0),
    ([], 3, 0, 0),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histc_matches_cpu(values, bins, lo, hi, dtype):
    x = torch.randn(100, generator=torch.Generator().manual_seed(0)) if values == "randn" else torch.tensor(values)
    check_all_modes(lambda d: torch.histc(x.to(d, dtype), bins, lo, hi), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("values,bins,lo,hi", [("outside", 4, 0, 3), ("experts", 8, 0, 7), ("spread", 5, 0, 0),
                                               ("one_value", 4, 0, 0)])
def test_histc_of_integers_counts_as_cuda_does(values, bins, lo, hi, dtype):
    """CUDA bins integer tensors (CPU refuses them); transformers' MoE layers count the tokens
    routed to each expert with an int32 histc on every device but CPU. CUDA's integer rule agrees
    with CPU's float one on these values, which is the reference."""
    g = torch.Generator().manual_seed(0)
    x = {"outside": torch.tensor([0, 1, 2, 3, 3, 1, 7]), "experts": torch.randint(0, 8, (40,), generator=g),
         "spread": torch.randint(-5, 9, (40,), generator=g), "one_value": torch.tensor([3, 3, 3])}[values]
    want = torch.histc(x.double(), bins, lo, hi).to(dtype)
    for mode in MODES:
        with deferfuse.mode(mode):
            got = torch.histc(x.to("tpu", dtype), bins, lo, hi).cpu()
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lo,hi", [(3, 1), (0, float("inf")), (float("nan"), 1)])
def test_histc_refuses_a_bad_range_like_cpu(mode, lo, hi):
    check_raises_like_cpu(lambda d: torch.histc(torch.randn(5).to(d), 4, lo, hi), mode)
