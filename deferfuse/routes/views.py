"""Views: the output aliases an input, so only metadata is made and nothing is computed
(`view`, `transpose`, `as_strided`, `detach`, in-place views such as `unsqueeze_`). A view that
reinterprets the dtype (`view_as_real`, `view(dtype)`) is computed as a copy instead.
"""
from __future__ import annotations

import torch

from .. import pending, sources, tensor
from ..config import CONFIG
from ..lowering import LOWERINGS
from ..meta import flatten_outputs, meta_args, run_meta, signature, unflatten_outputs
from ..record import spec_of
from ..tensor import LAYOUTS, Storage, TpuTensor, layout_id, new_tensor, offset_of, redispatch, set_metadata
from .lowered import route_lowered

aten = torch.ops.aten
_VIEWS: dict[tuple, tuple] = {}


def route_view(func, args, kwargs):
    # What each output is (size, stride, dtype, layout id, read plan) depends only on the op, its
    # static arguments, the base's layout and where the base sits in its storage: worked out once,
    # then found under a key made straight from the arguments when they are ints and int lists
    # (every view a model makes per step), without the general signature walk.
    base = args[0]
    vkey = made = None
    if not kwargs and type(base) is TpuTensor:
        lay = base._lay
        vkey = [func._df.fid, base._lid, base._st.shape, 0 if lay is None else lay[1]]
        for a in args[1:]:
            ta = type(a)
            if ta is int or a is None:
                vkey.append(a)
            elif ta is list and all(type(x) is int for x in a):
                vkey.append(tuple(a))
            else:
                vkey = None
                break
        if vkey is not None:
            vkey = tuple(vkey)
            made = _VIEW_OUTS.get(vkey)
    if made is None:
        base, made = _view_outputs(func, args, kwargs, vkey)
        if made is None:
            return copying_view(func, args, kwargs)
    if base.is_inference() and not _inference_mode_on():
        # a view of an inference tensor is one too, as on CPU, so that writing through it
        # outside inference_mode raises; made outside the mode, it would pass for a normal tensor
        with torch.inference_mode():
            return _new_views(base._st, made)
    return _new_views(base._st, made)


def _new_views(st: Storage, made: tuple):
    res = [new_tensor(st, size, stride, dtype, lid, vlay) for size, stride, dtype, lid, vlay in made[0]]
    return res[0] if made[1] == "t" else unflatten_outputs(res, made[1])


_inference_mode_on = torch.is_inference_mode_enabled


def _view_outputs(func, args, kwargs, vkey):
    """(base, outputs) of a view not seen before under `vkey` (or any view whose arguments make
    no direct key); outputs None for a view that reinterprets the dtype."""
    spec = func._df.spec or spec_of(func)
    key, tensors, _ = signature(spec, args, kwargs)
    outs = _VIEWS.get(key)
    if outs is None:
        meta_out = run_meta(func, args, kwargs)
        leaves, spec_out = flatten_outputs(meta_out)
        outs = (
            [(tuple(m.shape), tuple(m.stride()), m.storage_offset(), m.dtype) for m in leaves],
            spec_out,
        )
        _VIEWS[key] = outs
    base = tensors[0]
    st = base._st
    off = offset_of(base)
    if vkey is None:
        vkey = (key, st.shape, off)
        made = _VIEW_OUTS.get(vkey)
        if made is not None:
            return base, made
    if any(o[3] != base.dtype for o in outs[0]):
        return base, None
    if len(_VIEW_OUTS) > 200_000:  # offsets that never repeat (a growing KV cache's views)
        _VIEW_OUTS.clear()
    made = _VIEW_OUTS[vkey] = (
        [(size, stride, dtype, layout_id(size, stride, dtype), tensor.layout_for(st, size, stride, off + delta))
         for size, stride, delta, dtype in outs[0]],
        outs[1],
    )
    return base, made


_VIEW_OUTS: dict[tuple, tuple] = {}


def route_alias(func, args, kwargs):
    """detach and alias: a new tensor over the same storage with the same layout. Autograd's
    AccumulateGrad detaches every parameter's gradient on every backward pass, so this skips
    the signature and caches a general view needs."""
    t = args[0]
    size, stride, dtype = LAYOUTS[t._lid]
    return new_tensor(t._st, size, stride, dtype, t._lid, t._lay)


def route_unsafe_view(func, args, kwargs):
    """_unsafe_view aliases its input on CPU (it is a view autograd does not track), and composite
    out= kernels rely on that: kron.out resizes `out`, takes an _unsafe_view of it and writes the
    product into the view. A contiguous input is therefore viewed; anything else is reshaped."""
    if args[0].is_contiguous():
        return redispatch(aten.view.default, args, kwargs)
    return route_lowered(func, args, kwargs)


def copying_view(func, args, kwargs):
    """A view that reinterprets the dtype (view_as_real, view(dtype), .real): computed as a copy.
    Reads are exact; a write into the result would not reach the base, so it raises instead."""
    if func not in LOWERINGS:
        raise NotImplementedError(f"deferfuse: {func} reinterprets its input's dtype and has no lowering")
    if CONFIG.source_lines:  # reached from route_view, which skips the user's line: this one records a node
        pending.PENDING.where = sources.user_frame(1)
    out = route_lowered(func, args, kwargs)
    for t in out if isinstance(out, (list, tuple)) else [out]:
        t._st.copy_of = str(func)
    return out


def route_as_strided(func, args, kwargs):
    base, size, stride = args[0], tuple(args[1]), tuple(args[2])
    off = args[3] if len(args) > 3 and args[3] is not None else kwargs.get("storage_offset")
    off = offset_of(base) if off is None else off
    _check_storage_bounds(base._st, size, stride, off)
    return tensor.view_of(base, size, stride, off)


def _check_storage_bounds(st: Storage, size, stride, off) -> None:
    if any(n == 0 for n in size):
        return
    need = off + 1 + sum((n - 1) * s for n, s in zip(size, stride))
    if need > st.numel:
        item = st.dtype.itemsize
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {off}, and itemsize {item} "
            f"requiring a storage size of {need * item} are out of bounds for storage of size {st.numel * item}"
        )


def route_inplace_view(func, args, kwargs):
    t = args[0]
    margs, mkwargs = meta_args(args, kwargs)
    with torch.utils._python_dispatch._disable_current_modes():
        m = func(*margs, **mkwargs)
    if isinstance(m, (list, tuple)):
        m = m[0]
    size, stride = tuple(m.shape), tuple(m.stride())
    off = m.storage_offset() + (0 if func is aten.as_strided_.default else offset_of(t))
    if func is aten.as_strided_.default:
        _check_storage_bounds(t._st, size, stride, off)
    set_metadata(t, size, stride, off)
    return t
