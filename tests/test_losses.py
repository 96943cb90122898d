"""Loss functions at their edges, against CPU in every mode."""
import pytest
import torch
import torch.nn.functional as F

import deferfuse
from deferfuse.config import CONFIG
from conftest import MODES, check_all_modes


@pytest.mark.parametrize("targets", [[-100, -100], [1, -100], [0, 2]])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_and_cross_entropy_with_ignored_targets(targets, weighted, monkeypatch):
    """A micro-batch whose targets are all ignored has a NaN mean loss and zero gradients on CPU;
    the gradients were NaN and poisoned the parameters. (Debug's NaN check would stop at the NaN
    loss, as it should: it is off here to compare values.)"""
    monkeypatch.setattr(CONFIG, "debug_nan_check", False)
    def run(d):
        out = []
        w = torch.tensor([1.0, 0.5, 2.0]).to(d) if weighted else None
        t = torch.tensor(targets).to(d)
        for reduction in ("mean", "sum", "none"):
            x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0)).to(d).requires_grad_()
            loss = F.cross_entropy(x, t, weight=w, reduction=reduction)
            loss.sum().backward()
            out += [loss.detach(), x.grad]
        x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1)).to(d).requires_grad_()
        F.cross_entropy(x, torch.full((2, 4, 4), -100).to(d), weight=w).backward()
        return out + [x.grad]

    check_all_modes(run, equal_nan=True)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_nll_counted_rows_of_zero_total_weight_give_cpus_nan(mode):
    def run(d):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0)).to(d).requires_grad_()
        F.cross_entropy(x, torch.tensor([1, -100]).to(d), weight=torch.tensor([1.0, 0.0, 2.0]).to(d)).backward()
        return x.grad

    want = run("cpu")
    with deferfuse.mode(mode):
        got = run("tpu").cpu()
    torch.testing.assert_close(got, want, equal_nan=True)
