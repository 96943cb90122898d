"""Argument signatures and cached shape inference.

Every recorded op needs its outputs' size, stride and dtype at once (so `t.shape` never syncs and a
shape error raises at the user's line). PyTorch's meta kernels give exactly CPU's answer but cost
many times an op's recording (docs/performance.md), so results are cached per *signature*: the op plus, per argument, the interned
layout of a tensor, the Python type of a runtime scalar, or the value of a static argument.

The same walk splits the arguments into tensors (graph inputs), runtime scalars (program inputs:
learning rates, `alpha=`, bias corrections) and statics (baked into the program and its key).
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from . import dtypes
from .tensor import LAYOUTS, TpuTensor, from_concrete, host_to_jax

aten = torch.ops.aten

T, TOPT, TLIST, SCALAR, SCALAR_OPT, SCALAR_LIST, STATIC = range(7)

_KIND_OF_TYPE = {
    "Tensor": T,
    "Optional[Tensor]": TOPT,
    "List[Tensor]": TLIST,
    "List[Optional[Tensor]]": TLIST,
    "number": SCALAR,
    "Optional[number]": SCALAR_OPT,
    "List[number]": SCALAR_LIST,
}

# Ops whose Scalar arguments decide the output shape: their values must be part of the key.
_SHAPE_SCALARS = {"arange", "range", "linspace", "logspace"}


class Placeholder:
    """Stands for a graph input (tensor) or runtime scalar in an argument template."""

    TENSOR = "tensor"  # the index-th input tensor
    SCALAR = "scalar"  # the index-th runtime scalar, a Python number
    CPU_SCALAR = "cpu_scalar"  # the index-th runtime scalar, read from a 0-dim CPU tensor

    __slots__ = ("kind", "index")

    def __init__(self, kind: str, index: int):
        self.kind = kind
        self.index = index

    def __repr__(self):
        return f"<{self.kind}{self.index}>"


class ArgSpec:
    """How to walk one op's arguments, from its schema."""

    __slots__ = ("func", "fid", "pos", "kw", "allow_cpu")

    def __init__(self, func, fid: int, static_names=(), allow_cpu=False, runtime_names=()):
        schema = func._schema
        self.func = func
        self.fid = fid
        force_static = func.__name__.split(".")[0].rstrip("_") in _SHAPE_SCALARS
        kinds = {}
        for a in schema.arguments:
            k = _KIND_OF_TYPE.get(str(a.type), STATIC)
            if k in (SCALAR, SCALAR_OPT, SCALAR_LIST) and (force_static or a.name in static_names):
                k = STATIC
            elif a.name in runtime_names and str(a.type) == "float":
                k = SCALAR
            kinds[a.name] = k
        self.pos = [kinds[a.name] for a in schema.arguments if not a.kwarg_only]
        self.kw = kinds
        self.allow_cpu = allow_cpu


_INT = {int}


def static_key(a):
    """A Python value as a key that tells apart exactly what the traced program would (a float by
    its bits: NaN equals itself, -0.0 is not 0.0; a bool from its int)."""
    t = type(a)
    if t is float:
        return ("f", a.hex())
    if t is bool:
        return ("b", a)
    if t is list or t is tuple:
        if set(map(type, a)) <= _INT:  # sizes and dims, the common case, walked in C
            return tuple(a)
        return tuple(static_key(x) for x in a)
    if t is complex:
        return ("c", a.real.hex(), a.imag.hex())
    if isinstance(a, torch.Tensor):
        raise TypeError("tensor in a static argument position")
    if isinstance(a, torch.Generator):
        return ("gen", a.device.type)
    if t is torch.device and a.index and a.type == "tpu":
        raise RuntimeError(f"deferfuse: device {a} does not exist; there is one tpu device, tpu:0 (as CUDA "
                           "reports an invalid device ordinal)")
    return a


