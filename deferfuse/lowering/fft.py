"""FFTs. PyTorch's normalization codes: 0 = none, 1 = 1/sqrt(n), 2 = 1/n, applied to the
transform as called (forward or inverse), which maps onto numpy's norm names."""
from __future__ import annotations

import math

import jax.numpy as jnp

from .registry import aten, lowering


def _scale(x, dims, normalization, sizes):
    n = math.prod(sizes[d] for d in dims) if dims else 1
    if normalization == 1:
        return x / jnp.sqrt(jnp.asarray(n, dtype=x.real.dtype))
    if normalization == 2:
        return x / n
    return x


@lowering(aten._fft_c2c.default, family="misc")
def fft_c2c(x, dim, normalization, forward):
    dims = tuple(d % x.ndim for d in dim)
    y = jnp.fft.fftn(x, axes=dims) if forward else jnp.fft.ifftn(x, axes=dims) * math.prod(x.shape[d] for d in dims)
    return _scale(y, dims, normalization, x.shape)


@lowering(aten._fft_r2c.default, family="misc")
def fft_r2c(x, dim, normalization, onesided):
    dims = tuple(d % x.ndim for d in dim)
    y = jnp.fft.fftn(x, axes=dims)
    if onesided:
        last = dims[-1]
        y = y[tuple(slice(0, x.shape[last] // 2 + 1) if i == last else slice(None) for i in range(x.ndim))]
    return _scale(y, dims, normalization, x.shape)


@lowering(aten._fft_c2r.default, family="misc")
def fft_c2r(x, dim, normalization, last_dim_size):
    dims = tuple(d % x.ndim for d in dim)
    sizes = [x.shape[d] for d in dims[:-1]] + [last_dim_size]
    y = jnp.fft.irfftn(x, s=sizes, axes=dims) * math.prod(sizes)
    out_shape = list(x.shape)
    out_shape[dims[-1]] = last_dim_size
    return _scale(y, dims, normalization, tuple(out_shape))
