"""Pooling: average, adaptive average, max and adaptive max, with their backward ops.

Max pooling picks one element per window exactly as CPU PyTorch's kernel scans it: the first
maximum in row-major window order, except that a NaN wins and the last NaN is kept; positions in
the padding never win. Fixed windows are one variadic reduce_window over (value, flat offset)
pairs; adaptive windows gather each window into a trailing axis from static NumPy tables, so
nothing data-dependent reaches the program shape. The indices are flat offsets into each input
plane, as PyTorch returns them. The backward ops scatter-add the gradient at those indices (in
float32 for half types).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..dtypes import up_half as _up
from .registry import aten, lowering


# --- average pooling ---------------------------------------------------------------------------------


def _pool_geometry(n, k, s, p, ceil_mode):
    out = (n + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    hi = (out - 1) * s + k - n - p
    return out, hi


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    nd = len(kernel_size)
    sp = x.shape[-nd:]
    stride = list(stride) or list(kernel_size)
    padding = list(padding) if len(padding) == nd else list(padding) * nd
    pads = []
    for i in range(nd):
        _, hi = _pool_geometry(sp[i], kernel_size[i], stride[i], padding[i], ceil_mode)
        pads.append((padding[i], max(hi, 0)))
    lead = x.ndim - nd
    window = (1,) * lead + tuple(kernel_size)
    strides = (1,) * lead + tuple(stride)
    full_pad = [(0, 0)] * lead + pads
    xf = _up(x)
    total = lax.reduce_window(xf, 0.0, lax.add, window, strides, full_pad)
    if divisor_override:
        return total / divisor_override
    if count_include_pad:
        ones = jnp.ones(tuple(sp[i] + 2 * padding[i] for i in range(nd)), xf.dtype)
        extra = [(0, max(pads[i][1] - padding[i], 0)) for i in range(nd)]
        count = lax.reduce_window(ones, 0.0, lax.add, tuple(kernel_size), tuple(stride), extra)
    else:
        ones = jnp.ones(sp, xf.dtype)
        count = lax.reduce_window(ones, 0.0, lax.add, tuple(kernel_size), tuple(stride), pads)
    return total / count


@lowering(aten.avg_pool2d.default, aten.avg_pool3d.default, family="conv")
def avg_pool(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    ks = list(kernel_size)
    nd = 2 if len(x.shape) and ks and len(ks) <= 2 else 3
    if len(ks) == 1:
        ks = ks * nd
    st = list(stride) if stride else ks
    if len(st) == 1:
        st = st * nd
    return _avg_pool(x, ks, st, list(padding), ceil_mode, count_include_pad, divisor_override)


@lowering(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default, family="conv")
def avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    _, vjp = jax.vjp(lambda v: avg_pool(v, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                        divisor_override).astype(v.dtype), x)
    return vjp(grad.astype(x.dtype))[0]


def _adaptive_windows(n_in, n_out):
    """PyTorch's adaptive pooling windows: [floor(i*n/o), ceil((i+1)*n/o))."""
    return [((i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)) for i in range(n_out)]


def _adaptive_avg(x, output_size):
    nd = len(output_size)
    out = x
    for k in range(nd):
        axis = x.ndim - nd + k
        n_in, n_out = x.shape[axis], output_size[k]
        if n_out is None:
            continue
        parts = [jnp.mean(lax.slice_in_dim(out, a, b, axis=axis), axis=axis, keepdims=True)
                 for a, b in _adaptive_windows(n_in, n_out)]
        out = jnp.concatenate(parts, axis=axis) if parts else out
    return out


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default, family="conv")
def adaptive_avg_pool(x, output_size):
    """Separable: averaging a box is averaging each axis in turn, exactly."""
    return _adaptive_avg(_up(x), list(output_size))


def _adaptive_avg_backward(grad, x, nd):
    out_size = list(grad.shape[-nd:])
    _, vjp = jax.vjp(lambda v: _adaptive_avg(v, out_size), _up(x))
    return vjp(_up(grad))[0]