def _cpu_scalar(a: torch.Tensor, spec: ArgSpec, tensors, scalars):
    """A CPU tensor next to tpu tensors: 0-dim ones are scalars (like CUDA), others are an error."""
    if a.dim() == 0:
        scalars.append(np.array(dtypes.torch_to_numpy(a)))  # a copy: the tensor may change before a flush
        return ("cpu0", a.dtype)
    if spec.allow_cpu:
        t = from_concrete(host_to_jax(a), a.dtype)
        tensors.append(t)
        return t._lid
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and {a.device}! "
        f"(while calling {spec.func})"
    )


def _part(kind, a, spec, tensors, scalars):
    if kind == T or kind == TOPT:
        if type(a) is TpuTensor:
            tensors.append(a)
            return a._lid
        if a is None:
            return None
        if isinstance(a, TpuTensor):
            tensors.append(a)
            return a._lid
        if isinstance(a, torch.Tensor):
            return _cpu_scalar(a, spec, tensors, scalars)
        t = type(a)
        if (t is float or t is int) and (t is float or -(1 << 63) <= a < (1 << 63)):
            # a Python number where a Tensor goes (`t / 2.5`): a wrapped number, a runtime input
            scalars.append(a)
            return ("py", t)
        return static_key(a)
    if kind == STATIC:
        t = type(a)
        if t is int or a is None or t is str:
            return a
        return static_key(a)
    if kind == TLIST:
        lids = []
        for x in a:
            if type(x) is TpuTensor:
                tensors.append(x)
                lids.append(x._lid)
            else:
                lids.append(_part(T, x, spec, tensors, scalars))
        return tuple(lids)
    if kind == SCALAR or kind == SCALAR_OPT:
        t = type(a)
        if t is float or t is int:
            if t is int and not (-(1 << 63) <= a < (1 << 63)):
                return static_key(a)
            scalars.append(a)
            return t
        if isinstance(a, torch.Tensor):
            return _part(T, a, spec, tensors, scalars)
        return static_key(a)
    if kind == SCALAR_LIST:
        return tuple(_part(SCALAR, x, spec, tensors, scalars) for x in a)
    raise AssertionError(kind)


def signature(spec: ArgSpec, args: tuple, kwargs: dict):
    """(hashable key, tpu tensors in order, runtime scalars in order)."""
    key = [spec.fid, len(args)]
    append = key.append
    tensors: list = []
    scalars: list = []
    pos = spec.pos
    for i, a in enumerate(args):
        kind = pos[i]
        ta = type(a)
        if ta is TpuTensor and (kind == T or kind == TOPT):  # the common case, inline
            tensors.append(a)
            append(a._lid)
        elif kind == STATIC and (ta is int or a is None):
            append(a)
        else:
            append(_part(kind, a, spec, tensors, scalars))
    if kwargs:
        kw = spec.kw
        for name, a in kwargs.items():
            key.append(name)
            key.append(_part(kw[name], a, spec, tensors, scalars))
    return tuple(key), tensors, scalars


def template(spec: ArgSpec, args: tuple, kwargs: dict):
    """The same walk as `signature`, replacing tensors and runtime scalars by placeholders."""
    counters = [0, 0]

    def sub(kind, a):
        if kind in (T, TOPT):
            if isinstance(a, TpuTensor):
                counters[0] += 1
                return Placeholder(Placeholder.TENSOR, counters[0] - 1)
            if isinstance(a, torch.Tensor):
                if a.dim() == 0:
                    counters[1] += 1
                    return Placeholder(Placeholder.CPU_SCALAR, counters[1] - 1)
                counters[0] += 1
                return Placeholder(Placeholder.TENSOR, counters[0] - 1)
            if type(a) in (float, int) and (type(a) is float or -(1 << 63) <= a < (1 << 63)):
                counters[1] += 1
                return Placeholder(Placeholder.SCALAR, counters[1] - 1)
            return a
        if kind == TLIST:
            return [sub(T, x) for x in a]
        if kind in (SCALAR, SCALAR_OPT):
            if type(a) in (float, int) and (type(a) is not int or -(1 << 63) <= a < (1 << 63)):
                counters[1] += 1
                return Placeholder(Placeholder.SCALAR, counters[1] - 1)
            if isinstance(a, torch.Tensor):
                return sub(T, a)
            return a
        if kind == SCALAR_LIST:
            return [sub(SCALAR, x) for x in a]
        return a

    new_args = tuple(sub(spec.pos[i], a) for i, a in enumerate(args))
    new_kwargs = {k: sub(spec.kw[k], v) for k, v in kwargs.items()}
    return new_args, new_kwargs


