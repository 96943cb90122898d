"""Reductions and scans.

Half-precision inputs accumulate in float32, as CPU PyTorch does, and the result is cast to the
dtype PyTorch's meta kernel reports. An empty `dim` list means "all dims" where PyTorch says so.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
import torch

from ..dtypes import to_jax_dtype, HALF as _HALF
from .registry import aten, bound, lowering


def _axes(x, dim):
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return None
    nd = max(x.ndim, 1)
    return tuple(sorted(d % nd for d in dim)) if x.ndim else None


def _acc(x, out_dtype):
    """The dtype to accumulate in: the output dtype, widened from half types to float32."""
    jd = to_jax_dtype(out_dtype)
    if jd in _HALF:
        return x.astype(jnp.float32)
    return x.astype(jd)


@lowering(aten.sum.default, family="reduction", ctx=True)
def sum_all(ctx, x, *, dtype=None):
    return jnp.sum(_acc(x, ctx.out_dtype))


@lowering(aten.sum.dim_IntList, family="reduction", ctx=True)
def sum_dim(ctx, x, dim, keepdim=False, *, dtype=None):
    return jnp.sum(_acc(x, ctx.out_dtype), axis=_axes(x, dim), keepdims=keepdim)


def _nansum_of_no_dims(args, kwargs, leaves):
    """`nansum(x, [])` reduces every dim on CPU, as `sum(x, [])` does; the meta kernel reduces none."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None or len(dim):
        return leaves
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    shape = (1,) * args[0].ndim if keepdim else ()
    return [torch.empty(shape, dtype=leaves[0].dtype, device="meta")]


@lowering(aten.nansum.default, family="reduction", ctx=True, meta_fix=_nansum_of_no_dims)
def nansum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    """A lowering of its own rather than PyTorch's decomposition, so that the reduction rule
    rehearses a complex input on CPU, which refuses it (CUDA does not)."""
    a = _acc(x, ctx.out_dtype)
    if jnp.issubdtype(a.dtype, jnp.inexact):
        a = jnp.where(jnp.isnan(a), jnp.zeros((), a.dtype), a)
    return jnp.sum(a, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.mean.default, family="reduction", ctx=True)
def mean_all(ctx, x, *, dtype=None):
    return jnp.mean(_acc(x, ctx.out_dtype))


@lowering(aten.mean.dim, family="reduction", ctx=True)
def mean_dim(ctx, x, dim, keepdim=False, *, dtype=None):
    return jnp.mean(_acc(x, ctx.out_dtype), axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.prod.default, family="reduction", ctx=True)
def prod_all(ctx, x, *, dtype=None):
    return jnp.prod(_acc(x, ctx.out_dtype))


@lowering(aten.prod.dim_int, family="reduction", ctx=True)
def prod_dim(ctx, x, dim, keepdim=False, *, dtype=None):
    return jnp.prod(_acc(x, ctx.out_dtype), axis=dim % max(x.ndim, 1) if x.ndim else None, keepdims=keepdim)


@lowering(aten.amax.default, family="reduction")
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.amin.default, family="reduction")
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.max.default, family="reduction")
def max_all(x):
    return jnp.max(x)


@lowering(aten.min.default, family="reduction")
def min_all(x):
    return jnp.min(x)


