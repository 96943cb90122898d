"""Values crossing between the host and tpu tensors, and between tpu tensors: reads to the host
(the sync points of DeferAndFuse, each flushing with its cause and the user's source line), and
writes into a tpu tensor with PyTorch's copy semantics (cast, broadcast, through a view, resize).
"""
from __future__ import annotations

import math
import time
import warnings

import jax.numpy as jnp
import numpy as np
import torch

from .causes import Cause
from . import events, pending, sources, tensor, views
from .dtypes import cast, to_jax_dtype
from .events import METRICS
from .graph import Op
from .target import NAME
from .tensor import LAYOUTS, Storage, TpuTensor, jax_to_host, layout_id, new_tensor, offset_of, set_metadata


def _where():
    return sources.user_frame(3)


# --- reads to the host -------------------------------------------------------------------------


def to_host(t: TpuTensor, default_cause: str) -> torch.Tensor:
    cause = tensor.sync_cause() or default_cause
    where = _where()
    arr = pending.concrete(t, cause, where)
    t0 = time.perf_counter()
    out = jax_to_host(arr, t.dtype)
    dt = time.perf_counter() - t0
    METRICS.sync_wait_seconds += dt
    # a read is a sync point even when an engine cut already computed the value (no flush here)
    METRICS.host_syncs[cause] += 1
    if events.collecting():
        events.emit("sync", cause=cause, where=where, seconds=dt)
    return out


def to_cpu(obj, cause=Cause.CPU_FALLBACK):
    """A call's arguments with every tpu tensor read to the host (a sync point), for a CPU kernel."""
    if isinstance(obj, TpuTensor):
        # a clone: host copies are NumPy-backed, and CPU kernels may resize their out= arguments
        return to_host(obj, cause).clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(x, cause) for x in obj)
    if isinstance(obj, torch.device) and obj.type == NAME:
        return torch.device("cpu")
    if isinstance(obj, str) and obj.startswith(NAME):
        return "cpu"
    return obj




# --- writes into tpu tensors ------------------------------------------------------------------


def _convert_op(ssize, sdtype, dsize, ddtype) -> Op:
    jd = to_jax_dtype(ddtype)
    key = ("convert", ssize, sdtype, dsize, ddtype)

    def make():
        def fn(ins, scs):
            x = ins[0]
            if x.dtype != jd:
                x = cast(x, jd)
            if tuple(x.shape) != dsize:
                x = jnp.broadcast_to(x, dsize)
            return [x]

        return Op(key, "aten.copy_.default", fn, [(dsize, jd)], 0, family="elementwise")

    return Op.intern(key, make)


def check_writable(dst: TpuTensor, uniform: str | None = None) -> None:
    """Refuse a write CPU refuses (into a view with a zero stride) or one whose result would be
    undefined (into a view whose elements share memory). `uniform`: every element gets the same
    value, so sharing is harmless: "fill" (fill_, zero_, which CPU lets write even an expanded
    view) or "copy" (copy_ of one value, refused by CPU only where a stride is 0)."""
    if dst._st.copy_of is not None:
        raise NotImplementedError(
            f"deferfuse: this tensor is the result of {dst._st.copy_of}, a view PyTorch aliases but deferfuse "
            "computes as a copy; writing into it would not update its base. Write into the base instead."
        )
    size, stride, _ = LAYOUTS[dst._lid]
    if uniform == "fill" or 0 in size:  # a fill, or nothing to write
        return
    if any(s == 0 and n > 1 for n, s in zip(size, stride)) or (
            uniform is None and dst._lay is not None and dst._lay[0][0] == "gather" and _overlaps(size, stride)):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single memory "
            "location. Please clone() the tensor before performing the operation."
        )


def check_no_partial_overlap(target: TpuTensor, inputs) -> None:
    """Refuse, as CPU does, to write a view from another view of the same storage that shares
    some of its elements; deferfuse would compute as if the input were cloned first."""
    st = target._st
    for t in inputs:
        if t._st is st and t is not target and views.partially_overlap(_view_of(t), _view_of(target)):
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                "single memory location. Please clone() the tensor before performing the operation.")


def check_no_overlap(target: TpuTensor, inputs) -> None:
    """Refuse, as CPU's scatter and index kernels do, an input that shares any element with the
    target, the target itself included (`x.scatter_add_(0, i, x)`)."""
    st = target._st
    for t in inputs:
        if t._st is st and (t is target or _same_dense_view(t, target)
                            or views.partially_overlap(_view_of(t), _view_of(target))):
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                "single memory location. Please clone() the tensor before performing the operation.")


