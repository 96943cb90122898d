"""Random ops. Each gets a fresh JAX key (`key=`) derived in-program from the (seed, counter)
program inputs, so values are deterministic under `torch.manual_seed`, fresh on every call, and
identical in all three modes. Half types are drawn in float32 and rounded, as CPU does.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..dtypes import to_jax_dtype, up_half, HALF as _HALF
from .registry import aten, lowering


def _draw_dtype(ctx):
    jd = to_jax_dtype(ctx.out_dtype)
    return jnp.float32 if jd in _HALF or not jnp.issubdtype(jd, jnp.floating) else jd


@lowering(aten.uniform.default, family="random", rng=True, ctx=True)
def uniform(ctx, x, *args, key, **kwargs):
    lo = args[0] if len(args) > 0 else kwargs.get("from", 0.0)
    hi = args[1] if len(args) > 1 else kwargs.get("to", 1.0)
    return jax.random.uniform(key, x.shape, _draw_dtype(ctx), lo, hi)


@lowering(aten.normal_functional.default, family="random", rng=True, ctx=True)
def normal(ctx, x, mean=0.0, std=1.0, *, key):
    return jax.random.normal(key, x.shape, _draw_dtype(ctx)) * std + mean


@lowering(aten.normal.Tensor_float, family="random", rng=True, ctx=True)
def normal_tf(ctx, mean, std=1.0, *, key):
    return jax.random.normal(key, ctx.out_shape, _draw_dtype(ctx)) * std + mean


@lowering(aten.normal.float_Tensor, family="random", rng=True, ctx=True)
def normal_ft(ctx, mean, std, *, key):
    return jax.random.normal(key, ctx.out_shape, _draw_dtype(ctx)) * std + mean


@lowering(aten.normal.Tensor_Tensor, family="random", rng=True, ctx=True)
def normal_tt(ctx, mean, std, *, key):
    return jax.random.normal(key, ctx.out_shape, _draw_dtype(ctx)) * std + mean


@lowering(aten.normal.float_float, family="random", rng=True, ctx=True)
def normal_ff(ctx, mean, std, size, *, key, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.normal(key, ctx.out_shape, _draw_dtype(ctx)) * std + mean


def _int_range(jd):
    if jnp.issubdtype(jd, jnp.floating):
        return 0, 2 ** (jnp.finfo(jd).nmant + 1) + 1
    if jd == jnp.bool_:
        return 0, 2
    return 0, int(jnp.iinfo(jd).max) + 1


def _randint(key, shape, lo, hi, jd):
    if hi > 2**63 - 1:
        bits = jax.random.bits(key, shape, jnp.uint64) >> 1
        return (bits.astype(jnp.int64) + lo).astype(jd)
    return jax.random.randint(key, shape, lo, hi, dtype=jnp.int64).astype(jd)


@lowering(aten.random.default, family="random", rng=True, ctx=True)
def random_(ctx, x, *, key):
    jd = to_jax_dtype(ctx.out_dtype)
    lo, hi = _int_range(jd)
    return _randint(key, x.shape, lo, hi, jd)


@lowering(aten.random.to, family="random", rng=True, ctx=True)
def random_to(ctx, x, to, *, key):
    return _randint(key, x.shape, 0, to, to_jax_dtype(ctx.out_dtype))


@lowering(getattr(aten.random, "from"), family="random", rng=True, ctx=True)
def random_from(ctx, x, *args, key, **kwargs):
    lo = args[0] if args else kwargs["from"]
    hi = args[1] if len(args) > 1 else kwargs.get("to")
    jd = to_jax_dtype(ctx.out_dtype)
    if hi is None:
        hi = _int_range(jd)[1]
    return _randint(key, x.shape, lo, hi, jd)


@lowering(aten.bernoulli.p, family="random", rng=True, ctx=True)
def bernoulli_p(ctx, x, p=0.5, *, key):
    return jax.random.bernoulli(key, p, x.shape)


@lowering(aten.bernoulli.default, family="random", rng=True)
def bernoulli(x, *, key):
    return jax.random.uniform(key, x.shape, jnp.float32 if x.dtype in _HALF else x.dtype) < x


@lowering(aten.bernoulli.Tensor, family="random", rng=True)
def bernoulli_tensor(x, p, *, key):
    return jax.random.uniform(key, x.shape, jnp.float32 if p.dtype in _HALF else p.dtype) < p


@lowering(aten.exponential.default, family="random", rng=True, ctx=True)
def exponential(ctx, x, lambd=1.0, *, key):
    return jax.random.exponential(key, x.shape, _draw_dtype(ctx)) / lambd


@lowering(aten.native_dropout.default, family="random", rng=True)
def native_dropout(x, p, train, *, key):
    if train is False:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p >= 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return jnp.where(keep, x * (1.0 / (1.0 - p)), jnp.zeros((), x.dtype)), keep


@lowering(aten.native_dropout_backward.default, family="elementwise")
def native_dropout_backward(grad, mask, scale):
    return grad * mask.astype(grad.dtype) * scale


@lowering(aten.randperm.default, family="random", rng=True, ctx=True)
def randperm(ctx, n, *, key, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.permutation(key, n).astype(to_jax_dtype(ctx.out_dtype))


def _multinomial_meta(args, kwargs):
    # PyTorch's meta kernel skips CPU's argument checks (no samples, more samples than categories
    # without replacement, integer weights): run CPU's kernel on uniform weights of the same shape
    # once per signature, so bad arguments raise CPU's own error at the user's line
    w = args[0]
    kwargs = {k: v for k, v in kwargs.items() if k != "generator"}  # the check must not draw from it
    aten.multinomial.default(torch.ones(w.shape, dtype=w.dtype), *args[1:], **kwargs)
    return aten.multinomial.default(*args, **kwargs)


@lowering(aten.multinomial.default, family="random", rng=True, meta=_multinomial_meta)
def multinomial(w, num_samples, replacement=False, *, key):
    """Draws from unnormalised weights, a zero weight never drawn, as CPU's kernel.

    With replacement, inverse CDF: a uniform draw scaled by the row's total is located in the
    running sum (searchsorted never lands on a zero weight, whose interval is empty). Without,
    Gumbel top-k: the largest `num_samples` of log w plus one Gumbel draw per category, which is
    sampling without replacement in draw order; once the nonzero weights are used up, the zero
    ones follow, as on CPU. Invalid weights (negative, non-finite, a zero row) are
    only detected in Debug mode, which raises CPU's error."""
    w = up_half(w)
    if not replacement:
        noisy = jnp.log(w) + jax.random.gumbel(key, w.shape, w.dtype)
        return lax.top_k(noisy, num_samples)[1].astype(jnp.int64)
    cdf = jnp.cumsum(w, axis=-1)
    u = jax.random.uniform(key, w.shape[:-1] + (num_samples,), w.dtype) * cdf[..., -1:]
    find = functools.partial(jnp.searchsorted, side="right")
    for _ in range(w.ndim - 1):
        find = jax.vmap(find)
    idx = find(cdf, u)
    # u rounds up to the total at worst: stay on the last category with a nonzero weight
    last = w.shape[-1] - 1 - jnp.argmax((w > 0)[..., ::-1], axis=-1, keepdims=True)
    return jnp.minimum(idx, last).astype(jnp.int64)
