"""Forward-mode AD on tpu: dual tensors, torch.func.jvp and jacfwd give CPU's tangents.

PyTorch's forward-mode formulas create zero tangents with `aten._efficientzerotensor`; before it
had a lowering every forward-mode call on tpu failed at the first flush.
"""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

from conftest import check_all_modes

# torch.func's forward-mode transforms script a helper on first use; PyTorch's own deprecation
# notice for torch.jit.script is not ours to act on
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

torch.manual_seed(0)
X = torch.randn(4, 3)
T = torch.randn(4, 3)
W = torch.randn(5, 3)
B = torch.randn(5)


def _net(x, w, b):
    h = F.linear(x, w, b).tanh()
    return F.layer_norm(h, (5,)).softmax(-1) * x.sum(-1, keepdim=True)


@pytest.mark.tpu_tolerance(times=4, why="tangents through XLA:TPU's float32 tanh and bf16-pass matmuls: 1.8e-5 "
                                        "absolute measured, 1.8 times")
def test_dual_tensors_match_cpu():
    def fn(dev):
        x, t, w, b = (v.to(dev) for v in (X, T, W, B))
        with fwAD.dual_level():
            primal, tangent = fwAD.unpack_dual(_net(fwAD.make_dual(x, t), w, b))
        return [primal, tangent]

    check_all_modes(fn)


@pytest.mark.tpu_tolerance(times=4, why="tangents through XLA:TPU's float32 tanh and bf16-pass matmuls: 2.4e-5 "
                                        "absolute measured, 2.4 times")
def test_tangent_through_a_parameter_only():
    # the input has no tangent: PyTorch gives it a zero tangent (`_efficientzerotensor`)
    def fn(dev):
        x, t, w, b = (v.to(dev) for v in (X, T, W, B))
        with fwAD.dual_level():
            out = _net(x, fwAD.make_dual(w, torch.ones_like(w)), b)
            return list(fwAD.unpack_dual(out))

    check_all_modes(fn)


@pytest.mark.tpu_tolerance(times=4, why="tangents through XLA:TPU's float32 tanh and bf16-pass matmuls: 1.8e-5 "
                                        "absolute measured, 1.8 times")
def test_func_jvp_and_jacfwd_match_cpu():
    def fn(dev):
        x, t, w, b = (v.to(dev) for v in (X, T, W, B))
        value, tangent = torch.func.jvp(lambda a: _net(a, w, b), (x,), (t,))
        jac = torch.func.jacfwd(lambda a: (a.sin() * a).sum(0))(x[0])
        return [value, tangent, jac]

    check_all_modes(fn)


def test_hessian_vector_product_forward_over_reverse():
    def fn(dev):
        x, t, w, b = (v.to(dev) for v in (X, T, W, B))

        def loss(a):
            return _net(a, w, b).pow(2).sum()

        _, hvp = torch.func.jvp(torch.func.grad(loss), (x,), (t,))
        return [hvp]

    check_all_modes(fn, atol=1e-4, rtol=1e-4)
