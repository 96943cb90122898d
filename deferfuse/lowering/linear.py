"""`F.linear` as one node forward and one node backward.

`aten::linear` is CompositeImplicitAutograd: PyTorch expands it above the dispatcher into a
transpose and a matrix product (`t` + `addmm`, with reshapes around it for a 3-D input), and
autograd records a node for each, whose backward is again half a dozen ops (`t`, `mm`, `mm`,
`sum`, views). Every one of those is a Python dispatch deferfuse pays for on the host: in bench's
GPT step, its linear layers made a large share of all dispatches (docs/performance.md). Claimed at its autograd key for
"tpu" tensors (as `attention.py` does for attention), a linear layer is `deferfuse::linear`
forward and `deferfuse::linear_backward` backward, each lowered to JAX; the backward is the VJP
of the forward, so the two cannot drift apart.

Only the plain case is claimed: floating tensors (float32/float64, and the half types, which are
multiplied in float32 and rounded once, as CPU's matrix products do, so autocast's bfloat16 layers
are claimed too) of one dtype, all on "tpu", a 2-D weight, a 1-D bias or none, matching sizes.
Anything else (integer or complex dtypes, mixed
devices, shape errors, forward-mode AD, functorch transforms) goes to PyTorch's own expansion,
which computes or raises exactly as before. With `create_graph=True` the backward rebuilds
PyTorch's expansion and differentiates it, so higher-order gradients are PyTorch's own.

The autograd side (which calls these two ops, and the claim of `aten::linear` for "tpu") is in
`claims/linear.py`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ..dtypes import up_half
from .registry import lowering

_lib = torch.library.Library("deferfuse", "FRAGMENT")
_lib.define("linear(Tensor x, Tensor w, Tensor? b) -> Tensor")
_lib.define("linear_backward(Tensor grad, Tensor x, Tensor w, Tensor? b) -> (Tensor, Tensor, Tensor)")
LINEAR = torch.ops.deferfuse.linear.default
LINEAR_BACKWARD = torch.ops.deferfuse.linear_backward.default


@torch.library.register_fake("deferfuse::linear")
def _linear_fake(x, w, b):
    return x.new_empty(tuple(x.shape[:-1]) + (w.shape[0],))


@torch.library.register_fake("deferfuse::linear_backward")
def _linear_backward_fake(grad, x, w, b):
    return x.new_empty(x.shape), w.new_empty(w.shape), w.new_empty((w.shape[0],))


def _forward(x, w, b):
    y = jnp.matmul(x, w.T)
    return y if b is None else y + b


def _up(*ts):
    """Half types computed in float32 (the results are rounded to the meta dtype once, at the end)."""
    return [None if t is None else up_half(t) for t in ts]


@lowering(LINEAR, family="matmul")
def linear(x, w, b):
    return _forward(*_up(x, w, b))


@lowering(LINEAR_BACKWARD, family="matmul")
def linear_backward(grad, x, w, b):
    grad, x, w, b = _up(grad, x, w, b)
    if b is None:
        _, vjp = jax.vjp(lambda x_, w_: _forward(x_, w_, None), x, w)
        gx, gw = vjp(grad.astype(x.dtype))
        return gx, gw, jnp.sum(grad, axis=tuple(range(grad.ndim - 1)))
    _, vjp = jax.vjp(_forward, x, w, b)
    return vjp(grad.astype(x.dtype))
