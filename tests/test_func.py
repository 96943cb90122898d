"""torch.func transforms over tpu tensors, and the ones deferfuse refuses rather than get wrong."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import deferfuse
from conftest import MODES


@pytest.mark.parametrize("mode", MODES)
def test_linearize_refuses_tpu_tensors(mode):
    """make_fx runs tpu ops below its tracer, so their results became constants of the graph:
    linearize's jvp_fn returned the same (wrong) tangent for every input."""
    x = torch.tensor([0.5, -1.0, 2.0]).to("tpu")
    with deferfuse.mode(mode):
        with pytest.raises(NotImplementedError, match="make_fx cannot trace tpu tensors"):
            torch.func.linearize(torch.sin, x)


def test_make_fx_on_cpu_is_untouched():
    gm = make_fx(lambda x: x.sin() * 2)(torch.ones(3))
    torch.testing.assert_close(gm(torch.zeros(3)), torch.zeros(3))
    _, jvp_fn = torch.func.linearize(torch.sin, torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(jvp_fn(torch.ones(2)), torch.tensor([0.5, 1.0]).cos())
