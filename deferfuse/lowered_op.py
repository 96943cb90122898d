"""A lowering made into a graph `Op`: the traced function that promotes, calls the lowering and
shapes each result as PyTorch's meta kernel said (`finalize`), or, for a recorded CPU fallback, a
host step that runs PyTorch's CPU kernel between programs (`host_fn`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import rng, views
from .dtypes import cast, numpy_to_torch, to_jax_dtype, to_torch_dtype
from .graph import Op
from .lowering.registry import LowerCtx, promotion_dtypes
from .meta import Placeholder, fill
from .precision import XLA_NAMES
from .tensor import host_to_jax
from .transfers import to_cpu


class LoweringError(RuntimeError):
    """A lowering returned something that does not match PyTorch's meta result (a deferfuse bug)."""


def _participants(spec, tmpl, low) -> list[Placeholder]:
    names = [a.name for a in spec.func._schema.arguments if not a.kwarg_only]
    chosen = low.promote_args
    found: list[Placeholder] = []

    def collect(obj):
        if isinstance(obj, Placeholder) or type(obj) is complex:  # a complex Scalar is static
            found.append(obj)
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                collect(x)

    args, kwargs = tmpl
    for i, a in enumerate(args):
        if chosen is None or names[i] in chosen:
            collect(a)
    for k, v in kwargs.items():
        if chosen is None or k in chosen:
            collect(v)
    return found


def _scalar_proxy(x):
    dt = jnp.dtype(x.dtype) if hasattr(x, "dtype") else None
    if dt is None:
        return x
    if dt == jnp.bool_:
        return True
    if jnp.issubdtype(dt, jnp.integer):
        return 1
    if jnp.issubdtype(dt, jnp.complexfloating):
        return 1j
    return 1.0


def _meta_of(x):
    return torch.empty(tuple(x.shape), dtype=to_torch_dtype(x.dtype), device="meta")


def _flatten(res) -> list:
    """Tensor leaves in order; None (an output PyTorch leaves undefined) is not a leaf."""
    if isinstance(res, (list, tuple)):
        out = []
        for r in res:
            out.extend(_flatten(r))
        return out
    return [] if res is None else [res]


def finalize(name: str, res, outs) -> list:
    """Cast and shape each result as PyTorch's meta kernel said, then lay it out physically."""
    leaves = _flatten(res)
    if len(leaves) != len(outs):
        raise LoweringError(f"{name}: lowering returned {len(leaves)} outputs, PyTorch has {len(outs)}")
    final = []
    for o, (size, stride, dtype, lid, phys, lay, perm) in zip(leaves, outs):
        jd = to_jax_dtype(dtype)
        o = jnp.asarray(o)
        if o.dtype != jd:
            o = o.astype(jd)
        if tuple(o.shape) != size:
            if [d for d in o.shape if d != 1] == [d for d in size if d != 1]:
                o = o.reshape(size)
            elif _broadcastable(o.shape, size):
                o = jnp.broadcast_to(o, size)
            else:
                raise LoweringError(f"{name}: lowering returned shape {tuple(o.shape)}, PyTorch says {size}")
        if perm == "strided":
            o = views.write(jnp.zeros(phys, jd), lay[0], 0, o)
        elif perm is not None:
            o = jnp.transpose(o, perm)
        final.append(o)
    return final


def _broadcastable(a, b) -> bool:
    if len(a) > len(b):
        return False
    return all(x in (1, y) for x, y in zip(reversed(a), reversed(b)))


def make_lowered_op(func, key, low, tmpl, outs, n_scalars, spec, host=False, meta_inputs=(None, None),
                    precision=None) -> Op:
    """The Op of one call signature. `precision` (a contraction's, by PyTorch's name): the
    lowering is traced under jax.default_matmul_precision, so its dots and convolutions carry it."""
    name = str(func)
    out_avals = [(o.phys, to_jax_dtype(o.dtype)) for o in outs]
    use_rng = bool(low is not None and low.rng)
    if host:
        fn = host_fn(func, tmpl, outs)
        return Op(("host", key), name, fn, out_avals, n_scalars, host=True, family="host")
    parts = _participants(spec, tmpl, low) if low.promote else []
    sizes = [o.size for o in outs]
    odtypes = [o.dtype for o in outs]
    xla_precision = None if precision is None else XLA_NAMES[precision]

    def fn(ins, scs):
        ins = list(ins)
        scs = list(scs)
        if parts:
            metas = []
            for p in parts:
                if type(p) is complex:
                    metas.append(p)
                elif p.kind is Placeholder.TENSOR:
                    metas.append(_meta_of(ins[p.index]))
                elif p.kind is Placeholder.CPU_SCALAR:
                    metas.append(_meta_of(scs[p.index]))
                else:
                    metas.append(_scalar_proxy(scs[p.index]))
            comp, _ = promotion_dtypes(low.promote, metas)
            jc = to_jax_dtype(comp)
            for p in parts:
                if type(p) is complex:
                    continue
                if p.kind is Placeholder.TENSOR:
                    if ins[p.index].dtype != jc:
                        ins[p.index] = cast(ins[p.index], jc)
                else:
                    scs[p.index] = jnp.asarray(scs[p.index]).astype(jc)
        args = fill(tmpl[0], ins, scs)
        kwargs = fill(tmpl[1], ins, scs)
        if use_rng:
            kwargs.pop("generator", None)
            kwargs["key"] = rng.key(scs[-2], scs[-1])
        if low.ctx:
            args = (LowerCtx(sizes, odtypes, *meta_inputs), *args)
        if xla_precision is None:
            res = low.fn(*args, **kwargs)
        else:
            with jax.default_matmul_precision(xla_precision):
                res = low.fn(*args, **kwargs)
        return finalize(name, res, outs)

    return Op(key, name, fn, out_avals, n_scalars + (2 if use_rng else 0), family=low.family, precision=precision,
              portable=low.portable)


def host_fn(func, tmpl, outs):
    """The trace-free body of a recorded host node: jax arrays in, jax arrays out."""
    name = str(func)

    def fn(ins, scs):
        tins = [numpy_to_torch(np.asarray(x), to_torch_dtype(x.dtype)) for x in ins]
        tscs = [
            numpy_to_torch(np.asarray(s), to_torch_dtype(np.asarray(s).dtype)).reshape(())
            if isinstance(s, (np.ndarray, np.generic, jax.Array))
            else s
            for s in scs
        ]
        args = to_cpu(fill(tmpl[0], tins, tscs))
        kwargs = {k: to_cpu(v) for k, v in fill(tmpl[1], tins, tscs).items()}
        with torch.utils._python_dispatch._disable_current_modes():
            res = func(*args, **kwargs)
        flat = _flatten(res)  # None (an output CPU leaves undefined) is not a leaf
        arrays = [host_to_jax(r, name) for r in flat]
        return finalize(name, arrays, outs)

    return fn
