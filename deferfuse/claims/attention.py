"""The claim of `aten::scaled_dot_product_attention` for "tpu" tensors at its autograd key: one
`deferfuse::sdpa` node forward and one `deferfuse::sdpa_backward` node backward (lowered in
`lowering/attention.py`, which says why and what is claimed), and the CPU kernel of
`deferfuse::sdpa`: PyTorch's own attention, so that a call the fake kernel refuses raises CPU's
error at the user's line (probe.cpu_error_instead runs it).
"""
from __future__ import annotations

import torch

from ..lowering.attention import LIBRARY, SDPA, SDPA_BACKWARD
from ..tensor import TpuTensor
from .linear import distinct

_composite = torch.ops.aten.scaled_dot_product_attention.default


def _sdpa_cpu(q, k, v, mask, causal, scale, gqa):
    return _composite(q, k, v, mask, 0.0, causal, scale=scale, enable_gqa=gqa)


LIBRARY.impl("sdpa", _sdpa_cpu, "CPU")


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, gqa):
        ctx.save_for_backward(q, k, v, mask)
        ctx.args = (causal, scale, gqa)
        return SDPA(q, k, v, mask, causal, scale, gqa)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask = ctx.saved_tensors
        need = ctx.needs_input_grad[:4]
        causal, scale, gqa = ctx.args
        if torch.is_grad_enabled():  # create_graph=True: PyTorch's expansion, differentiable again
            q, k, v, mask = distinct(q, k, v, mask)
            inputs = [t for t, n in zip((q, k, v, mask), need) if n]
            out = _composite.decompose(q, k, v, mask, 0.0, causal, scale=scale, enable_gqa=gqa)
            grads = iter(torch.autograd.grad(out, inputs, grad, create_graph=True, allow_unused=True))
            return (*(next(grads) if n else None for n in need), None, None, None)
        dq, dk, dv, dmask = SDPA_BACKWARD(grad, q, k, v, mask, causal, scale, gqa, need[3])
        return dq, dk, dv, dmask if need[3] else None, None, None, None


# Function.apply's C++ half (see `_apply_linear` in claims/linear.py)
_apply_attention = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Attention)
_impl = torch.library.Library("aten", "IMPL")


def _sdpa_autograd(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # dropout needs one mask shared by forward and backward; functorch transforms (torch.func.grad,
    # vmap) need a new-style Function, which costs an inspect.signature bind per call
    if dropout_p and dropout_p > 0.0 or torch._C._are_functorch_transforms_active():
        return _composite.decompose(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    mask = attn_mask
    if mask is not None and mask.dtype == torch.uint8:
        mask = mask.bool()
    args = (q, k, v, mask, bool(is_causal), scale, bool(enable_gqa))
    tpu = TpuTensor
    if type(q) is tpu and type(k) is tpu and type(v) is tpu and (mask is None or type(mask) is tpu):
        return _apply_attention(*args)  # plain tensors: nothing for Function.apply to unwrap
    return _Attention.apply(*args)


_impl.impl("scaled_dot_product_attention", _sdpa_autograd, "AutogradPrivateUse1")
