"""Lowerings from ATen to JAX, one family per file, and the glue that turns one into a graph `Op`.

Importing this package registers every lowering (see registry.py for the decorator).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes, rng, views
from ..dtypes import to_jax_dtype, to_torch_dtype
from ..graph import Op
from ..meta import Placeholder, fill
from .registry import LOWERINGS, LowerCtx, lowering, promotion_dtypes  # noqa: F401


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


def make_lowered_op(func, key, low, tmpl, outs, n_scalars, spec, host=False, meta_inputs=(None, None)) -> Op:
    name = str(func)
    out_avals = [(o[4], to_jax_dtype(o[2])) for o in outs]
    use_rng = bool(low is not None and low.rng)
    if host:
        from .fallback import host_fn

        fn = host_fn(func, tmpl, outs)
        return Op(("host", key), name, fn, out_avals, n_scalars, host=True, family="host")
    parts = _participants(spec, tmpl, low) if low.promote else []
    sizes = [o[0] for o in outs]
    odtypes = [o[2] for o in outs]

    def fn(ins, scs):
        ins = list(ins)
        scs = list(scs)
        if parts:
            metas = []
            for p in parts:
                if type(p) is complex:
                    metas.append(p)
                elif p.kind == "t":
                    metas.append(_meta_of(ins[p.index]))
                elif p.kind == "c":
                    metas.append(_meta_of(scs[p.index]))
                else:
                    metas.append(_scalar_proxy(scs[p.index]))
            comp, _ = promotion_dtypes(low.promote, metas)
            jc = to_jax_dtype(comp)
            for p in parts:
                if type(p) is complex:
                    continue
                if p.kind == "t":
                    if ins[p.index].dtype != jc:
                        ins[p.index] = ins[p.index].astype(jc)
                else:
                    scs[p.index] = jnp.asarray(scs[p.index]).astype(jc)
        args = fill(tmpl[0], ins, scs)
        kwargs = fill(tmpl[1], ins, scs)
        if use_rng:
            kwargs.pop("generator", None)
            kwargs["key"] = rng.key(scs[-2], scs[-1])
        if low.ctx:
            ctx = LowerCtx(sizes, odtypes, *meta_inputs)
            res = low.fn(ctx, *args, **kwargs)
        else:
            res = low.fn(*args, **kwargs)
        return finalize(name, res, outs)

    return Op(key, name, fn, out_avals, n_scalars + (2 if use_rng else 0), family=low.family)


def host_array(x) -> np.ndarray:
    return np.asarray(x)


# register every family
from . import attention, composite_out, creation, elementwise, embedding_bag, factorizations, fft, foreach, indexing, linalg, linear, nn, optim, pooling, random, reduction, rnn, shape, sorting  # noqa: E402,F401
