"""Loss functions at their edges, against CPU in every mode."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from deferfuse.config import CONFIG
from conftest import MODES, check_all_modes, check_raises_like_cpu


@pytest.mark.tpu_tolerance(times=8, why="log_softmax on XLA:TPU (2.7 times per element, docs/testing.md): 2.7e-5 "
                                        "absolute measured, 2.4 times; weighted, ignoring a target, 8.2e-5 on "
                                        "4.675 at 1b49775, 5.1 times")
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


def test_multilabel_margin_loss_stops_at_the_first_minus_one():
    """Targets after a sample's first -1 are not targets (PyTorch 2.13's decomposition counted
    them: 2.6 where CPU gives 0.8). Its backward runs CPU's kernel through the fallback."""
    def run(d):
        out = []
        x = torch.tensor([[0.1, 0.2, 0.4, 0.8, -0.3], [0.5, -0.1, 0.3, 0.0, 0.2]]).to(d).requires_grad_()
        y = torch.tensor([[0, 3, -1, -1, -1], [1, 2, -1, 0, 4]]).to(d)
        for reduction in ("mean", "sum", "none"):
            loss = F.multilabel_margin_loss(x, y, reduction=reduction)
            loss.sum().backward()
            out += [loss.detach(), x.grad.clone()]
            x.grad = None
        x1, y1 = torch.tensor([0.1, 0.2, 0.4, 0.8]).to(d), torch.tensor([3, 0, -1, 1]).to(d)
        return out + [F.multilabel_margin_loss(x1, y1), F.multilabel_margin_loss(x1, y1, reduction="none"),
                      *torch.ops.aten.multilabel_margin_loss_forward.default(x.detach(), y, 1)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the backward's CPU fallback warns
        check_all_modes(run)


_REFUSED_BY_META = {
    # the meta kernels' own wording ("Invalid channel dimensions") and a decomposition's `assert`
    # (an AssertionError) where CPU raises a RuntimeError saying what it expected
    "conv2d wrong channels": lambda d: torch.nn.functional.conv2d(torch.zeros(1, 2, 5, 5, device=d),
                                                                  torch.zeros(4, 3, 3, 3, device=d)),
    "cross_entropy 2-D target of another width": lambda d: torch.nn.functional.cross_entropy(
        torch.zeros(3, 5, device=d), torch.rand(3, 4).to(d)),
}


@pytest.mark.parametrize("case", sorted(_REFUSED_BY_META))
@pytest.mark.parametrize("mode", MODES)
def test_calls_the_meta_kernel_refuses_raise_cpus_error(case, mode):
    check_raises_like_cpu(_REFUSED_BY_META[case], mode)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("lengths", ["cpu tensors", "tpu tensors", "tuples"])
def test_ctc_loss_takes_its_lengths_as_cuda_code_passes_them(lengths, reduction):
    """CPU tensors for the lengths (as cuDNN wants them) raised a device mismatch: PyTorch's
    composite divides the loss by them."""
    torch.manual_seed(0)
    logits = torch.randn(6, 2, 5)
    targets = torch.tensor([[1, 2, 3], [2, 4, 4]])

    def run(d):
        x = logits.detach().to(d).requires_grad_()
        il, tl = torch.tensor([6, 5]), torch.tensor([3, 2])
        if lengths == "tpu tensors":
            il, tl = il.to(d), tl.to(d)
        elif lengths == "tuples":
            il, tl = tuple(il.tolist()), tuple(tl.tolist())
        loss = F.ctc_loss(x.log_softmax(2), targets.to(d), il, tl, reduction=reduction)
        loss.backward()
        return [loss, x.grad]

    check_all_modes(run)


@pytest.mark.parametrize("mode", MODES)
def test_class_targets_must_be_int64_like_cpu(mode):
    """An int32 target ran where CPU raises 'expected target dtype to be Long or Byte'."""
    x, t = torch.randn(3, 5), torch.tensor([1, 2, 3], dtype=torch.int32)
    check_raises_like_cpu(lambda d: F.cross_entropy(x.to(d), t.to(d)), mode)
