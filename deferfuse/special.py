"""Ops that are not computations: host transfers, copies, uninitialised memory, scalar reads,
and ops whose output shape depends on data.

Host reads are the sync points of DeferAndFuse: each flushes with its cause (`item`, `bool`,
`print`, `to_cpu`, `data_dependent`, ...) and the user's source line.
"""
from __future__ import annotations

import math
import time

import jax.numpy as jnp
import numpy as np
import torch

from . import engine, events, sources, tensor, views
from .config import CONFIG
from .dtypes import cast, to_jax_dtype
from .events import METRICS
from .graph import Op
from .meta import cpu_error_instead, run_meta
from .tensor import (LAYOUTS, Storage, TpuTensor, from_concrete, host_to_jax, jax_to_host, layout_id, new_tensor,
                     offset_of)

aten = torch.ops.aten


def _where():
    return sources.user_frame(3)


# --- reads to the host -------------------------------------------------------------------------


def to_host(t: TpuTensor, default_cause: str) -> torch.Tensor:
    cause = tensor.sync_cause() or default_cause
    where = _where()
    arr = engine.concrete(t, cause, where)
    t0 = time.perf_counter()
    out = jax_to_host(arr, t.dtype)
    dt = time.perf_counter() - t0
    METRICS.sync_wait_seconds += dt
    # a read is a sync point even when an engine cut already computed the value (no flush here)
    METRICS.host_syncs[cause] += 1
    if events.collecting():
        events.emit("sync", cause=cause, where=where, seconds=dt)
    return out


def route_assert_async(func, args, kwargs):
    """torch._assert_async(cond[, msg]): read cond now and let CPU's kernel raise if it is zero.
    It has no output, so as a recorded node it was dead and never ran: the assert silently
    never fired. CUDA checks it later on the device; here it is a sync point ("assert")."""
    host = [to_host(a, "assert") if isinstance(a, TpuTensor) else a for a in args]
    with torch.utils._python_dispatch._disable_current_modes():
        func(*host, **kwargs)


def route_local_scalar_dense(func, args, kwargs):
    host = to_host(args[0], "item")
    return host.item()


def route_to_copy(func, args, kwargs):
    x = args[0]
    device = kwargs.get("device")
    dtype = kwargs.get("dtype")
    if isinstance(x, TpuTensor):
        if device is not None and torch.device(device).type != "tpu":
            host = to_host(x, "to_cpu")
            if dtype is not None and dtype != host.dtype:
                host = host.to(dtype)
            size, stride, _ = LAYOUTS[x._lid]
            if host.stride() != stride and kwargs.get("memory_format") in (None, torch.preserve_format):
                if _dense(size, stride):
                    host = torch.empty_strided(size, stride, dtype=host.dtype).copy_(host)
            return host.to(device) if torch.device(device).type != "cpu" else host
        from .dispatch import route_lowered

        return route_lowered(func, args, kwargs)
    host = x.detach()
    if dtype is not None:
        host = host.to(dtype)
    return from_concrete(host_to_jax(host), host.dtype)


def _dense(size, stride) -> bool:
    from .views import dense_permutation

    return dense_permutation(size, stride) is not None


# --- copies into tpu tensors ---------------------------------------------------------------------


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


def _check_writable(dst: TpuTensor) -> None:
    if dst._st.copy_of is not None:
        raise NotImplementedError(
            f"deferfuse: this tensor is the result of {dst._st.copy_of}, a view PyTorch aliases but deferfuse "
            "computes as a copy; writing into it would not update its base. Write into the base instead."
        )
    size, stride, _ = LAYOUTS[dst._lid]
    if any(s == 0 and n > 1 for n, s in zip(size, stride)) or (dst._lay is not None and dst._lay[0][0] == "gather"
                                                                  and _overlaps(size, stride)):
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