@lowering(aten._adaptive_avg_pool2d_backward.default, family="conv")
def adaptive_avg_pool2d_backward(grad, x):
    return _adaptive_avg_backward(grad, x, 2)


@lowering(aten._adaptive_avg_pool3d_backward.default, family="conv")
def adaptive_avg_pool3d_backward(grad, x):
    return _adaptive_avg_backward(grad, x, 3)


# --- max pooling ---------------------------------------------------------------------------------------


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    if dtype == jnp.bool_:
        return False
    return jnp.iinfo(dtype).min


def _per_dim(v, nd, default):
    v = list(v) if v else list(default)
    return v * nd if len(v) == 1 else v


def _plane_offsets(positions, sizes):
    """Flat offsets into a plane of `sizes` from per-axis position tables, broadcast together."""
    flat = 0
    for pos, n in zip(positions, sizes):
        flat = flat * n + pos
    return flat


def _pick(v, valid, flat):
    """Per window (trailing axis): CPU's choice of element, and its flat input offset."""
    k = v.shape[-1]
    vm = jnp.where(valid, v, jnp.asarray(_lowest(v.dtype), v.dtype))
    top = jnp.max(vm, axis=-1, keepdims=True)
    first_top = jnp.argmax(valid & (vm == top), axis=-1)
    if jnp.issubdtype(v.dtype, jnp.floating):
        nan = valid & jnp.isnan(v)
        last_nan = k - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        choice = jnp.where(jnp.any(nan, axis=-1), last_nan, first_top)
    else:
        choice = first_top
    value = jnp.take_along_axis(v, choice[..., None], axis=-1)[..., 0]
    flat = jnp.broadcast_to(jnp.asarray(flat, jnp.int64), v.shape)
    index = jnp.take_along_axis(flat, choice[..., None], axis=-1)[..., 0]
    return value, index


def _pick_pair(a, b):
    """The (value, index) CPU's scan keeps of two window elements: a NaN beats everything and the
    later NaN wins; otherwise the larger value, and the earlier element on a tie. That is a total
    order, so it is associative and XLA may reduce a window in any order."""
    (av, ai), (bv, bi) = a, b
    if jnp.issubdtype(av.dtype, jnp.floating):
        an, bn = jnp.isnan(av), jnp.isnan(bv)
        take_b = jnp.where(an & bn, bi > ai, jnp.where(an | bn, bn, (bv > av) | ((bv == av) & (bi < ai))))
    else:
        take_b = (bv > av) | ((bv == av) & (bi < ai))
    return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)


def _max_pool(x, out_sp, kernel, stride, padding, dilation):
    """One variadic reduce_window over (value, flat input offset) pairs. Half types reduce in
    float32 (exact for a max); padding carries the largest offset, so it never wins a tie."""
    nd = len(kernel)
    lead = x.ndim - nd
    sp = x.shape[lead:]
    hi = [max(0, (out_sp[i] - 1) * stride[i] + (kernel[i] - 1) * dilation[i] + 1 - sp[i] - padding[i])
          for i in range(nd)]
    v = _up(x)
    flat = lax.broadcasted_iota(jnp.int64, sp, 0)
    for i in range(1, nd):
        flat = flat * sp[i] + lax.broadcasted_iota(jnp.int64, sp, i)
    flat = jnp.broadcast_to(flat, x.shape)
    init = (jnp.asarray(_lowest(v.dtype), v.dtype), jnp.asarray(np.iinfo(np.int64).max, jnp.int64))
    value, index = lax.reduce_window(
        (v, flat), init, _pick_pair, (1,) * lead + tuple(kernel), (1,) * lead + tuple(stride),
        [(0, 0)] * lead + [(padding[i], hi[i]) for i in range(nd)],
        window_dilation=(1,) * lead + tuple(dilation))
    return value.astype(x.dtype), index


