"""The claim of `aten::linear` for "tpu" tensors at its autograd key: a plain call is one
`deferfuse::linear` node forward and one `deferfuse::linear_backward` node backward (lowered in
`lowering/linear.py`, which says why); anything else goes to PyTorch's own expansion.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from ..lowering.linear import LINEAR, LINEAR_BACKWARD
from ..tensor import TpuTensor


_composite = torch.ops.aten.linear.default


class _Linear(torch.autograd.Function):
    # The old-style signature (forward takes ctx): with a separate setup_context, Function.apply
    # binds the arguments through inspect.signature on every call, slower than the op. functorch
    # transforms need the new style, so `_claimable` leaves calls under them to PyTorch.
    #
    # Saved, as CPU's addmm saves them: the input only for the weight's gradient, the weight
    # only for the input's, never the bias. The rest is kept unchecked for shapes alone, so an
    # in-place change between forward and backward (a weight clipped or averaged under no_grad
    # when the input needs no gradient) is not taken for an error CPU does not raise.
    @staticmethod
    def forward(ctx, x, w, b):
        need = ctx.needs_input_grad
        ctx.save_for_backward(x if need[1] else None, w if need[0] else None)
        ctx.rest = (None if need[1] else x, None if need[0] else w, b)
        return LINEAR(x, w, b)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        rx, rw, b = ctx.rest
        x = rx if x is None else x
        w = rw if w is None else w
        need = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: PyTorch's expansion, differentiable again
            return _differentiable_backward(grad, x, w, b, need)
        gx, gw, gb = LINEAR_BACKWARD(grad, x, w, b)
        return gx if need[0] else None, gw if need[1] else None, gb if need[2] else None


def distinct(*ts):
    """A fresh alias per argument, so that `autograd.grad` gives each argument slot its own
    gradient when one tensor fills several (`F.linear(x, x)`, self-attention's `sdpa(q, q, q)`):
    asked for the same tensor twice it returns the whole gradient twice, and autograd would then
    sum both into that tensor. The aliases stay in the graph, so the gradients stay differentiable."""
    return tuple(None if t is None else t.view_as(t) for t in ts)


def _differentiable_backward(grad, x, w, b, need):
    x, w, b = distinct(x, w, b)
    inputs = [t for t, n in zip((x, w, b), need) if n]
    out = _composite.decompose(x, w, b)
    grads = iter(torch.autograd.grad(out, inputs, grad, create_graph=True, allow_unused=True))
    return tuple(next(grads) if n else None for n in need)


_functorch_active = torch._C._are_functorch_transforms_active
# Claimed under torch.compile too, so that a compiled graph holds the same two nodes as eager and
# lowers to the same program: the weight gradient as the batched contraction of
# `linear_backward`, where AOTAutograd's expansion (`mm(t(grad), x)` on flattened operands) left
# XLA:CPU a transposed product outside its parallel matrix kernels (docs/performance.md)
_TRACED = (FakeTensor, FunctionalTensor)
_CLAIMED = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _traced_on_tpu(t) -> bool:
    """A tensor that stands for a tpu one while Dynamo and AOTAutograd trace."""
    return type(t) in _TRACED and t.device.type == "tpu"


def _claimable(x, w, b) -> bool:
    tpu = TpuTensor
    if type(x) is not tpu or type(w) is not tpu or (b is not None and type(b) is not tpu):
        if not (_traced_on_tpu(x) and _traced_on_tpu(w) and (b is None or _traced_on_tpu(b))):
            return False
    dt = x.dtype
    if dt not in _CLAIMED or w.dtype is not dt or w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        return False
    if b is not None and (b.dtype is not dt or b.dim() != 1 or b.shape[0] != w.shape[0]):
        return False
    # forward-mode AD needs PyTorch's own formulas, functorch transforms a new-style Function
    return _fwad._current_level < 0 and not _functorch_active()


# `Function.apply` is a Python wrapper that, outside functorch transforms, walks the arguments to
# unwrap dead functorch wrappers and then calls the C++ apply. A claimed call has plain TpuTensor
# arguments and no transform active, so it calls the C++ apply directly.
_apply_linear = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Linear)


def _linear_autograd(x, w, b=None):
    if not _claimable(x, w, b):
        return _composite.decompose(x, w, b)
    if type(x) is not TpuTensor:  # traced: Function.apply lets AOTAutograd see the Function
        return _Linear.apply(x, w, b)
    return _apply_linear(x, w, b)


_impl = torch.library.Library("aten", "IMPL")
_impl.impl("linear", _linear_autograd, "AutogradPrivateUse1")