def assign(dst: TpuTensor, src: TpuTensor) -> None:
    """dst[...] = src with PyTorch's copy semantics (cast, broadcast), through dst's view."""
    if dst is src:
        return
    _check_writable(dst)
    if src.shape != dst.shape:
        _check_copy_shapes(dst, src)
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
            g = engine.STREAM.graph
            dst_st.set_pending(g, engine.value_ref(g, sst))
        return
    op = _convert_op(ssize, sdtype, dsize, ddtype)
    g, ref = engine.record(op, [src], None)
    engine.write(dst, ref, g)


def assign_out(out: TpuTensor, result: TpuTensor) -> None:
    """Write a functional result into an out= tensor, resizing it like PyTorch does."""
    resize_output(out, tuple(result.shape))
    assign(out, result)


def resize_output(out: TpuTensor, rsize: tuple) -> None:
    """at::native::resize_output: resize an out= tensor, warning (as CPU does) unless it was empty."""
    if tuple(out.shape) != rsize:
        if out.numel() != 0:
            import warnings

            filename, line, _ = sources.parts(engine.STREAM.where or sources.user_frame(2))
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


def route_copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, TpuTensor):
        _check_copy_shapes(dst, src)
        if isinstance(src, TpuTensor):
            check_no_partial_overlap(dst, (src,))
            assign(dst, src)
            return dst
        _check_writable(dst)
        host = src.detach().to(dst.dtype)
        if tuple(host.shape) != tuple(dst.shape):
            host = host.expand(dst.shape)
        engine.write_concrete(dst, host_to_jax(host))
        return dst
    host = to_host(src, "to_cpu")
    with torch.utils._python_dispatch._disable_current_modes():
        dst.copy_(host)
    return dst


_COPY_CHECKED: set = set()


def _check_copy_shapes(dst, src) -> None:
    key = (tuple(dst.shape), tuple(src.shape))
    if key in _COPY_CHECKED:
        return
    with torch.utils._python_dispatch._disable_current_modes():
        torch.empty(dst.shape, device="meta").copy_(torch.empty(src.shape, device="meta"))
    _COPY_CHECKED.add(key)


# --- allocation and metadata ---------------------------------------------------------------------

_UNINIT: dict = {}


def route_uninitialised(func, args, kwargs):
    """empty / empty_strided / new_empty: memory that reads as zeros and costs nothing until read."""
    from .dispatch import spec_of
    from .meta import signature

    key = signature(spec_of(func), args, kwargs)[0]
    meta = _UNINIT.get(key)
    if meta is None:
        m = run_meta(func, args, kwargs)
        meta = _UNINIT[key] = (tuple(m.shape), tuple(m.stride()), m.dtype)
    size, stride, dtype = meta
    phys, perm = tensor.phys_layout(size, stride)
    st = Storage(None, phys, dtype)
    return new_tensor(st, size, stride, dtype, layout_id(size, stride, dtype), tensor.layout_for(st, size, stride, 0))


def resize(t: TpuTensor, size: tuple) -> None:
    """Resize t to a contiguous `size`. As on CPU, a tensor whose storage has room from its
    offset on stays a view of it (fft_fftfreq fills a slice of its result through `arange(out=)`,
    which resizes the empty slice it was given); otherwise it gets a fresh storage, keeping the
    old contents as a prefix."""
    from .dispatch import set_metadata

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
        from .dispatch import set_metadata

        set_metadata(t, size, stride, offset_of(t))


def route_resize_output_(func, args, kwargs):
    """at::native::resize_output as an op: out= kernels written in Python call it before writing."""
    resize_output(args[0], tuple(args[1]))
    return args[0]


def route_lift_fresh(func, args, kwargs):
    return args[0]


def route_set_source_tensor(func, args, kwargs):
    from .dispatch import set_metadata

    t, src = args[0], args[1]
    t._st = src._st
    set_metadata(t, tuple(src.shape), tuple(src.stride()), src.storage_offset())
    return t


# --- data-dependent output shapes ----------------------------------------------------------------


