"""torch.nn.utils helpers that reach ops of their own: weight_norm's fused backward."""
import warnings

import pytest
import torch
from torch.nn.utils import parametrizations

from conftest import check_all_modes

import deferfuse


def _weight_norm_step(d, make, dim):
    torch.manual_seed(0)
    if dim == "old API":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            m = torch.nn.utils.weight_norm(make(), dim=None)
    else:
        m = parametrizations.weight_norm(make(), dim=dim)
    m = m.to(d)
    x = torch.randn(4, 3, 8, 8).to(d) if isinstance(m, torch.nn.Conv2d) else torch.randn(5, 6).to(d)
    (m(x) ** 2).sum().backward()
    return [p.grad for p in m.parameters()] + [m(x).detach()]


@pytest.mark.parametrize("layer", ["linear", "conv"])
@pytest.mark.parametrize("dim", [0, 1, None, "old API"])
def test_weight_norm_values_and_gradients(layer, dim):
    make = (lambda: torch.nn.Linear(6, 4)) if layer == "linear" else (lambda: torch.nn.Conv2d(3, 5, 3))
    check_all_modes(lambda d: _weight_norm_step(d, make, dim), rtol=1e-4, atol=1e-4)
    assert not deferfuse.metrics()["cpu_fallbacks"]  # _weight_norm_interface_backward is lowered
