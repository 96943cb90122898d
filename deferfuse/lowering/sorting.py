"""Sorting and selection: sort, argsort, topk, kthvalue-style ops.

CPU PyTorch sorts NaN as larger than every number and, with stable=True, keeps equal keys in
input order. `jnp.argsort(stable=True)` matches both; descending order is taken as the stable
ascending sort of the negated key so equal keys still keep their input order.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lowering


def _key(x, descending):
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    if not descending:
        return x
    if jnp.issubdtype(x.dtype, jnp.floating):
        # NaN stays "largest", so it must come first when descending: map it to -inf-ish
        return jnp.where(jnp.isnan(x), -jnp.inf, -x)
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        return jnp.iinfo(x.dtype).max - x
    return -x.astype(jnp.int64) if x.dtype != jnp.int64 else ~x


def _sort(x, dim, descending):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    idx = jnp.argsort(_key(x, descending), axis=dim, stable=True)
    return jnp.take_along_axis(x, idx, axis=dim), idx.astype(jnp.int64)


@lowering(aten.sort.default, family="misc")
def sort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@lowering(aten.sort.stable, family="misc")
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


@lowering(aten.argsort.default, family="misc")
def argsort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


@lowering(aten.argsort.stable, family="misc")
def argsort_stable(x, *, stable, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


@lowering(aten.topk.default, family="misc")
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    values, idx = _sort(x, dim, descending=largest)
    sl = [slice(None)] * x.ndim
    sl[dim] = slice(0, k)
    return values[tuple(sl)], idx[tuple(sl)]


@lowering(aten.kthvalue.default, family="misc")
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim %= x.ndim
    values, idx = _sort(x, dim, descending=False)
    v = lax.index_in_dim(values, k - 1, axis=dim, keepdims=keepdim)
    i = lax.index_in_dim(idx, k - 1, axis=dim, keepdims=keepdim)
    return v, i