def _arg_first(x, axis, keepdims, take_max):
    """First index of the extremum, NaN counting as the extremum (CPU PyTorch's rule)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    return (jnp.argmax if take_max else jnp.argmin)(x, axis=axis, keepdims=keepdims)


@lowering(aten.max.dim, family="reduction")
def max_dim(x, dim, keepdim=False):
    axis = dim % max(x.ndim, 1) if x.ndim else None
    return jnp.max(x, axis=axis, keepdims=keepdim), _arg_first(x, axis, keepdim, True)


@lowering(aten.min.dim, family="reduction")
def min_dim(x, dim, keepdim=False):
    axis = dim % max(x.ndim, 1) if x.ndim else None
    return jnp.min(x, axis=axis, keepdims=keepdim), _arg_first(x, axis, keepdim, False)


@lowering(aten.argmax.default, family="reduction")
def argmax(x, dim=None, keepdim=False):
    if dim is None:
        return _arg_first(x.reshape(-1), 0, False, True)
    return _arg_first(x, dim % max(x.ndim, 1) if x.ndim else None, keepdim, True)


@lowering(aten.argmin.default, family="reduction")
def argmin(x, dim=None, keepdim=False):
    if dim is None:
        return _arg_first(x.reshape(-1), 0, False, False)
    return _arg_first(x, dim % max(x.ndim, 1) if x.ndim else None, keepdim, False)


def _var(x, dim, correction, keepdim):
    """Divides by max(0, N - correction) as PyTorch does: inf (or NaN for a zero sum) once the
    correction reaches N, where jnp.var gives NaN."""
    correction = 1 if correction is None else correction
    xf = x.astype(jnp.float32) if x.dtype in _HALF else x
    axes = _axes(x, dim)
    n = math.prod(xf.shape[a] for a in (range(xf.ndim) if axes is None else axes))
    d = xf - jnp.mean(xf, axis=axes, keepdims=True)
    sq = (d * jnp.conj(d)).real if jnp.iscomplexobj(d) else d * d
    total = jnp.sum(sq, axis=axes, keepdims=keepdim)
    if n == 0:  # NaN itself: computed as 0 / 0, it came out 0 once fused with a multiply (seed 9577)
        return jnp.full_like(total, jnp.nan)
    return total / jnp.maximum(0, n - correction).astype(sq.dtype)


@lowering(aten.var.correction, family="reduction")
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)


@lowering(aten.std.correction, family="reduction")
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, dim, correction, keepdim))


def _welford_mean(ctx, x, dim, keepdim):
    """The mean of var_mean/std_mean as CPU's Welford update gives it: an infinity followed by any
    other element makes NaN there (`m + (v - inf) / n`), so only an infinity met last survives
    (`[1, 2, inf]`: inf, `[-inf, 1, 2]`: NaN; seeds 4383, 6391). CPU meets the reduced elements in
    memory order, and merging partial results keeps the rule."""
    xf = x.astype(jnp.float32) if x.dtype in _HALF else x
    axes = _axes(x, dim)
    m = jnp.mean(xf, axis=axes, keepdims=keepdim)
    if not jnp.issubdtype(xf.dtype, jnp.floating) or not xf.size:
        return m
    reduced = tuple(range(xf.ndim)) if axes is None else axes
    stride = ctx.meta_args[0].stride()
    order = sorted(reduced, key=lambda a: -stride[a])  # the last of them varies fastest in memory
    kept = [a for a in range(xf.ndim) if a not in reduced]
    flat = jnp.transpose(xf, kept + order).reshape([xf.shape[a] for a in kept] + [-1])
    early = jnp.any(jnp.isinf(flat[..., :-1]), axis=-1)
    if keepdim:
        early = early.reshape(m.shape)
    return jnp.where(early, jnp.nan, m)


@lowering(aten.var_mean.correction, family="reduction", ctx=True)
def var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim), _welford_mean(ctx, x, dim, keepdim)


@lowering(aten.std_mean.correction, family="reduction", ctx=True)
def std_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, dim, correction, keepdim)), _welford_mean(ctx, x, dim, keepdim)


@lowering(aten.any.default, family="reduction")
def any_all(x):
    return jnp.any(x != 0)


@lowering(aten.all.default, family="reduction")
def all_all(x):
    return jnp.all(x != 0)


@lowering(aten.any.dim, aten.any.dims, family="reduction")
def any_dim(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.all.dim, aten.all.dims, family="reduction")
def all_dim(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@lowering(aten.logsumexp.default, family="reduction", ctx=True)
def logsumexp(ctx, x, dim, keepdim=False):
    """CPU's steps: the max (an infinite one taken as 0) subtracted, exp, sum, log, the max added
    back, each rounded to a half type's precision as CPU rounds every op (a bfloat16 result one
    last-place off rounding once: seed 9008). `reduce_precision` keeps XLA from dropping them."""
    jd = to_jax_dtype(ctx.out_dtype)
    xf = _acc(x, ctx.out_dtype)
    axes = _axes(x, dim)
    if jd not in _HALF:
        return jax.nn.logsumexp(xf, axis=axes, keepdims=keepdim)
    info = jnp.finfo(jd)
    rnd = lambda v: lax.reduce_precision(v, info.nexp, info.nmant)  # noqa: E731
    if not xf.size:
        return jnp.log(jnp.sum(jnp.exp(xf), axis=axes, keepdims=keepdim))
    m = jnp.max(xf, axis=axes, keepdims=True)
    m = jnp.where(jnp.isinf(m), 0, m)
    s = rnd(jnp.sum(rnd(jnp.exp(rnd(xf - m))), axis=axes, keepdims=keepdim))
    return rnd(rnd(jnp.log(s)) + (m if keepdim else jnp.squeeze(m, axes)))


@lowering(aten.cumsum.default, family="reduction", ctx=True)
def cumsum(ctx, x, dim, *, dtype=None):
    if x.ndim == 0:
        return _acc(x, ctx.out_dtype)
    return jnp.cumsum(_acc(x, ctx.out_dtype), axis=dim % x.ndim)


@lowering(aten.cumprod.default, family="reduction", ctx=True)
def cumprod(ctx, x, dim, *, dtype=None):
    if x.ndim == 0:
        return _acc(x, ctx.out_dtype)
    return jnp.cumprod(_acc(x, ctx.out_dtype), axis=dim % x.ndim)


@lowering(aten.linalg_vector_norm.default, family="reduction", static=("ord",), ctx=True)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    a = jnp.abs(_acc(x, ctx.out_dtype) if not jnp.issubdtype(x.dtype, jnp.complexfloating) else x)
    axes = _axes(x, dim)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


def _finite_range(args, kwargs, leaves):
    """CPU refuses an infinite min or max, which PyTorch's meta kernel lets through: its error,
    raised by CPU's own kernel over a stand-in (min and max are static, so every range is seen)."""
    a = bound(aten.histc.default, args, kwargs)
    if not (math.isfinite(a["min"]) and math.isfinite(a["max"])):
        with torch.utils._python_dispatch._disable_current_modes():
            torch.histc(torch.zeros(1), a["bins"], a["min"], a["max"])
    return leaves


