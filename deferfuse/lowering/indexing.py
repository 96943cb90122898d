"""Gather/scatter style ops: advanced indexing, index_put, gather, scatter, embedding.

Boolean masks never reach these lowerings: the dispatcher turns them into integer indices first
(a data-dependent shape, so DeferAndFuse flushes), or into a `where` when that is equivalent.
Out-of-range indices are checked in Debug mode only; in Strict and DeferAndFuse XLA clamps them,
as CUDA kernels do not check either.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from .registry import aten, lowering


def _idx(indices):
    return tuple(slice(None) if i is None else i for i in indices)


@lowering(aten.index.Tensor, aten._unsafe_index.Tensor, family="index")
def index(x, indices):
    return x[_idx(indices)]


@lowering(aten.index_put.default, aten._unsafe_index_put.default, family="index")
def index_put(x, indices, values, accumulate=False):
    v = values.astype(x.dtype)
    ref = x.at[_idx(indices)]
    return _update(ref, "add", v) if accumulate else ref.set(v)


@lowering(aten.index_select.default, family="index")
def index_select(x, dim, index):
    if x.ndim == 0:
        return jnp.take(x.reshape(1), index.reshape(-1), axis=0)
    return jnp.take(x, index.reshape(-1), axis=dim % x.ndim)


@lowering(aten.embedding.default, family="index")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.gather.default, family="index")
def gather(x, dim, index, *, sparse_grad=False):
    """An empty index may have any rank (PyTorch only checks ranks when there is work to do)."""
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return jnp.broadcast_to(x, index.shape)
    dim %= x.ndim
    xs = x[tuple(slice(0, n) if d != dim else slice(None) for d, n in enumerate(index.shape))]
    return jnp.take_along_axis(xs, index, axis=dim)


def _update(ref, mode, v):
    """Scatter `v` through `ref` (an `x.at[...]`); on bool, sum is OR and product is AND as on
    CPU (XLA's scatter-add and scatter-multiply reject bool)."""
    if v.dtype == jnp.bool_:
        mode = {"add": "amax", "multiply": "amin"}.get(mode, mode)
    return {"set": ref.set, "add": ref.add, "multiply": ref.multiply, "amax": ref.max, "amin": ref.min}[mode](v)


def _identity(mode, dtype):
    """The neutral element of a scatter reduction in `dtype` (lowest for amax, highest for amin)."""
    if dtype == jnp.bool_:
        return {"add": False, "multiply": True, "amax": False, "amin": True}[mode]
    if mode in ("add", "multiply"):
        return 0 if mode == "add" else 1
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if mode == "amax" else jnp.inf
    info = jnp.iinfo(dtype)
    return info.min if mode == "amax" else info.max


def _coords(index, dim):
    """Full coordinates for a scatter along dim: iota everywhere except the index itself."""
    grids = list(jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij"))
    grids[dim] = index
    return tuple(grids)


def _prep(x, dim, index):
    squeeze = x.ndim == 0
    if squeeze:
        x, index = x.reshape(1), index.reshape(-1) if index.ndim else index.reshape(1)
    return x, (dim % x.ndim), index, squeeze


def _src_part(src, index):
    if not hasattr(src, "shape") or src.ndim == 0:
        return src
    if src.ndim != index.ndim:
        src = src.reshape(index.shape) if src.size == index.size else src
    return src[tuple(slice(0, n) for n in index.shape)]


def _scatter(x, dim, index, src, mode):
    x, dim, index, squeeze = _prep(x, dim, index)
    if index.size == 0:
        return x.reshape(()) if squeeze else x
    c = _coords(index, dim)
    v = jnp.asarray(_src_part(src, index)).astype(x.dtype)
    out = _update(x.at[c], mode, v)
    return out.reshape(()) if squeeze else out


@lowering(aten.scatter.src, aten.scatter.value, family="index")
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


@lowering(aten.scatter.reduce, aten.scatter.value_reduce, family="index")
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, "add" if reduce == "add" else "multiply")


@lowering(aten.scatter_add.default, family="index")
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


@lowering(aten.scatter_reduce.two, family="index")
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    x0, d, ix, squeeze = _prep(x, dim, index)
    if ix.size == 0:
        return x
    c = _coords(ix, d)
    v = _src_part(src, ix).astype(x0.dtype)
    mode = {"sum": "add", "prod": "multiply", "amax": "amax", "amin": "amin", "mean": "add"}[reduce]
    base = x0
    if not include_self:
        base = x0.at[c].set(jnp.asarray(_identity(mode, x0.dtype), x0.dtype))
    out = _update(base.at[c], mode, v)
    if reduce == "mean":
        count = jnp.zeros(x0.shape, jnp.int64).at[c].add(1) + (1 if include_self else 0)
        count = jnp.maximum(count, 1)
        out = out / count if jnp.issubdtype(x0.dtype, jnp.inexact) else jnp.floor_divide(out, count)
        out = out.astype(x0.dtype)
    return out.reshape(()) if squeeze else out


@lowering(aten.index_add.default, family="index")
def index_add(x, dim, index, source, *, alpha=1):
    if x.ndim == 0:
        return x + jnp.sum(source) * alpha
    dim %= x.ndim
    sel = (slice(None),) * dim + (index.reshape(-1),)
    return _update(x.at[sel], "add", (source * alpha).astype(x.dtype))


@lowering(aten.index_copy.default, family="index")
def index_copy(x, dim, index, source):
    if x.ndim == 0:  # no index writes nothing
        return source.reshape(()).astype(x.dtype) if index.size else x
    dim %= x.ndim
    return x.at[(slice(None),) * dim + (index.reshape(-1),)].set(source.astype(x.dtype))


def _cloned_layout(args, kwargs, leaves):
    """CPU's index_fill fills a clone of self, laid out as self is (a transposed or strided self
    gives a result that is not row-major); its meta kernel returns a row-major one (seed 4669)."""
    x = args[0]
    like = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta").clone()
    return [like] if like.stride() != leaves[0].stride() else leaves


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, family="index", meta_fix=_cloned_layout)
def index_fill(x, dim, index, value):
    if x.ndim == 0:  # no index fills nothing
        return jnp.asarray(value).astype(x.dtype).reshape(()) if index.size else x
    dim %= x.ndim
    return x.at[(slice(None),) * dim + (index.reshape(-1),)].set(jnp.asarray(value).astype(x.dtype))


@lowering(aten.take.default, family="index")
def take(x, index):
    return x.reshape(-1)[index]
