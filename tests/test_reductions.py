"""Reductions at their edges, against CPU in every mode."""
import pytest
import torch

from conftest import check_all_modes


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