def fill(obj, tensors, scalars):
    """Replace placeholders in a template (trace time only)."""
    if isinstance(obj, Placeholder):
        return tensors[obj.index] if obj.kind is Placeholder.TENSOR else scalars[obj.index]
    if isinstance(obj, (list, tuple)):
        return type(obj)(fill(x, tensors, scalars) for x in obj)
    if isinstance(obj, dict):
        return {k: fill(v, tensors, scalars) for k, v in obj.items()}
    return obj


# --- meta inference -----------------------------------------------------------------------


def meta_tensor(t: TpuTensor) -> torch.Tensor:
    size, stride, dtype = LAYOUTS[t._lid]
    numel_needed = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(n > 0 for n in size) else 0
    return torch.empty_strided(size, stride, dtype=dtype, device="meta") if numel_needed else torch.empty(
        size, dtype=dtype, device="meta"
    )


def meta_args(args, kwargs) -> tuple:
    """A call's arguments as meta tensors, for meta kernels, `supports=` hooks and lowerings that
    read layouts."""
    return to_meta(args), {k: to_meta(v) for k, v in kwargs.items()}


def to_meta(obj, scalars_iter=None):
    if isinstance(obj, TpuTensor):
        return meta_tensor(obj)
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0:
            return obj.detach().clone()  # CPU scalar tensors stay CPU: they mix with any device
        return obj.to("meta")
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_meta(x) for x in obj)
    if isinstance(obj, torch.device) and obj.type == "tpu":
        return torch.device("meta")
    if isinstance(obj, str) and obj.startswith("tpu"):
        return torch.device("meta")
    return obj


def run_meta(func, args: tuple, kwargs: dict):
    """Run `func` on meta copies of the arguments; exceptions are PyTorch's own."""
    margs = to_meta(args)
    # a meta kernel draws nothing (and PyTorch's refs refuse a generator outright)
    mkwargs = {k: None if k == "generator" else to_meta(v) for k, v in kwargs.items()}
    if "device" in mkwargs and mkwargs["device"] is not None:
        mkwargs["device"] = torch.device("meta")
    with torch.utils._python_dispatch._disable_current_modes(), warnings.catch_warnings():
        # the real call warns (at the user's line) if it must; the meta rehearsal stays quiet
        warnings.simplefilter("ignore")
        return func(*margs, **mkwargs)


def flatten_outputs(out) -> tuple[list, Any]:
    """Tensor leaves of an op result and a spec to rebuild it."""
    if isinstance(out, torch.Tensor):
        return [out], "t"
    if out is None:
        return [], None
    if type(out) is list and all(isinstance(o, torch.Tensor) for o in out):
        return list(out), "tlist"  # a foreach result: rebuilt without walking a spec per tensor
    if isinstance(out, (tuple, list)):
        leaves: list = []
        spec = []
        for o in out:
            sub, s = flatten_outputs(o)
            spec.append((len(leaves), len(sub), s))
            leaves.extend(sub)
        return leaves, (type(out), spec)
    return [], ("const", out)


def unflatten_outputs(leaves: list, spec):
    """The result `flatten_outputs` described; a namedtuple (a decomposition's result) takes its
    items as arguments, a tuple or list one iterable."""
    if spec == "t":
        return leaves[0]
    if spec == "tlist":
        return list(leaves)
    if spec is None:
        return None
    if spec[0] == "const":
        return spec[1]
    typ, parts = spec
    items = [unflatten_outputs(leaves[lo : lo + n], s) for lo, n, s in parts]
    return typ(*items) if hasattr(typ, "_fields") else typ(items)


def numel(size) -> int:
    return math.prod(size)