def _max_pool_args(x, nd, kernel_size, stride, padding, dilation):
    kernel = _per_dim(kernel_size, nd, ())
    return kernel, _per_dim(stride, nd, kernel), _per_dim(padding, nd, (0,)), _per_dim(dilation, nd, (1,))


@lowering(aten.max_pool2d_with_indices.default, family="conv", ctx=True)
def max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, ctx.out_shape[-2:], *_max_pool_args(x, 2, kernel_size, stride, padding, dilation))


@lowering(aten.max_pool3d_with_indices.default, family="conv", ctx=True)
def max_pool3d_with_indices(ctx, x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, ctx.out_shape[-3:], *_max_pool_args(x, 3, kernel_size, stride, padding, dilation))


def _scatter_to_plane(grad, x, indices, nd):
    """grad_input[..., indices[j]] += grad[..., j] over each input plane (float32 for half types)."""
    lead = x.shape[:x.ndim - nd]
    rows = math.prod(lead)
    plane = math.prod(x.shape[x.ndim - nd:])
    g = _up(grad).reshape(rows, -1)
    idx = indices.reshape(rows, -1)
    out = jnp.zeros((rows, plane), g.dtype).at[jnp.arange(rows)[:, None], idx].add(g, mode="drop")
    return out.reshape(x.shape)


@lowering(aten.max_pool2d_with_indices_backward.default, family="conv")
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad, x, indices, 2)


@lowering(aten.max_pool3d_with_indices_backward.default, family="conv")
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad, x, indices, 3)


def _adaptive_max(x, output_size):
    nd = len(output_size)
    lead = x.ndim - nd
    sp = x.shape[lead:]
    v = x
    positions, valids = [], []
    for i, (n_in, n_out) in enumerate(zip(sp, output_size)):
        wins = _adaptive_windows(n_in, n_out)
        width = max((b - a for a, b in wins), default=1)
        pos = np.array([[a + j for j in range(width)] for a, _ in wins], np.int64).reshape(n_out, width)
        ok = np.array([[a + j < b for j in range(width)] for a, b in wins], bool).reshape(n_out, width)
        pos = np.where(ok, pos, 0)
        axis = lead + 2 * i
        v = jnp.take(v, pos.reshape(-1), axis=axis).reshape(v.shape[:axis] + (n_out, width) + v.shape[axis + 1:])
        positions.append(pos)
        valids.append(ok)
    # (..., o1, w1, o2, w2, ...) -> (..., o1, o2, ..., w1 * w2 * ...)
    perm = list(range(lead)) + [lead + 2 * i for i in range(nd)] + [lead + 2 * i + 1 for i in range(nd)]
    v = jnp.transpose(v, perm)
    v = v.reshape(v.shape[:lead + nd] + (math.prod(v.shape[lead + nd:]),))
    grids = []
    for i in range(nd):
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = positions[i].shape
        grids.append((positions[i].reshape(shape), valids[i].reshape(shape)))
    flat = _plane_offsets([g[0] for g in grids], sp)
    valid = functools.reduce(np.logical_and, [g[1] for g in grids])
    full = tuple(output_size) + tuple(p.shape[1] for p in positions)
    flat = np.broadcast_to(flat, full).reshape(tuple(output_size) + (-1,))
    valid = np.broadcast_to(valid, full).reshape(tuple(output_size) + (-1,))
    return _pick(v, valid, flat)


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default, family="conv")
def adaptive_max_pool(x, output_size):
    return _adaptive_max(x, list(output_size))


@lowering(aten.adaptive_max_pool2d_backward.default, family="conv")
def adaptive_max_pool2d_backward(grad, x, indices):
    return _scatter_to_plane(grad, x, indices, 2)


@lowering(aten.adaptive_max_pool3d_backward.default, family="conv")
def adaptive_max_pool3d_backward(grad, x, indices):
    return _scatter_to_plane(grad, x, indices, 3)