@lowering(aten.histc.default, family="reduction", ctx=True, probe=None, static=("min", "max"),
          meta_fix=_finite_range)
def histc(ctx, x, bins=100, min=0, max=0):
    """CPU's and CUDA's binning: values outside [min, max] are dropped, max lands in the last
    bin, and min == max takes the data's range (widened by one each way if that is one value
    too). Floating inputs bin as CPU does, in their own dtype; integer ones (CUDA takes them, and
    transformers' MoE layers count tokens per expert with an int32 histc on any device but CPU)
    with CUDA's exact integer arithmetic."""
    exact = jnp.issubdtype(x.dtype, jnp.integer)
    flat = (x.astype(jnp.int64) if exact else _acc(x, ctx.out_dtype)).reshape(-1)
    lo, hi = jnp.asarray(min, flat.dtype), jnp.asarray(max, flat.dtype)
    if flat.size:
        same = lo == hi
        lo, hi = jnp.where(same, flat.min(), lo), jnp.where(same, flat.max(), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    inside = (flat >= lo) & (flat <= hi)
    scaled = (flat - lo) * bins
    pos = (scaled // (hi - lo) if exact else jnp.trunc(scaled / (hi - lo))).astype(jnp.int32)
    pos = jnp.clip(pos, 0, bins - 1)
    counts = jnp.zeros((bins,), jnp.int64 if exact else flat.dtype).at[pos].add(inside.astype(jnp.int64 if exact
                                                                                                 else flat.dtype))
    return counts
