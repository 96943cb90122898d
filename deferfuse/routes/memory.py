"""Allocation and a tensor's own metadata: uninitialised memory (`empty`, `new_empty`), which
costs nothing until read, and `resize_`, `resize_as_`, `set_` and out= resizing.
"""
from __future__ import annotations

import torch

from .. import device_dtypes, dtypes, tensor
from ..meta import run_meta, signature
from ..record import spec_of
from ..tensor import Storage, TpuTensor, layout_id, new_tensor, offset_of, set_metadata
from ..transfers import resize, resize_output

aten = torch.ops.aten
_UNINIT: dict = {}  # signature -> (size, stride, dtype)
dtypes.on_default_dtype_change(_UNINIT.clear)


def route_uninitialised(func, args, kwargs):
    """empty / empty_strided / new_empty: memory that reads as zeros and costs nothing until read."""
    key = signature(spec_of(func), args, kwargs)[0]
    meta = _UNINIT.get(key)
    if meta is None:
        m = run_meta(func, args, kwargs)
        device_dtypes.check(m.dtype, str(func))  # complex128 on a TPU: refused before it is made
        meta = _UNINIT[key] = (tuple(m.shape), tuple(m.stride()), m.dtype)
    size, stride, dtype = meta
    phys, perm = tensor.phys_layout(size, stride)
    st = Storage(None, phys, dtype)
    return new_tensor(st, size, stride, dtype, layout_id(size, stride, dtype), tensor.layout_for(st, size, stride, 0))


def route_resize_(func, args, kwargs):
    _resize_to(args[0], tuple(args[1]), kwargs.get("memory_format"))
    return args[0]


def route_resize_as_(func, args, kwargs):
    """at::native::resize_as_: resize_ to the template's sizes, then restride for the memory
    format asked for (`preserve_format`: the template's). Its `inplace_view` tag would send it to
    the metadata-only route, which cannot grow the storage an empty out= tensor needs (`torch.lu`
    resizes its outputs with it)."""
    t, template = args[0], args[1]
    fmt = kwargs.get("memory_format")
    if type(t) is not TpuTensor:  # a CPU tensor resized like a tpu one: only its sizes are read
        with torch._C._DisableTorchDispatch():
            return func(t, torch.empty(template.shape, device="meta"), memory_format=fmt)
    if fmt is torch.preserve_format:
        fmt = torch._prims_common.suggest_memory_format(template)
    _resize_to(t, tuple(template.shape), fmt)
    return t


def _resize_to(t: TpuTensor, size: tuple, fmt) -> None:
    """CPU's resize_: a new size makes t contiguous, the same size keeps its strides; a memory
    format, if given, then restrides it (rank-checked as on CPU)."""
    if fmt is torch.preserve_format:
        raise RuntimeError("Unsupported memory formatPreserve")
    stride = None
    if fmt is not None:
        stride = tuple(torch.empty(size, device="meta", memory_format=fmt).stride())
    if size != tuple(t.shape):
        resize(t, size)
    if stride is not None and stride != tuple(t.stride()):
        set_metadata(t, size, stride, offset_of(t))


def route_resize_output_(func, args, kwargs):
    """at::native::resize_output as an op: out= kernels written in Python call it before writing."""
    resize_output(args[0], tuple(args[1]))
    return args[0]


def route_lift_fresh(func, args, kwargs):
    return args[0]


def route_set_source_tensor(func, args, kwargs):
    t, src = args[0], args[1]
    t._st = src._st
    set_metadata(t, tuple(src.shape), tuple(src.stride()), src.storage_offset())
    return t
