"""Ops that move data around without arithmetic: cat, pad, flip, roll, repeat, triangles,
and the *_scatter ops that write one view into a copy of its base.

True views (view, transpose, slice, select, expand, ...) need no lowering at all: they are
metadata over a shared storage (see views.py).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
import torch

from .. import views
from ..dtypes import to_jax_dtype
from .registry import aten, lowering


@lowering(aten.cat.default, family="misc", ctx=True)
def cat(ctx, tensors, dim=0):
    jd = to_jax_dtype(ctx.out_dtype)
    nd = len(ctx.out_shape)
    # PyTorch still accepts legacy empty 1-D tensors next to tensors of any rank
    parts = [t.astype(jd) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0 and nd != 1)]
    if not parts:
        return jnp.zeros(ctx.out_shape, jd)
    return jnp.concatenate(parts, axis=dim % nd)


@lowering(aten._unsafe_view.default, aten.view_copy.default, aten._reshape_copy.default, family="misc", ctx=True)
def reshape_copy(ctx, x, size):
    return x.reshape(ctx.out_shape)


@lowering(aten.constant_pad_nd.default, family="misc")
def constant_pad_nd(x, pad, value=0):
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        cfg[d] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value).astype(x.dtype), cfg)


@lowering(aten.flip.default, family="misc")
def flip(x, dims):
    return jnp.flip(x, axis=tuple(d % x.ndim for d in dims)) if x.ndim else x


def _roll_meta(args, kwargs):
    """CPU's roll of an empty tensor returns its clone before it looks at the dims (seed 5860:
    `empty.roll(1, 3)` of a 2-dim tensor); the meta kernel checks them first. CPU's kernel over
    an empty stand-in says what it accepts."""
    x = args[0]
    if x.numel():
        return aten.roll(*args, **kwargs)
    aten.roll(torch.empty(x.shape, dtype=x.dtype), *args[1:], **kwargs)
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")  # an empty clone keeps its strides


@lowering(aten.roll.default, family="misc", meta=_roll_meta)
def roll(x, shifts, dims=()):
    if not x.size:
        return x
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@lowering(aten.repeat.default, family="misc")
def repeat(x, repeats):
    lead = len(repeats) - x.ndim
    x = x.reshape((1,) * lead + x.shape)
    return jnp.tile(x, tuple(repeats))


@lowering(aten.tril.default, family="misc")
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu.default, family="misc")
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowering(aten.select_scatter.default, family="misc")
def select_scatter(x, src, dim, index):
    dim %= x.ndim
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x.at[tuple(idx)].set(src.astype(x.dtype))


@lowering(aten.slice_scatter.default, family="misc")
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    dim %= x.ndim
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x.at[tuple(idx)].set(src.astype(x.dtype))


@lowering(aten.diagonal_scatter.default, family="misc")
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = dim1 % x.ndim, dim2 % x.ndim
    length = src.shape[-1]
    i = jnp.arange(length)
    r = i + max(-offset, 0)
    c = i + max(offset, 0)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    moved = moved.at[..., r, c].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lowering(aten.as_strided_scatter.default, family="misc")
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    plan = views.plan_view((x.size,), tuple(size), tuple(stride), storage_offset or 0)
    return views.write(x.reshape(-1), plan, storage_offset or 0, src).reshape(x.shape)


# --- dtype-reinterpreting views (computed as copies; see dispatch.copying_view) ------------------


@lowering(aten.view_as_real.default, family="misc")
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowering(aten.view_as_complex.default, family="misc")
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@lowering(aten.real.default, family="misc")
def real(x):
    return jnp.real(x)


@lowering(aten.imag.default, family="misc")
def imag(x):
    return jnp.imag(x)


@lowering(aten.view.dtype, family="misc", ctx=True)
def view_dtype(ctx, x, dtype):
    """Bit reinterpretation; a size change folds into (or out of) the last dimension."""
    target = to_jax_dtype(ctx.out_dtype)
    src_bits, dst_bits = x.dtype.itemsize, jnp.dtype(target).itemsize
    if src_bits == dst_bits:
        return lax.bitcast_convert_type(x, target)
    if src_bits > dst_bits:
        y = lax.bitcast_convert_type(x, target)  # adds a trailing dim of src/dst
        return y.reshape(x.shape[:-1] + (x.shape[-1] * (src_bits // dst_bits),))
    ratio = dst_bits // src_bits
    y = x.reshape(x.shape[:-1] + (x.shape[-1] // ratio, ratio))
    return lax.bitcast_convert_type(y, target)


@lowering(aten._conj.default, family="elementwise")
def conj_view(x):
    """PyTorch's lazy conjugate bit has no counterpart on tpu: materialise the conjugate."""
    return jnp.conj(x)


@lowering(aten._neg_view.default, family="elementwise")
def neg_view(x):
    """The lazy negation bit, materialised."""
    return jnp.negative(x)


@lowering(aten.conj_physical.default, family="elementwise")
def conj_physical(x):
    return jnp.conj(x)
