"""In-place and out= ops: run the functional op, then write its result into the targets.

`add_.Tensor` runs `add.Tensor` and assigns the result to `self`; `add.out` runs `add.Tensor` and
assigns it to `out`. Once a signature has gone that way and checked, an in-place op whose result
replaces each target's whole value (an optimizer's foreach step, `p.add_(...)` on a parameter)
records the functional node straight into its targets (`_INPLACE`), which is the optimizer
step's hot path.
"""
from __future__ import annotations

import torch

from .. import dtypes, pending, rng
from ..lowering import LOWERINGS
from ..meta import run_meta, signature
from ..probe import divides_by_a_zero_number, needs_cpu_probe, run_cpu_probe
from ..record import RECIPES, spec_of
from ..tensor import TpuTensor, redispatch
from ..transfers import assign, assign_out, check_no_overlap, check_no_partial_overlap
from ..variants import InPlace
from .lowered import route_lowered

aten = torch.ops.aten
_record = pending.record


def _fill_defaults(fill, args, kwargs):
    kwargs = dict(kwargs)
    for i, name, default in fill:
        if i >= len(args):
            kwargs.setdefault(name, default)
    return args, kwargs


_CHECKED: set = set()  # signatures whose meta kernel has run
# write one value everywhere: CPU lets them write a view whose elements share memory
_FILLS = (aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default)
# in-place ops whose CPU kernels refuse complex tensors before checking overlap (the others check
# overlap first: `a[:2].lt_(a[1:])` of a complex a is refused for its overlap)
_COMPLEX_FIRST = (aten.clamp_.default, aten.clamp_.Tensor, aten.heaviside_.default)
# CPU refuses an input sharing any element with the target, even all of them (`x.index_add_(0, i, x)`)
_NO_OVERLAP = (aten.scatter_.src, aten.scatter_add_.default, aten.scatter_reduce_.two, aten.index_add_.default,
               aten.index_copy_.default, aten.put_.default)


def route_mutating(func, args, kwargs):
    kind = func._df.variant
    spec = func._df.spec or spec_of(func)
    key, tensors, scalars = signature(spec, args, kwargs)
    if scalars and divides_by_a_zero_number(func, args):
        run_cpu_probe(func, args, kwargs)  # CPU's ZeroDivisionError for an integer `x //= 0`
    if type(kind) is InPlace:
        writes = kind.writes
        several = len(writes) > 1
        target = _written(func, writes, args, kwargs) if several else args[0]
        if not several and type(target) is TpuTensor:
            if func in _NO_OVERLAP or func in _COMPLEX_FIRST and any(t.dtype.is_complex for t in tensors):
                # their CPU kernels check dims and shapes first (fuzzer seed 634), or refuse
                # complex numbers before they look at overlap (seed 5158)
                _check_meta(func, key, args, kwargs)
            check_no_partial_overlap(target, tensors)
            if func in _NO_OVERLAP:
                check_no_overlap(target, tensors[1:])
        if kind.foreach:
            _bump_versions(target)
        r = _INPLACE.get(key)
        if r is not None and _replaceable(r, target):
            _emit_into(r, tensors, scalars, target, kwargs)
            if several:
                return args[0] if func._schema.returns else None
            return None if type(target) is list or type(target) is tuple else target
        _check_meta(func, key, args, kwargs)
        fill = kind.fill
        if fill:
            args, kwargs = _fill_defaults(fill, args, kwargs)
        result = redispatch(kind.functional, args, kwargs)
        if isinstance(target, (list, tuple)):
            if several:
                result = _flat(result)
            for t, res in zip(target, result):
                _check_inplace_shape(t, res)
                assign(t, res)
            if not fill:
                _learn_inplace(kind.functional, key, args, kwargs, tensors, scalars, target)
            return args[0] if several and func._schema.returns else None
        _check_inplace_shape(target, result)
        if type(target) is not TpuTensor:  # a CPU 0-dim tensor written from a tpu one
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{target.device} and tpu:0! (while calling {func})")
        assign(target, result, "fill" if func in _FILLS else None)
        if not fill:
            _learn_inplace(kind.functional, key, args, kwargs, tensors, scalars, target)
        return target
    _check_meta(func, key, args, kwargs)
    functional, out_names, factory = kind
    fkwargs = {k: v for k, v in kwargs.items() if k not in out_names}
    if factory:
        fkwargs["dtype"] = kwargs[out_names[0]].dtype
        fkwargs["device"] = kwargs[out_names[0]].device
    result = redispatch(functional, args, fkwargs)
    outs = [kwargs[n] for n in out_names]
    for o in outs:
        if type(o) is TpuTensor:
            check_no_partial_overlap(o, tensors)
    results = [result] if len(outs) == 1 else list(result)
    for o, r in zip(outs, results):
        if isinstance(o, (list, tuple)):  # a Tensor[] out (split_with_sizes_copy, unbind_copy)
            if len(o) != len(r):
                raise RuntimeError(f"{func}: expected {len(r)} out tensors, got {len(o)}")
            for oo, rr in zip(o, r):
                assign_out(oo, rr)
        else:
            assign_out(o, r)
    if not func._schema.returns:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