def _eager_nonzero(args, kwargs):
    x = args[0]
    v = engine.concrete(x, "data_dependent", _where())
    if v.ndim == 0:  # PyTorch: (1, 0) for a nonzero scalar, (0, 0) otherwise
        return from_concrete(jnp.zeros((1 if bool(v != 0) else 0, 0), jnp.int64), torch.int64)
    return from_concrete(jnp.argwhere(v).astype(jnp.int64), torch.int64)


def _eager_masked_select(args, kwargs):
    x, mask = args[0], args[1]
    try:
        shape = jnp.broadcast_shapes(tuple(x.shape), tuple(mask.shape))
    except ValueError as err:  # JAX's error type and words: CPU raises RuntimeError
        cpu_error_instead(aten.masked_select.default, args, kwargs, err)
    xv = engine.concrete(x, "data_dependent", _where())
    mv = engine.concrete(mask, "data_dependent", _where()) if isinstance(mask, TpuTensor) else jnp.asarray(mask.numpy())
    out = jnp.broadcast_to(xv, shape)[jnp.broadcast_to(mv, shape)]
    return from_concrete(out, x.dtype)


EAGER = {
    aten.nonzero.default: _eager_nonzero,
    aten.masked_select.default: _eager_masked_select,
}


def route_data_dependent(func, args, kwargs):
    where = _where()
    engine.flush("data_dependent", where)
    impl = EAGER.get(func)
    if impl is not None:
        return impl(args, kwargs)
    from .lowering import fallback

    return fallback.run(func, args, kwargs, reason="data-dependent output shape", record=False)


def bool_indices_to_long(indices, cause="data_dependent"):
    """Boolean masks in an index list become long indices (a data-dependent shape: flushes)."""
    out = []
    for ix in indices:
        if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
            nz = _eager_nonzero((ix if isinstance(ix, TpuTensor) else ix.to("tpu"),), {})
            out.extend(nz.unbind(1) if ix.dim() > 0 else [nz.reshape(-1)])
        else:
            out.append(ix)
    return out


