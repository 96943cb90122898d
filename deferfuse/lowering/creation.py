"""Factories and copies: full, arange, linspace, eye, scalar_tensor, dtype conversion, clone, fill.

Output dtypes come from PyTorch's meta kernels (default dtype, inference from the fill value), so
bodies only build values. `arange`/`linspace` compute in float64 and round once, like CPU.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ..dtypes import cast, to_jax_dtype
from .registry import aten, lowering


def _jd(ctx):
    return to_jax_dtype(ctx.out_dtype)


@lowering(aten.full.default, family="creation", ctx=True)
def full(ctx, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, dtype=_jd(ctx))


@lowering(aten.zeros.default, aten._efficientzerotensor.default, family="creation", ctx=True)
def zeros(ctx, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Also forward-mode AD's zero tangent (`_efficientzerotensor`): CPU marks it with the
    ZeroTensor key so later ops may skip it; plain zeros have the same values, and XLA folds them."""
    return jnp.zeros(tuple(size), _jd(ctx))


@lowering(aten.ones.default, family="creation", ctx=True)
def ones(ctx, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _jd(ctx))


@lowering(aten.scalar_tensor.default, family="creation", ctx=True)
def scalar_tensor(ctx, s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s).astype(_jd(ctx))


@lowering(aten.arange.start_step, family="creation", ctx=True)
def arange(ctx, start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    n = ctx.out_shape[0]
    jd = _jd(ctx)
    if jnp.issubdtype(jd, jnp.integer):
        # CPU counts the elements in double, then steps from start in the integer type: start and
        # step are truncated first (arange(0.5, 5, 1.5, dtype=int64) is 0, 1, 2)
        start, step = _trunc(start), _trunc(step)
        return (start + step * lax.iota(jnp.int64, n)).astype(jd)
    return (start + step * lax.iota(jnp.float64, n)).astype(jd)


def _trunc(v):
    return int(v) if isinstance(v, (int, float)) else jnp.trunc(v).astype(jnp.int64)


@lowering(aten.arange.default, family="creation", ctx=True)
def arange_end(ctx, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(ctx, 0, end, 1)


@lowering(aten.arange.start, family="creation", ctx=True)
def arange_start(ctx, start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(ctx, start, end, 1)


@lowering(aten.linspace.default, family="creation", ctx=True, static=("start", "end"))
def linspace(ctx, start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    """CPU's symmetric formula: the first half steps up from start, the second down from end."""
    jd = _jd(ctx)
    if steps == 1:
        return jnp.full((1,), start).astype(jd)
    i = lax.iota(jnp.float64, steps)
    step = (end - start) / (steps - 1)
    vals = jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))
    if jnp.issubdtype(jd, jnp.integer):
        vals = jnp.trunc(vals)
    return vals.astype(jd)


@lowering(aten.eye.default, family="creation", ctx=True)
def eye(ctx, n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=_jd(ctx))


@lowering(aten.eye.m, family="creation", ctx=True)
def eye_m(ctx, n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=_jd(ctx))


@lowering(aten._to_copy.default, family="elementwise", ctx=True)
def to_copy(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    return cast(x, _jd(ctx))


@lowering(aten.clone.default, aten.lift_fresh_copy.default, family="elementwise")
def clone(x, *, memory_format=None):
    return x


@lowering(aten.fill.Scalar, aten.fill.Tensor, family="creation")
def fill(x, value):
    return jnp.full(x.shape, jnp.asarray(value).astype(x.dtype), x.dtype)


@lowering(aten.zero.default, family="creation")
def zero(x):
    return jnp.zeros(x.shape, x.dtype)


@lowering(aten.full_like.default, family="creation", ctx=True)
def full_like(ctx, x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(ctx.out_shape, fill_value, dtype=_jd(ctx))


@lowering(aten.zeros_like.default, family="creation", ctx=True)
def zeros_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(ctx.out_shape, _jd(ctx))


@lowering(aten.ones_like.default, family="creation", ctx=True)
def ones_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(ctx.out_shape, _jd(ctx))


def _numel(shape) -> int:
    return math.prod(shape)


@lowering(aten.copy.default, family="elementwise")
def copy(x, src, non_blocking=False):
    """The functional form of copy_: src cast and broadcast to x."""
    return jnp.broadcast_to(src.astype(x.dtype) if src.dtype != x.dtype else src, x.shape)
