"""Argument checks and conversions that wrap an op's route, where CPU PyTorch's kernel treats an
argument in a way the route alone would not: a 0-dim CPU value tensor, a Python number that must
fit the dtype, a keyword number CPU casts first, a factory asked for another device. The router
(`dispatch.classify`) wraps a route with each that applies to the overload.
"""
from __future__ import annotations

import torch

from ..meta import to_meta
from ..target import NAME
from ..tensor import redispatch

aten = torch.ops.aten


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
    one that does not fit. An integer inside an integer type's range, and a float into float64,
    are what they are without asking CPU (a step counter filled every token would pay a CPU
    tensor for each)."""
    t = type(v)
    if t is int:
        lo, hi = _INT_RANGE.get(dtype, (1, 0))
        if lo <= v <= hi:
            return v
    elif t is float and dtype is torch.float64:
        return v
    with torch.utils._python_dispatch._disable_current_modes():
        return torch.empty((), dtype=dtype).fill_(v).item()


_INT_RANGE = {d: (torch.iinfo(d).min, torch.iinfo(d).max)
              for d in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}


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
            # CPU's kernel returns before converting alpha when self has more than one dim and
            # the index or self is empty (seeds 7404, 9063); a 1-dim self converts it anyway (9117)
            skip = args[0].dim() > 1 and (args[0].numel() == 0 or args[2].numel() == 0)
            kwargs = dict(kwargs, **{name: 1 if skip else cpu_cast(v, dtype)})
        return route(func, args, kwargs)

    route_cast.inner = route  # what the in-place fast path and the coverage table look for
    return route_cast


def other_device(route):
    """A route for `*_like` and `new_*` factories: `torch.zeros_like(t, device="cpu")` takes
    only a shape and dtype from the tpu tensor, and runs on the device asked for, over a meta
    stand-in for it (which it reads nothing from)."""
    def routed(func, args, kwargs):
        device = kwargs.get("device")
        if device is None or torch.device(device).type == NAME:
            return route(func, args, kwargs)
        with torch.utils._python_dispatch._disable_current_modes():
            return func(*to_meta(args), **kwargs)

    return routed


def scalar_twin(pos: int, twin, route):
    def route_value(func, args, kwargs):
        v = args[pos] if len(args) > pos else kwargs.get("value")
        if type(v) is torch.Tensor and v.dim() == 0 and v.device.type == "cpu":
            if len(args) > pos:
                args = args[:pos] + (v.item(),) + args[pos + 1:]
            else:
                kwargs = dict(kwargs, value=v.item())
            return redispatch(twin, args, kwargs)
        return route(func, args, kwargs)

    return route_value
