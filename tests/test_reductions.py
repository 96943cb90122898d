"""Reductions at their edges, against CPU in every mode."""
import pytest
import torch

from conftest import check_all_modes, check_raises_like_cpu


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
