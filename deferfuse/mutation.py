"""In-place and out= ops: run the functional op, then write its result into the targets.

`add_.Tensor` runs `add.Tensor` and assigns the result to `self`; `add.out` runs `add.Tensor` and
assigns it to `out`. Once a signature has gone that way and checked, an in-place op whose result
replaces each target's whole value (an optimizer's foreach step, `p.add_(...)` on a parameter)
records the functional node straight into its targets (`_INPLACE`), which is the optimizer
step's hot path.
"""
from __future__ import annotations

import torch

from . import engine, rng, special
from .lowering import LOWERINGS
from .meta import cpu_error_instead, needs_cpu_probe, run_cpu_probe, run_meta, signature
from .tensor import TpuTensor

aten = torch.ops.aten
_record = engine.record


def functional_variant(func):
    """add_.Tensor -> add.Tensor; add.out -> add.Tensor (matching non-out arguments)."""
    schema = func._schema
    packet = func._overloadpacket
    name = packet.__name__
    mutable = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if not mutable:
        return None
    if schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write and name.endswith("_"):
        want = [(a.name, str(a.type)) for a in schema.arguments]
        # the functional op returns one value per written argument, in order (a fused
        # optimizer writes params, grads and its state lists)
        writes = tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
        for base_name in (name[:-1], name[:-1] + "_functional"):
            try:
                base = getattr(aten, base_name)
                overloads = base.overloads()
            except (AttributeError, RuntimeError):
                continue
            cand = getattr(base, func._overloadname, None) if func._overloadname in overloads or \
                func._overloadname == "default" and "default" in overloads else None
            if cand is not None and not cand._schema.is_mutable and \
                    [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
                return ("inplace", cand, _defaults_to_fill(schema, cand._schema), writes, _is_foreach_inplace(func))
            for ov in overloads:
                c = getattr(base, ov)
                if not c._schema.is_mutable and [(a.name, str(a.type)) for a in c._schema.arguments] == want:
                    return ("inplace", c, _defaults_to_fill(schema, c._schema), writes, _is_foreach_inplace(func))
        return None
    outs = [a for a in mutable if a.kwarg_only]
    if len(outs) != len(mutable):
        return None
    want = [(a.name, str(a.type)) for a in schema.arguments if a not in outs]
    for ov in packet.overloads():
        c = getattr(packet, ov)
        if c._schema.is_mutable:
            continue
        have = [(a.name, str(a.type)) for a in c._schema.arguments]
        if have == want:
            return ("out", c, [a.name for a in outs], False)
        # factories: the functional form also takes dtype/layout/device/pin_memory
        extra = [h for h in have if h not in want]
        if [h for h in have if h in want] == want and extra and all(n in _FACTORY_KWARGS for n, _ in extra):
            return ("out", c, [a.name for a in outs], True)
    return None


def _defaults_to_fill(inplace, functional) -> tuple:
    """Positional defaults the in-place schema has and the functional one lacks (bernoulli_.float
    has p=0.5, bernoulli.p requires p): they are passed explicitly when the caller omitted them."""
    return tuple((i, a.name, a.default_value) for i, (a, b) in enumerate(zip(inplace.arguments, functional.arguments))
                 if not a.kwarg_only and a.has_default_value() and not b.has_default_value())


def _fill_defaults(fill, args, kwargs):
    kwargs = dict(kwargs)
    for i, name, default in fill:
        if i >= len(args):
            kwargs.setdefault(name, default)
    return args, kwargs


_FUNCTIONAL: dict = {}  # mutating overload -> how it maps to its functional op
_CHECKED: set = set()  # signatures whose meta kernel has run
_FACTORY_KWARGS = {"dtype", "layout", "device", "pin_memory", "memory_format"}


def route_mutating(func, args, kwargs):
    kind = _FUNCTIONAL[func]
    spec = func._df.spec or _dispatch().spec_of(func)
    key, tensors, scalars = signature(spec, args, kwargs)
    if kind[0] == "inplace":
        writes = kind[3]
        several = len(writes) > 1
        target = _written(func, writes, args, kwargs) if several else args[0]
        if not several and type(target) is TpuTensor:
            special.check_no_partial_overlap(target, tensors)
        if kind[4]:
            _bump_versions(target)
        r = _INPLACE.get(key)
        if r is not None and _replaceable(r, target):
            _emit_into(r, tensors, scalars, target, kwargs)
            if several:
                return args[0] if func._schema.returns else None
            return None if type(target) is list or type(target) is tuple else target
        _check_meta(func, key, args, kwargs)
        fill = kind[2]
        if fill:
            args, kwargs = _fill_defaults(fill, args, kwargs)
        result = _dispatch().dispatch(kind[1], args, kwargs)
        if isinstance(target, (list, tuple)):
            if several:
                result = _flat(result)
            for t, res in zip(target, result):
                _check_inplace_shape(t, res)
                special.assign(t, res)
            if not fill:
                _learn_inplace(kind[1], key, args, kwargs, tensors, scalars, target)
            return args[0] if several and func._schema.returns else None
        _check_inplace_shape(target, result)
        if type(target) is not TpuTensor:  # a CPU 0-dim tensor written from a tpu one
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{target.device} and tpu:0! (while calling {func})")
        special.assign(target, result)
        if not fill:
            _learn_inplace(kind[1], key, args, kwargs, tensors, scalars, target)
        return target
    _check_meta(func, key, args, kwargs)
    _, functional, out_names, factory = kind
    fkwargs = {k: v for k, v in kwargs.items() if k not in out_names}
    if factory:
        fkwargs["dtype"] = kwargs[out_names[0]].dtype
        fkwargs["device"] = kwargs[out_names[0]].device
    result = _dispatch().dispatch(functional, args, fkwargs)
    outs = [kwargs[n] for n in out_names]
    for o in outs:
        if type(o) is TpuTensor:
            special.check_no_partial_overlap(o, tensors)
    results = [result] if len(outs) == 1 else list(result)
    for o, r in zip(outs, results):
        if isinstance(o, (list, tuple)):  # a Tensor[] out (split_with_sizes_copy, unbind_copy)
            if len(o) != len(r):
                raise RuntimeError(f"{func}: expected {len(r)} out tensors, got {len(o)}")
            for oo, rr in zip(o, r):
                special.assign_out(oo, rr)
        else:
            special.assign_out(o, r)
    if not func._schema.returns:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


# In-place foreach ops (an optimizer's default step): CPU's kernels mark each tensor of the list
# modified, as a single tensor's in-place op is marked above the backend, so that backward
# through a graph that saved a parameter the step has since changed raises instead of silently
# using the new value. (CPU's fused optimizer kernels and AMP's unscale do not.)
def _is_foreach_inplace(func) -> bool:
    name = func.__name__.split(".")[0]
    return name.startswith("_foreach_") and name.endswith("_")


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
        cpu_error_instead(func, args, kwargs, err)
    if func in _FUNCTIONAL and needs_cpu_probe(func, LOWERINGS.get(_FUNCTIONAL[func][1]), args, kwargs):
        run_cpu_probe(func, args, kwargs)
    _CHECKED.add(key)


# In-place ops whose functional result replaces each target's whole value (an optimizer's
# `_foreach_mul_`, `p.add_(...)` on a parameter) skip the result tensors and the copy: the
# functional node's outputs become the targets' pending values directly. Keyed by the in-place
# signature; an entry exists only once the general path has run (and checked) that signature.
_INPLACE: dict = {}  # in-place signature -> the functional op's dispatch.Recipe


def _learn_inplace(functional, key, args, kwargs, tensors, scalars, target) -> None:
    d = _dispatch()
    route = functional._df.route
    if key in _INPLACE or (route is not d.route_lowered and getattr(route, "inner", None) is not d.route_lowered):
        return
    fkey, ftensors, fscalars = signature(functional._df.spec or d.spec_of(functional), args, kwargs)
    r = d._RECIPES.get(fkey)
    if r is None or r.spec_out == "t" and type(target) in (list, tuple):
        return
    targets = target if type(target) in (list, tuple) else (target,)
    if len(r.outs) != len(targets) or fscalars != scalars or any(a is not b for a, b in zip(ftensors, tensors)):
        return
    for t, (size, stride, dtype, lid, phys, lay) in zip(targets, r.outs):
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
            if t._lay is not None or st.copy_of is not None or st.shape != o[4]:
                return False
        return True
    st = target._st
    return target._lay is None and st.copy_of is None and st.shape == r.outs[0][4]


def _emit_into(r, tensors, scalars, target, kwargs) -> None:
    if r.rng:
        scalars.extend(rng.key_for(kwargs))
    g, base = _record(r.op, tensors, scalars)
    if type(target) is list or type(target) is tuple:
        for k, t in enumerate(target):
            t._st.set_pending(g, base | k)
    else:
        target._st.set_pending(g, base)


def _dispatch():
    """The dispatcher module, which imports this one: the general path re-enters it."""
    from . import dispatch

    return dispatch
