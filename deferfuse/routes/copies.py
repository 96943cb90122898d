"""Copies between devices and dtypes: `.to("cpu")` and `.item()` (host reads, sync points),
`.to("tpu")`, `copy_` from a tpu or CPU tensor or a number, and `.to(dtype)`.
"""
from __future__ import annotations

import torch

from ..causes import Cause
from .. import pending, views
from ..target import NAME
from ..tensor import LAYOUTS, TpuTensor, from_concrete, host_to_jax, redispatch
from ..transfers import assign, check_copy_shapes, check_no_partial_overlap, check_writable, to_host
from .lowered import route_lowered

aten = torch.ops.aten


def route_local_scalar_dense(func, args, kwargs):
    host = to_host(args[0], Cause.ITEM)
    return host.item()


def route_to_copy(func, args, kwargs):
    x = args[0]
    device = kwargs.get("device")
    dtype = kwargs.get("dtype")
    if isinstance(x, TpuTensor):
        if device is not None and torch.device(device).type != NAME:
            host = to_host(x, Cause.TO_CPU)
            if dtype is not None and dtype != host.dtype:
                host = host.to(dtype)
            size, stride, _ = LAYOUTS[x._lid]
            if host.stride() != stride and kwargs.get("memory_format") in (None, torch.preserve_format):
                if _dense(size, stride):
                    host = torch.empty_strided(size, stride, dtype=host.dtype).copy_(host)
            return host.to(device) if torch.device(device).type != "cpu" else host
        return route_lowered(func, args, kwargs)
    host = x.detach()
    if dtype is not None:
        host = host.to(dtype)
    return from_concrete(host_to_jax(host, str(func)), host.dtype)


def _dense(size, stride) -> bool:
    return views.dense_permutation(size, stride) is not None


def route_copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if type(src) in (bool, int, float, complex):
        # `t.copy_(2)`: PyTorch hands a Python number on as it is; CPU copies it as a 0-dim tensor
        src = torch.tensor(src)
    if isinstance(dst, TpuTensor):
        check_copy_shapes(dst, src)
        # one value (fill_ of a 0-dim tensor comes as a copy_ of it expanded): elements sharing memory get the same
        uniform = "copy" if all(s == 0 or n == 1 for n, s in zip(src.shape, src.stride())) else None
        if isinstance(src, TpuTensor):
            check_no_partial_overlap(dst, (src,))
            assign(dst, src, uniform)
            return dst
        check_writable(dst, uniform)
        host = src.detach().to(dst.dtype)
        if tuple(host.shape) != tuple(dst.shape):
            host = host.expand(dst.shape)
        pending.write_concrete(dst, host_to_jax(host, str(func)))
        return dst
    host = to_host(src, Cause.TO_CPU)
    with torch.utils._python_dispatch._disable_current_modes():
        dst.copy_(host)
    return dst


def route_to_dtype(func, args, kwargs):
    """`t.to(dtype)` is everywhere in decompositions; most calls change nothing and return t."""
    x = args[0]
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    copy = args[3] if len(args) > 3 else kwargs.get("copy", False)
    fmt = args[4] if len(args) > 4 else kwargs.get("memory_format")
    if not copy and dtype == x.dtype and fmt in (None, torch.preserve_format):
        return x
    kw = {"dtype": dtype}
    if fmt is not None:
        kw["memory_format"] = fmt
    return redispatch(aten._to_copy.default, (x,), kw)
