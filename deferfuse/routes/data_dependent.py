"""Ops whose result depends on tensor values in a way the graph cannot defer: output shapes set
by data (`nonzero`, `masked_select`, boolean-mask indexing), host-checked conditions
(`_assert_async`, `equal`), and numbers PyTorch reads from tensors (`linspace`'s and
`logspace`'s tensor ends). Each is a sync point: it flushes with cause `data_dependent` (or
`assert`, `bool`, `item`) and the user's source line, then runs at once.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..causes import Cause
from .. import pending, sources, tensor
from ..probe import cpu_error_instead
from ..target import NAME
from ..tensor import TpuTensor, from_concrete, redispatch
from ..transfers import assign, to_host
from . import fallback
from .lowered import route_lowered

aten = torch.ops.aten


def _where():
    return sources.user_frame(3)


def route_assert_async(func, args, kwargs):
    """torch._assert_async(cond[, msg]): read cond now and let CPU's kernel raise if it is zero.
    It has no output, so as a recorded node it was dead and never ran: the assert silently
    never fired. CUDA checks it later on the device; here it is a sync point ("assert")."""
    host = [to_host(a, Cause.ASSERT) if isinstance(a, TpuTensor) else a for a in args]
    with torch.utils._python_dispatch._disable_current_modes():
        func(*host, **kwargs)


def route_equal(func, args, kwargs):
    a, b = args[0], args[1]
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool(_with_bool_cause(lambda: (a == b).all().item()))


def route_tensor_ends(func, args, kwargs):
    """linspace and logspace with tensor ends: PyTorch's kernel reads each 0-dim end with `item()`
    and calls the overload that takes numbers (RangeFactories.cpp), so the ends may be on any
    device and the result goes where the call says (the CPU by default). Here too: each read of a
    tpu end is a sync point, as it is on CUDA. Recording PyTorch's decomposition instead mixed the
    tpu ends into a CPU computation."""
    name = func.__name__.split(".")[0]
    start, end = args[0], args[1]
    dims = [(which, t.dim()) for which, t in (("start", start), ("end", end)) if isinstance(t, torch.Tensor)]
    if any(d for _, d in dims):
        raise RuntimeError(f"{name} only supports 0-dimensional start and end tensors, but got "
                           + " and ".join(f"{which} with {d} dimension(s)" for which, d in dims) + ".")
    start, end = (t.item() if isinstance(t, torch.Tensor) else t for t in (start, end))
    numbers = getattr(aten, name).out if "out" in kwargs else getattr(aten, name).default
    return numbers(start, end, *args[2:], **kwargs)


TENSOR_ENDS = tuple(getattr(getattr(aten, name), f"{ends}{out}") for name in ("linspace", "logspace")
                    for ends in ("Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor") for out in ("", "_out"))


def _with_bool_cause(fn):
    return tensor._with_cause(Cause.BOOL, fn)


def _eager_nonzero(args, kwargs):
    x = args[0]
    v = pending.concrete(x, Cause.DATA_DEPENDENT, _where())
    if v.ndim == 0:  # PyTorch: (1, 0) for a nonzero scalar, (0, 0) otherwise
        cols = jnp.zeros((0, 1 if bool(v != 0) else 0), jnp.int64)
    else:
        cols = jnp.argwhere(v).astype(jnp.int64).T
    # CPU's result is column-major, strides (1, n): the transpose of an (ndim, n) tensor
    return redispatch(aten.t.default, (from_concrete(cols, torch.int64),), {})


def _eager_masked_select(args, kwargs):
    x, mask = args[0], args[1]
    try:
        shape = jnp.broadcast_shapes(tuple(x.shape), tuple(mask.shape))
    except ValueError as err:  # JAX's error type and words: CPU raises RuntimeError
        cpu_error_instead(aten.masked_select.default, args, kwargs, err)
    xv = pending.concrete(x, Cause.DATA_DEPENDENT, _where())
    mv = pending.concrete(mask, Cause.DATA_DEPENDENT, _where()) if isinstance(mask, TpuTensor) else jnp.asarray(mask.numpy())
    out = jnp.broadcast_to(xv, shape)[jnp.broadcast_to(mv, shape)]
    return from_concrete(out, x.dtype)


EAGER = {
    aten.nonzero.default: _eager_nonzero,
    aten.masked_select.default: _eager_masked_select,
}


def route_data_dependent(func, args, kwargs):
    where = _where()
    pending.flush(Cause.DATA_DEPENDENT, where)
    impl = EAGER.get(func)
    if impl is not None:
        return impl(args, kwargs)
    return fallback.run(func, args, kwargs, reason="data-dependent output shape", record=False)


def bool_indices_to_long(indices, cause="data_dependent"):
    """Boolean masks in an index list become long indices (a data-dependent shape: flushes)."""
    out = []
    for ix in indices:
        if isinstance(ix, torch.Tensor) and ix.dtype in (torch.bool, torch.uint8):
            nz = _eager_nonzero((ix if isinstance(ix, TpuTensor) else ix.to(NAME),), {})
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
            m = redispatch(aten.view.default, (m, tuple(m.shape) + (1,) * (x.dim() - m.dim())), {})
            v = values.reshape(()) if isinstance(values, TpuTensor) else values.reshape(()).to(x.dtype)
            result = redispatch(aten.where.self, (m, v, x), {})
            if result.dtype != x.dtype:
                result = redispatch(aten._to_copy.default, (result,), {"dtype": x.dtype})
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
        assign(x, redispatch(aten.index_put.default, (x, indices, values, accumulate), {}))
        return x
    return route_lowered(func, (x, indices, values, accumulate), {})
