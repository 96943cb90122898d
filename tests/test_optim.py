"""Autograd and torch.optim (their foreach paths) on tpu match CPU."""
from __future__ import annotations

import pytest
import torch

import deferfuse
from conftest import MODES, check_all_modes, train_toy


_OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def _train(device, opt_name):
    losses = []

    def loss_of(out, t):
        losses.append(torch.nn.functional.cross_entropy(out, t))
        return losses[-1]

    model, _ = train_toy(device, lambda: [torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                          torch.nn.Linear(8, 3)], _OPTIMIZERS[opt_name], loss_of, clip=0.5)
    return [p.detach() for p in model.parameters()] + [losses[-1].detach()]


@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adamw"])
def test_optimizers_match_cpu(opt_name):
    check_all_modes(lambda d: _train(d, opt_name), rtol=1e-5, atol=1e-6)


def test_optimizers_take_the_foreach_path():
    p = torch.nn.Parameter(torch.ones(3, device="tpu"))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(3, device="tpu")
    deferfuse.events.start_collecting()
    try:
        with deferfuse.mode():
            opt.step()
            p.cpu()
        names = [n for e in deferfuse.events.events() if e["kind"] == "compile" for n in e["op_names"]]
    finally:
        deferfuse.events.stop_collecting()
    assert any(n.startswith("aten._foreach_") for n in names), names


def test_grad_on_tpu_and_backward_in_every_mode():
    for m in MODES:
        with deferfuse.mode(m):
            w = torch.tensor([1.0, 2.0, 3.0], device="tpu", requires_grad=True)
            (w * w).sum().backward()
            assert w.grad.device.type == "tpu"
            assert w.grad.cpu().tolist() == [2.0, 4.0, 6.0]


@pytest.mark.parametrize("mode", MODES)
def test_backward_through_parameters_a_foreach_step_changed_raises_like_cpu(mode):
    """The default (foreach) step changes every parameter in place; CPU's foreach kernels mark
    them modified, so backward through a graph that saved one raises instead of silently using
    the new weights (a GAN or retain_graph step in the wrong order)."""
    def run(d):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 4).to(d)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
        out = lin(lin(torch.randn(2, 4).to(d))).sum()
        out.backward(retain_graph=True)
        opt.step()
        out.backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run("cpu")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # the same message, but
        with deferfuse.mode(mode):  # the tensor's type name and version numbers (.to() starts at 0)
            run("tpu")


def test_foreach_ops_mark_each_tensor_modified_like_cpu():
    def versions(d):
        a, b = torch.ones(3).to(d), torch.ones(3).to(d)
        start = (a._version, b._version)
        torch._foreach_add_([a, b], 1.0)
        torch._foreach_mul_([a, a], [b, b])  # a twice: marked twice, as on CPU
        torch._foreach_lerp_([b], [a], 0.5)
        return [a._version - start[0], b._version - start[1]]

    want = versions("cpu")
    for mode in MODES:
        with deferfuse.mode(mode):
            assert versions("tpu") == want