# In-place foreach ops (an optimizer's default step): CPU's kernels mark each tensor of the list
# modified, as a single tensor's in-place op is marked above the backend, so that backward
# through a graph that saved a parameter the step has since changed raises instead of silently
# using the new value. (CPU's fused optimizer kernels and AMP's unscale do not.)
_bump_versions = torch.autograd.graph.increment_version


def _flat(values) -> list:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(v)
        else:
            out.append(v)
    return out


def _written(func, writes, args, kwargs) -> list:
    """Every tensor an in-place op with several written arguments writes, in schema order."""
    arguments = func._schema.arguments
    return _flat([args[i] if i < len(args) else kwargs[arguments[i].name] for i in writes])


def _check_inplace_shape(target, result) -> None:
    """An in-place op cannot grow its target (PyTorch checks this in every in-place kernel, but
    not every meta kernel does)."""
    if isinstance(result, torch.Tensor) and result.shape != target.shape:
        raise RuntimeError(
            f"output with shape {list(target.shape)} doesn't match the broadcast shape {list(result.shape)}"
        )


def _check_meta(func, key, args, kwargs) -> None:
    """Run the mutating op's own meta kernel once per signature: it raises PyTorch's errors
    (broadcast into a smaller tensor, a result type that cannot be cast into the target)."""
    if key in _CHECKED:
        return
    try:
        run_meta(func, args, kwargs)
    except NotImplementedError:
        pass  # no meta kernel: the functional op's own checks still run
    except Exception as err:  # noqa: BLE001 - CPU's error for the call, as route_lowered raises it
        if getattr(err, "from_cpu", False):
            raise
        try:
            run_cpu_probe(func, args, kwargs, real_only=True)
        except Exception as cpu:  # noqa: BLE001
            raise cpu.with_traceback(None) from None
        # CPU's kernel takes the call: the refusal was the meta kernel's own (`x.clamp_(min=2+0j)`
        # on a float x, which CPU converts): the functional op's checks and result still apply
    kind = func._df.variant
    if kind is not None and needs_cpu_probe(func, LOWERINGS.get(kind.functional), args, kwargs):
        run_cpu_probe(func, args, kwargs)
    _CHECKED.add(key)


# In-place ops whose functional result replaces each target's whole value (an optimizer's
# `_foreach_mul_`, `p.add_(...)` on a parameter) skip the result tensors and the copy: the
# functional node's outputs become the targets' pending values directly. Keyed by the in-place
# signature; an entry exists only once the general path has run (and checked) that signature.
_INPLACE: dict = {}  # in-place signature -> the functional op's record.Recipe
dtypes.on_default_dtype_change(_INPLACE.clear)


def _learn_inplace(functional, key, args, kwargs, tensors, scalars, target) -> None:
    route = functional._df.route
    if key in _INPLACE or (route is not route_lowered and getattr(route, "inner", None) is not route_lowered):
        return
    fkey, ftensors, fscalars = signature(functional._df.spec or spec_of(functional), args, kwargs)
    r = RECIPES.get(fkey)
    if r is None or r.spec_out == "t" and type(target) in (list, tuple):
        return
    targets = target if type(target) in (list, tuple) else (target,)
    if len(r.outs) != len(targets) or fscalars != scalars or any(a is not b for a, b in zip(ftensors, tensors)):
        return
    for t, (size, stride, dtype, lid, phys, lay, _) in zip(targets, r.outs):
        if not isinstance(t, TpuTensor) or lay is not None or lid != t._lid or 0 in stride:
            return
    if _replaceable(r, target):
        _INPLACE[key] = r


def _replaceable(r, target) -> bool:
    """Per call: each target is a whole, aliased-for-real storage of the result's physical shape
    (a view or a dtype-reinterpreting copy needs the general write)."""
    if type(target) is list or type(target) is tuple:
        for t, o in zip(target, r.outs):
            st = t._st
            if t._lay is not None or st.copy_of is not None or st.shape != o.phys:
                return False
        return True
    st = target._st
    return target._lay is None and st.copy_of is None and st.shape == r.outs[0].phys


def _emit_into(r, tensors, scalars, target, kwargs) -> None:
    if r.rng:
        scalars.extend(rng.key_for(kwargs))
    g, base = _record(r.op, tensors, scalars)
    if type(target) is list or type(target) is tuple:
        for k, t in enumerate(target):
            t._st.set_pending(g, base | k)
    else:
        target._st.set_pending(g, base)
