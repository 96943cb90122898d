"""Which functional op a mutating overload stands for: `add_.Tensor` is `add.Tensor` written
into `self`, `add.out` is `add.Tensor` written into `out`. A pure reading of the schemas, made
once per overload; the router, the signature walk and the mutation route all ask it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

aten = torch.ops.aten

_FACTORY_KWARGS = {"dtype", "layout", "device", "pin_memory", "memory_format"}


class InPlace(NamedTuple):
    """`func` writes the result of `functional` into its written arguments `writes` (indices)."""
    functional: object
    fill: tuple  # positional defaults the functional schema lacks: (index, name, default)
    writes: tuple
    foreach: bool  # an in-place foreach op: CPU bumps each tensor's version


class Out(NamedTuple):
    """`func` writes the result of `functional` into its out= arguments `outs` (names)."""
    functional: object
    outs: list
    factory: bool  # the functional form also takes dtype/device (a factory's out= overload)


_VARIANTS: dict = {}
_NONE = object()


def functional_variant(func):
    """An `InPlace` or `Out` for a mutating overload with a functional twin, else None."""
    v = _VARIANTS.get(func, _NONE)
    if v is _NONE:
        v = _VARIANTS[func] = _find(func)
    return v


def _find(func):
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
                return InPlace(cand, _defaults_to_fill(schema, cand._schema), writes, _is_foreach_inplace(func))
            for ov in overloads:
                c = getattr(base, ov)
                if not c._schema.is_mutable and [(a.name, str(a.type)) for a in c._schema.arguments] == want:
                    return InPlace(c, _defaults_to_fill(schema, c._schema), writes, _is_foreach_inplace(func))
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
            return Out(c, [a.name for a in outs], False)
        # factories: the functional form also takes dtype/layout/device/pin_memory
        extra = [h for h in have if h not in want]
        if [h for h in have if h in want] == want and extra and all(n in _FACTORY_KWARGS for n, _ in extra):
            return Out(c, [a.name for a in outs], True)
    return None


def _defaults_to_fill(inplace, functional) -> tuple:
    """Positional defaults the in-place schema has and the functional one lacks (bernoulli_.float
    has p=0.5, bernoulli.p requires p): they are passed explicitly when the caller omitted them."""
    return tuple((i, a.name, a.default_value) for i, (a, b) in enumerate(zip(inplace.arguments, functional.arguments))
                 if not a.kwarg_only and a.has_default_value() and not b.has_default_value())


def _is_foreach_inplace(func) -> bool:
    name = func.__name__.split(".")[0]
    return name.startswith("_foreach_") and name.endswith("_")


