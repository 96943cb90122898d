"""Matrix products.

Precision follows `torch.set_float32_matmul_precision` (part of the cache key; see dispatch):
"highest" (PyTorch's default) asks XLA for full float32 products. `beta`/`alpha` are static
because PyTorch skips `self` entirely when beta == 0 (its NaNs must not leak), which needs the
value at trace time; they are almost always 1.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..dtypes import to_jax_dtype, HALF as _HALF
from .registry import aten, lowering


def _mm(a, b):
    return jnp.matmul(a, b)


def _check(op):
    """CPU's matrix products refuse operands of different dtypes, where their meta kernels (and
    jnp.matmul) promote. A meta_fix, so it runs once per signature: on a mismatch the op runs on
    CPU over all-ones tensors of the operands' ranks and dtypes, which raises CPU's own error."""
    def same_dtypes(args, kwargs, leaves):
        if len({a.dtype for a in args if isinstance(a, torch.Tensor)}) > 1:
            op(*[torch.ones((1,) * a.dim(), dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args],
               **kwargs)
        return leaves

    return same_dtypes


@lowering(aten.mm.default, family="matmul", promote="default", meta_fix=_check(aten.mm.default))
def mm(a, b):
    return _mm(a, b)


@lowering(aten.bmm.default, family="matmul", promote="default", meta_fix=_check(aten.bmm.default))
def bmm(a, b):
    return _mm(a, b)


@lowering(aten.mv.default, family="matmul", promote="default", meta_fix=_check(aten.mv.default))
def mv(a, v):
    return _mm(a, v)


@lowering(aten.dot.default, family="matmul", promote="default")
def dot(a, b):
    return jnp.dot(a, b)


@lowering(aten.vdot.default, family="matmul", promote="default")
def vdot(a, b):
    """The first argument conjugated (a no-op for real tensors)."""
    return jnp.vdot(a, b)


def _scaled(mat, self, beta, alpha):
    if not jnp.issubdtype(mat.dtype, jnp.inexact):
        beta, alpha = int(beta), int(alpha)  # CPU converts them to the integer dtype (0.6 -> 0)
    out = mat if alpha == 1 else mat * alpha
    if beta == 0:
        return out
    return out + (self if beta == 1 else self * beta)


def _rounder(ctx):
    """Rounds a float32 intermediate to the result's half type, where CPU's kernel stores one."""
    out = to_jax_dtype(ctx.out_dtype)
    if out in _HALF:
        return lambda v: v.astype(out).astype(jnp.float32)
    return lambda v: v


@lowering(aten.addmm.default, family="matmul", promote="default", static=("beta", "alpha"),
          meta_fix=_check(aten.addmm.default))
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled(_mm(mat1, mat2), self, beta, alpha)


@lowering(aten.baddbmm.default, family="matmul", promote="default", static=("beta", "alpha"),
          meta_fix=_check(aten.baddbmm.default))
def baddbmm(self, b1, b2, *, beta=1, alpha=1):
    return _scaled(_mm(b1, b2), self, beta, alpha)


@lowering(aten.addmv.default, family="matmul", promote="default", static=("beta", "alpha"),
          meta_fix=_check(aten.addmv.default))
def addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled(_mm(mat, vec), self, beta, alpha)


@lowering(aten.addbmm.default, family="matmul", promote="default", static=("beta", "alpha"), ctx=True,
          meta_fix=_check(aten.addbmm.default))
def addbmm(ctx, self, b1, b2, *, beta=1, alpha=1):
    """CPU runs one addmm_ per batch into the result, so a half-type result is rounded after each
    batch's product is added; other dtypes sum the products at once."""
    prods = _mm(b1, b2)
    if to_jax_dtype(ctx.out_dtype) not in _HALF:
        return _scaled(jnp.sum(prods, axis=0), self, beta, alpha)
    rnd = _rounder(ctx)
    init = jnp.zeros(ctx.out_shape, prods.dtype)
    if beta != 0:
        init = init + self * beta
    if prods.shape[0] == 0:
        return init

    def add_batch(acc, p):
        return rnd(acc + p * alpha), None

    return lax.scan(add_batch, init, prods)[0]


@lowering(aten.addr.default, family="matmul", promote="default", static=("beta", "alpha"), ctx=True)
def addr(ctx, self, v1, v2, *, beta=1, alpha=1):
    """CPU's kernel is elementwise beta*self + alpha*v1*v2 in the tensor's dtype: each product is
    rounded for half types, alpha and beta are converted to it, and self is ignored when beta is 0."""
    if self.dtype == jnp.bool_:
        prod = jnp.logical_and(bool(alpha), jnp.outer(v1, v2))
        return prod if not beta else jnp.logical_or(prod, self)
    if not jnp.issubdtype(self.dtype, jnp.inexact):
        beta, alpha = int(beta), int(alpha)
    rnd = _rounder(ctx)
    a = rnd(jnp.asarray(alpha, self.dtype))
    prod = rnd(rnd(a * v1)[:, None] * v2[None, :])
    if beta == 0:
        return prod
    return rnd(rnd(jnp.asarray(beta, self.dtype)) * self) + prod


@lowering(aten.linalg_cross.default, family="elementwise", promote="default", ctx=True)
def linalg_cross(ctx, a, b, *, dim=-1):
    """CPU rounds each product to the tensor's dtype before subtracting (visible in bfloat16)."""
    a, b = jnp.broadcast_arrays(a, b)
    nxt, prv = jnp.array([1, 2, 0]), jnp.array([2, 0, 1])
    rnd = _rounder(ctx)
    return rnd(jnp.take(a, nxt, axis=dim) * jnp.take(b, prv, axis=dim)) - \
        rnd(jnp.take(a, prv, axis=dim) * jnp.take(b, nxt, axis=dim))


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
