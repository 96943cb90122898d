"""torch.autocast("tpu"): CUDA's autocast policy (autocast.py), checked against CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes

BF16_TOL = dict(rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_each_policy_gives_cudas_dtypes(mode):
    x = torch.randn(4, 8, device="tpu")
    w = torch.randn(8, 8, device="tpu")
    with deferfuse.mode(mode), torch.autocast("tpu", dtype=torch.bfloat16):
        h = x @ w  # lower precision
        assert h.dtype == torch.bfloat16
        assert F.linear(x, w).dtype == torch.bfloat16
        assert torch.relu(h).dtype == torch.bfloat16  # on no list: untouched
        assert torch.relu(x).dtype == torch.float32
        assert torch.softmax(h, -1).dtype == torch.float32  # float32 list
        assert F.layer_norm(h, (8,)).dtype == torch.float32
        assert h.exp().dtype == torch.float32 and h.sum().dtype == torch.float32
        assert torch.cat([h, x]).dtype == torch.float32  # promote: the widest
        assert torch.cat([h, h.half()]).dtype == torch.float32  # float16 with bfloat16: float32
        assert (x.double() @ w.double()).dtype == torch.float64  # float64 is never cast
    with deferfuse.mode(mode), torch.autocast("tpu", dtype=torch.float16):
        assert (x @ w).dtype == torch.float16
    assert (x @ w).dtype == torch.float32  # outside the block


def test_matmul_in_lower_precision_matches_cpu_with_the_same_casts():
    def run(d):
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*s, generator=g).to(d) for s in ((4, 8), (6, 8), (6,)))
        if d == "cpu":
            return F.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()), torch.softmax(x.bfloat16().float(), -1)
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return F.linear(x, w, b), torch.softmax(x.bfloat16(), -1)

    check_all_modes(run, **BF16_TOL)


def test_training_step_matches_cpu_autocast():
    """A Linear/ReLU/MSE step, whose ops CPU autocast treats as CUDA's does: the forward in
    bfloat16, the loss in float32, and the gradients in the parameters' float32."""
    def run(d):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(d)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        out = []
        for _ in range(2):
            x, y = torch.randn(5, 8, generator=g).to(d), torch.randn(5, 4, generator=g).to(d)
            with torch.autocast(d, dtype=torch.bfloat16):
                pred = model(x)
                loss = F.mse_loss(pred, y)
            assert pred.dtype == torch.bfloat16 and loss.dtype == torch.float32
            loss.backward()
            out += [loss] + [p.grad.clone() for p in model.parameters()]
            assert all(p.grad.dtype == torch.float32 for p in model.parameters())
            opt.step()
            opt.zero_grad()
        return out

    check_all_modes(run, **BF16_TOL)