def _has_mask(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _check_mask_shapes(x, indices) -> None:
    """A mask must have the shape of the dims it indexes; CPU raises IndexError, where taking its
    nonzero positions as indices read other elements, or the wrong rows."""
    dim = 0
    for ix in indices:
        if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
            want = tuple(x.shape[dim:dim + ix.dim()])
            for k, n in enumerate(ix.shape):
                if k >= len(want) or n != want[k]:
                    raise IndexError(f"The shape of the mask {list(ix.shape)} at index {k} does not match the shape "
                                     f"of the indexed tensor {list(x.shape)} at index {dim + k}")
            dim += ix.dim()
        else:
            dim += 1


def route_index(func, args, kwargs):
    """x[indices]: boolean masks become integer indices first (a data-dependent shape)."""
    from .dispatch import route_lowered

    x, indices = args[0], list(args[1])
    _check_index_dtypes(indices)
    if _has_mask(indices):
        _check_mask_shapes(x, indices)
        indices = bool_indices_to_long(indices)
    return route_lowered(func, (x, indices) + tuple(args[2:]), kwargs)


def _check_index_dtypes(indices) -> None:
    # CPU raises IndexError here; PyTorch's meta kernel raises the same message as RuntimeError
    for i in indices:
        if isinstance(i, torch.Tensor) and (i.dtype.is_floating_point or i.dtype.is_complex):
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")


def route_index_put(func, args, kwargs):
    """x[indices] = values. A single mask with a single value is a `where` (no sync); any other
    mask needs its nonzero positions first."""
    from .dispatch import dispatch, route_lowered

    x, indices, values = args[0], list(args[1]), args[2]
    _check_index_dtypes(indices)
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    inplace = func is aten.index_put_.default
    has_mask = _has_mask(indices)
    if has_mask:
        _check_mask_shapes(x, indices)
        m = indices[0]
        if len(indices) == 1 and not accumulate and values.numel() == 1 and isinstance(m, TpuTensor):
            # CPU's masked_fill_ path, taken before any dtype check: a one-element value of any
            # dtype fills (cast as a number), and a uint8 mask is refused there
            if m.dtype != torch.bool:
                with torch.utils._python_dispatch._disable_current_modes():
                    torch.zeros(1).masked_fill_(torch.zeros(1, dtype=m.dtype), 0)  # raises CPU's error
            m = dispatch(aten.view.default, (m, tuple(m.shape) + (1,) * (x.dim() - m.dim())), {})
            v = values.reshape(()) if isinstance(values, TpuTensor) else values.reshape(()).to(x.dtype)
            result = dispatch(aten.where.self, (m, v, x), {})
            if result.dtype != x.dtype:
                result = dispatch(aten._to_copy.default, (result,), {"dtype": x.dtype})
            if inplace:
                assign(x, result)
                return x
            return result
    if func is not aten._unsafe_index_put.default and isinstance(values, torch.Tensor) and values.dtype != x.dtype:
        # CPU requires the source's dtype to be the destination's; XLA would cast. Its message:
        with torch.utils._python_dispatch._disable_current_modes():
            torch.zeros(1, dtype=x.dtype).index_put_((torch.zeros(1, dtype=torch.long),),
                                                     torch.zeros(1, dtype=values.dtype))
    if has_mask:
        indices = bool_indices_to_long(indices)
    if inplace:
        assign(x, dispatch(aten.index_put.default, (x, indices, values, accumulate), {}))
        return x
    return route_lowered(func, (x, indices, values, accumulate), {})


def route_to_dtype(func, args, kwargs):
    """`t.to(dtype)` is everywhere in decompositions; most calls change nothing and return t."""
    x = args[0]
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    copy = args[3] if len(args) > 3 else kwargs.get("copy", False)
    fmt = args[4] if len(args) > 4 else kwargs.get("memory_format")
    if not copy and dtype == x.dtype and fmt in (None, torch.preserve_format):
        return x
    from .dispatch import dispatch

    kw = {"dtype": dtype}
    if fmt is not None:
        kw["memory_format"] = fmt
    return dispatch(aten._to_copy.default, (x,), kw)


def route_equal(func, args, kwargs):
    a, b = args[0], args[1]
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool(_with_bool_cause(lambda: (a == b).all().item()))


def _with_bool_cause(fn):
    return tensor._with_cause("bool", fn)


# Ops taking a 0-dim value tensor, the position of the value, and their twin taking a Python
# scalar. A value that is a CPU tensor is read on the host (no sync: it is not a tpu tensor) and
# the twin runs, as CUDA's kernels do; PyTorch's meta kernels reject it next to meta tensors.
SCALAR_TWINS = {
    aten.masked_fill.Tensor: (2, aten.masked_fill.Scalar),
    aten.masked_fill_.Tensor: (2, aten.masked_fill_.Scalar),
    aten.index_fill.int_Tensor: (3, aten.index_fill.int_Scalar),
    aten.index_fill_.int_Tensor: (3, aten.index_fill_.int_Scalar),
}


# Ops that write a Python number into a tensor of a given dtype, and the number's position:
# CPU checks that it fits (x[0] = 300 into int8, full(..., 256, dtype=uint8) raise); XLA would wrap.
FILL_VALUES = {
    aten.scalar_tensor.default: 0,
    aten.full.default: 1,
    aten.fill.Scalar: 1,
    aten.new_full.default: 2,
    aten.full_like.default: 1,
}


def checked_fill(pos: int, route):
    def route_fill(func, args, kwargs):
        v = args[pos] if len(args) > pos else kwargs.get("fill_value", kwargs.get("value", kwargs.get("s")))
        dtype = kwargs.get("dtype")
        if dtype is None and pos > 0 and isinstance(args[0], torch.Tensor):
            dtype = args[0].dtype
        elif dtype is None and type(v) is float:  # full / scalar_tensor infer the default dtype
            dtype = torch.get_default_dtype()
        if dtype is not None and type(v) in (int, float, complex) and dtype != torch.bool:
            c = cpu_cast(v, dtype)
            if type(v) is complex and not dtype.is_complex:  # 2+0j into float32: CPU writes 2.0
                if len(args) > pos:
                    args = args[:pos] + (c,) + args[pos + 1:]
                else:
                    kwargs = {k: c if x is v else x for k, x in kwargs.items()}
        return route(func, args, kwargs)

    return route_fill


def cpu_cast(v, dtype: torch.dtype):
    """A Python number as CPU converts it to `dtype` (2.5 to 2 for integers), or CPU's error for
    one that does not fit."""
    with torch.utils._python_dispatch._disable_current_modes():
        return torch.empty((), dtype=dtype).fill_(v).item()


# Ops whose CPU kernel converts a keyword number to the tensor's dtype before using it: index_add
# adds 2 * source to an integer tensor for alpha=2.5 (PyTorch's meta kernel refuses that alpha
# outright, and XLA would truncate only the product), and raises for alpha=300 on int8.
CAST_KEYWORDS = {
    aten.index_add.default: "alpha",
    aten.index_add_.default: "alpha",
    aten.index_add.out: "alpha",
}


def cast_keyword(name: str, route):
    def route_cast(func, args, kwargs):
        v = kwargs.get(name)
        dtype = args[0].dtype
        if type(v) in (int, float, complex) and not dtype.is_complex and (
                type(v) is complex or not dtype.is_floating_point):
            kwargs = dict(kwargs, **{name: cpu_cast(v, dtype)})
        return route(func, args, kwargs)

    route_cast.inner = route  # what the in-place fast path and the coverage table look for
    return route_cast


def elsewhere(route):
    """A route for `*_like` and `new_*` factories: `torch.zeros_like(t, device="cpu")` takes
    only a shape and dtype from the tpu tensor, and runs on the device asked for, over a meta
    stand-in for it (which it reads nothing from)."""
    def routed(func, args, kwargs):
        device = kwargs.get("device")
        if device is None or torch.device(device).type == "tpu":
            return route(func, args, kwargs)
        from .meta import to_meta

        with torch.utils._python_dispatch._disable_current_modes():
            return func(*to_meta(args), **kwargs)

    return routed


def scalar_twin(pos: int, twin, route):
    def route_value(func, args, kwargs):
        v = args[pos] if len(args) > pos else kwargs.get("value")
        if type(v) is torch.Tensor and v.dim() == 0 and v.device.type == "cpu":
            from .dispatch import dispatch

            if len(args) > pos:
                args = args[:pos] + (v.item(),) + args[pos + 1:]
            else:
                kwargs = dict(kwargs, value=v.item())
            return dispatch(twin, args, kwargs)
        return route(func, args, kwargs)

    return route_value


HANDLERS = {
    aten._assert_async.default: route_assert_async,
    aten._assert_async.msg: route_assert_async,
    aten._local_scalar_dense.default: route_local_scalar_dense,
    aten._to_copy.default: route_to_copy,
    aten.copy_.default: route_copy_,
    aten.empty.memory_format: route_uninitialised,
    aten.empty_strided.default: route_uninitialised,
    aten.new_empty.default: route_uninitialised,
    aten.new_empty_strided.default: route_uninitialised,
    aten.resize_.default: route_resize_,
    aten.resize_as_.default: route_resize_as_,
    aten._resize_output_.default: route_resize_output_,
    aten.lift_fresh.default: route_lift_fresh,
    aten.set_.source_Tensor: route_set_source_tensor,
    aten.equal.default: route_equal,
    aten.to.dtype: route_to_dtype,
    aten.index.Tensor: route_index,
    aten._unsafe_index.Tensor: route_index,
    aten.index_put.default: route_index_put,
    aten.index_put_.default: route_index_put,
    aten._unsafe_index_put.default: route_index_put,
}
