"""Matrix products.

Precision follows `torch.set_float32_matmul_precision` (part of the cache key; see dispatch):
"highest" (PyTorch's default) asks XLA for full float32 products. `beta`/`alpha` are static
because PyTorch skips `self` entirely when beta == 0 (its NaNs must not leak), which needs the
value at trace time; they are almost always 1.
"""
from __future__ import annotations

import jax.numpy as jnp

from .registry import aten, lowering


def _mm(a, b):
    return jnp.matmul(a, b)


@lowering(aten.mm.default, family="matmul", promote="default")
def mm(a, b):
    return _mm(a, b)


@lowering(aten.bmm.default, family="matmul", promote="default")
def bmm(a, b):
    return _mm(a, b)


@lowering(aten.mv.default, family="matmul", promote="default")
def mv(a, v):
    return _mm(a, v)


@lowering(aten.dot.default, aten.vdot.default, family="matmul", promote="default")
def dot(a, b):
    return jnp.dot(a, b)


def _scaled(mat, self, beta, alpha):
    out = mat if alpha == 1 else mat * alpha
    if beta == 0:
        return out
    return out + (self if beta == 1 else self * beta)


@lowering(aten.addmm.default, family="matmul", promote="default", static=("beta", "alpha"))
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled(_mm(mat1, mat2), self, beta, alpha)


@lowering(aten.baddbmm.default, family="matmul", promote="default", static=("beta", "alpha"))
def baddbmm(self, b1, b2, *, beta=1, alpha=1):
    return _scaled(_mm(b1, b2), self, beta, alpha)


@lowering(aten.addmv.default, family="matmul", promote="default", static=("beta", "alpha"))
def addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled(_mm(mat, vec), self, beta, alpha)


@lowering(aten.addbmm.default, family="matmul", promote="default", static=("beta", "alpha"))
def addbmm(self, b1, b2, *, beta=1, alpha=1):
    return _scaled(jnp.sum(_mm(b1, b2), axis=0), self, beta, alpha)


@lowering(aten.addr.default, family="matmul", promote="default", static=("beta", "alpha"))
def addr(self, v1, v2, *, beta=1, alpha=1):
    return _scaled(jnp.outer(v1, v2), self, beta, alpha)


def _pairwise(x1, x2, p):
    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    if p == 0:
        return jnp.sum((diff != 0).astype(x1.dtype), axis=-1)
    if p == float("inf"):
        return jnp.max(diff, axis=-1) if diff.shape[-1] else jnp.zeros(diff.shape[:-1], x1.dtype)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    return jnp.sum(diff**p, axis=-1) ** (1.0 / p)


@lowering(aten._cdist_forward.default, family="matmul")
def cdist(x1, x2, p, compute_mode=None):
    """Direct differences, never the |a|^2+|b|^2-2ab shortcut: exact like CPU's default for small inputs."""
    return _pairwise(x1, x2, p)


@lowering(aten._pdist_forward.default, family="matmul")
def pdist(x, p=2.0):
    n = x.shape[0]
    full = _pairwise(x, x, p)
    rows, cols = jnp.triu_indices(n, k=1)
    return full[rows, cols]