def _same_dense_view(a: TpuTensor, b: TpuTensor) -> bool:
    """Whether two views are one, and one CPU judges: like its overlap check, CPU lets through
    a view that is not dense in any dim order (`x[::2].scatter_add_(1, i, x[::2])`: seed 910)."""
    va = _view_of(a)
    return va == _view_of(b) and math.prod(va[0]) > 0 and views.dense_permutation(va[0], va[1]) is not None


def _view_of(t: TpuTensor) -> tuple:
    size, stride, _ = LAYOUTS[t._lid]
    return size, stride, offset_of(t)


def _overlaps(size, stride) -> bool:
    """Whether two elements of the view share an address. Strides that each pass the furthest
    address the smaller ones reach cannot collide (a batched diagonal: strides 4 and 9 over
    3 and 5 elements); otherwise the addresses are counted, up to a size."""
    dims = sorted((s, n) for n, s in zip(size, stride) if n > 1)
    reach = 0
    for s, n in dims:
        if s <= reach:
            break
        reach += s * (n - 1)
    else:
        return False
    if dims[0][0] == 0 or math.prod(n for _, n in dims) > 1 << 22:
        return True
    addresses = np.zeros((), np.int64)
    for s, n in dims:
        addresses = np.add.outer(addresses, np.arange(n, dtype=np.int64) * s)
    return np.unique(addresses).size < addresses.size


def assign(dst: TpuTensor, src: TpuTensor, uniform: str | None = None) -> None:
    """dst[...] = src with PyTorch's copy semantics (cast, broadcast), through dst's view.
    `uniform`: src is one value throughout (see `check_writable`)."""
    if dst is src:
        return
    check_writable(dst, uniform)
    if src.shape != dst.shape:
        check_copy_shapes(dst, src)
    dsize, _, ddtype = LAYOUTS[dst._lid]
    ssize, _, sdtype = LAYOUTS[src._lid]
    sst = src._st
    if sst.error is not None:
        raise sst.error
    if dst._lay is None and src._lay is None and ddtype == sdtype and dst._st.shape == sst.shape:
        # values are immutable: sharing one is a copy that costs nothing
        dst_st = dst._st
        if sst.graph is not None:
            dst_st.set_pending(sst.graph, sst.ref)
        elif sst.value is not None:
            dst_st.set_value(sst.value)
        else:
            g = pending.PENDING.graph
            dst_st.set_pending(g, pending.value_ref(g, sst))
        return
    op = _convert_op(ssize, sdtype, dsize, ddtype)
    g, ref = pending.record(op, [src], None)
    pending.write(dst, ref, g)


def assign_out(out: TpuTensor, result: TpuTensor) -> None:
    """Write a functional result into an out= tensor, resizing it like PyTorch does."""
    resize_output(out, tuple(result.shape))
    assign(out, result)


def resize_output(out: TpuTensor, rsize: tuple) -> None:
    """at::native::resize_output: resize an out= tensor, warning (as CPU does) unless it was empty."""
    if tuple(out.shape) != rsize:
        if out.numel() != 0:
            filename, line, _ = sources.parts(pending.PENDING.where or sources.user_frame(2))
            warnings.warn_explicit(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, which "
                f"does not match the required output shape {list(rsize)}. This behavior is deprecated, and in a "
                "future PyTorch release outputs will not be resized unless they have zero elements. You can "
                "explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
                UserWarning,
                filename,
                line,
            )
        resize(out, rsize)


_COPY_CHECKED: set = set()


def check_copy_shapes(dst, src) -> None:
    key = (tuple(dst.shape), tuple(src.shape))
    if key in _COPY_CHECKED:
        return
    with torch.utils._python_dispatch._disable_current_modes():
        torch.empty(dst.shape, device="meta").copy_(torch.empty(src.shape, device="meta"))
    _COPY_CHECKED.add(key)


def resize(t: TpuTensor, size: tuple) -> None:
    """Resize t to a contiguous `size`. As on CPU, a tensor whose storage has room from its
    offset on stays a view of it (fft_fftfreq fills a slice of its result through `arange(out=)`,
    which resizes the empty slice it was given); otherwise it gets a fresh storage, keeping the
    old contents as a prefix."""
    size = tuple(size)
    stride = views.contiguous_strides(size)
    off = offset_of(t)
    n = math.prod(size)
    if t._st.copy_of is None and off + n <= t._st.numel:
        set_metadata(t, size, stride, off)
        return
    old_numel = t.numel()
    new = Storage(None, size, t.dtype)
    if old_numel and n:
        keep = min(old_numel, n)
        flat_old = t.detach().reshape(-1)[:keep]
        tmp = new_tensor(new, size, stride, t.dtype, layout_id(size, stride, t.dtype), None)
        flat_new = tmp.view(-1)[:keep]
        assign(flat_new, flat_old)
    t._st = new
    set_metadata(t, size, stride, 0)
