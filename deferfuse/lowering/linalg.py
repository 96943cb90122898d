"""Matrix products.

The matmul family is traced at the float32 matmul precision of each call (precision.py, which
dispatch.route_contracting puts in the Op's key): XLA would otherwise leave a dot at DEFAULT,
one bfloat16 pass on a TPU, whatever PyTorch's setting says. `beta`/`alpha` are static
because PyTorch skips `self` entirely when beta == 0 (its NaNs must not leak), which needs the
value at trace time; they are almost always 1.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..dtypes import to_jax_dtype, HALF as _HALF
from ..probe import from_cpu
from .registry import aten, bound, lowering


def _mm(a, b):
    return jnp.matmul(a, b)


_EMPTY_REHEARSAL = 1 << 16  # the largest operand rehearsed on CPU when another is empty


def _check(op):
    """CPU's matrix products refuse operands of different dtypes, where their meta kernels (and
    jnp.matmul) promote. A meta_fix, so it runs once per signature: on a mismatch the op runs on
    CPU over all-ones tensors of the operands' ranks and dtypes, which raises CPU's own error."""
    def same_dtypes(args, kwargs, leaves):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if len({a.dtype for a in tensors}) > 1:
            op(*[torch.ones((1,) * a.dim(), dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args],
               **kwargs)
        elif any(a.numel() == 0 for a in tensors) and max(a.numel() for a in tensors) <= _EMPTY_REHEARSAL:
            # over an empty contraction CPU scales `self` in place by beta, and refuses a float beta
            # for an integer result (fuzzer seed 2943), which it takes for a non-empty one: rehearse
            # the real shapes
            op(*[torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args],
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


_GROUPED_MM = aten._grouped_mm.default


def grouped_mm_meta(args, kwargs):
    """PyTorch's meta kernel takes bfloat16 alone (the Hopper kernel's rule), where CPU's kernel
    and CUDA's fallback take any floating dtype: the output's shape comes from the meta kernel
    over bfloat16 stand-ins, its dtype from the call. A call that kernel refuses, or that asks
    for something CPU refuses (another out_dtype, a bias), goes to CPU's kernel over empty
    stand-ins of its layout: CPU's error, or, for a rule of the bfloat16 kernel alone, the layout."""
    a = bound(_GROUPED_MM, args, kwargs)
    x, w, offs, bias, dtype = a["self"], a["mat2"], a["offs"], a["bias"], a["out_dtype"]
    if bias is None and dtype in (None, x.dtype) and x.dtype == w.dtype:
        try:
            out = _GROUPED_MM(x.to(torch.bfloat16), w.to(torch.bfloat16), offs)
            return torch.empty(out.shape, dtype=x.dtype, device="meta")
        except RuntimeError:
            pass

    def real(t):
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)

    out = from_cpu(lambda: _GROUPED_MM(real(x), real(w), real(offs), real(bias), dtype))
    return torch.empty(out.shape, dtype=out.dtype, device="meta")


@lowering(_GROUPED_MM, family="matmul", meta=grouped_mm_meta)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """Mixture-of-experts layers (transformers' Mixtral and Qwen-MoE on any device but CPU):
    one product per group of rows, columns or shared dims, the groups ending at `offs`.
    jax.lax.ragged_dot is XLA's grouped product (native on TPU). Entries past offs[-1], which
    PyTorch's kernels leave uninitialised, are zeros. Half types accumulate in float32."""
    acc = jnp.float32 if a.dtype in _HALF else None
    if offs is None:  # 3-D x 3-D: one product per group, a batch
        return jnp.matmul(a, b, preferred_element_type=acc)
    sizes = jnp.diff(offs.astype(jnp.int32), prepend=0)
    if a.ndim == 2 and b.ndim == 3:  # rows of `a` in groups (the experts' forward)
        return lax.ragged_dot(a, b, sizes, preferred_element_type=acc)
    if a.ndim == 3 and b.ndim == 2:  # columns of `b` in groups: the same product, transposed
        return lax.ragged_dot(b.T, jnp.swapaxes(a, 1, 2), sizes, preferred_element_type=acc).T
    # 2-D x 2-D, the shared dim in groups (the experts' weight gradient): a product per group
    dims = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1],
                                         rhs_group_dimensions=[])
    return lax.ragged_dot_general(a, b, sizes, dims, preferred_element_type=acc)
