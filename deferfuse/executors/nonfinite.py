"""Debug mode's NaN/Inf check: find the op where a non-finite value first appears.

An op whose inputs are all finite and whose floating output is not is either doing what CPU
PyTorch does too (`log(0)`, `std` of one element, a Bessel function at its pole, a masked mean
over an empty mask: programs that often mask such values away afterwards and end finite), or
computing something CPU would not (a lowering's numerics, a deferfuse bug). Only the second is an
error: the op is run again on CPU over the same input values, and the check raises only where
deferfuse's output is non-finite and CPU's is not. Where CPU agrees, it warns once per op and
source line, which still says where the first NaN of a run came from.

DEFERFUSE_DEBUG_NAN_CHECK=raise raises on every NaN/Inf from finite inputs (the old rule, for
hunting one down); 0 turns the check off.
"""
from __future__ import annotations

import math
import warnings

import jax.numpy as jnp
import torch

from ..causes import Cause
from .. import pending, sources
from ..config import CONFIG
from ..tensor import TpuTensor, jax_to_host

_warned: set = set()


def finite_inputs(func, args, kwargs) -> dict | None:
    """The concrete values of the call's tpu inputs by id (kept to rerun the op on CPU: arrays are
    immutable, so an in-place op cannot change them), or None when an input is not finite and the
    op is not the one introducing the NaN (syncs; Debug only)."""
    values: dict[int, object] = {}
    for a in list(args) + list(kwargs.values()):
        for x in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, TpuTensor):
                v = pending.concrete(x, Cause.DEBUG_OP, None)
                values[id(x)] = v
                if (x.dtype.is_floating_point or x.dtype.is_complex) and not bool(jnp.isfinite(v).all()):
                    return None
            elif isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.dtype.is_complex):
                if not bool(torch.isfinite(x).all()):  # a CPU scalar such as masked_fill's -inf
                    return None
    if _divides_by_a_zero_scalar(func, args):
        return None
    return values


def _divides_by_a_zero_scalar(func, args) -> bool:
    """A foreach division by a Python zero: PyTorch's own RAdam divides by its rectification
    term, 0 for its first steps, and takes the reciprocal, so the infinity is intended."""
    if func._overloadpacket.__name__ not in ("_foreach_div", "_foreach_div_"):
        return False
    return any(isinstance(x, (int, float)) and x == 0
               for a in args[1:] for x in (a if isinstance(a, (list, tuple)) else (a,)))


def check(func, args, kwargs, out, done, inputs: dict, where) -> None:
    """After a Debug op: `done` are the storages its flush wrote, `inputs` from `finite_inputs`."""
    if not any((st.dtype.is_floating_point or st.dtype.is_complex) and not bool(jnp.isfinite(st.value).all())
               for st in done):
        return
    if _reported_in_info(func, out):
        return
    cpu_agrees = _cpu_agrees(func, args, kwargs, out, inputs)
    if CONFIG.debug_nan_check == "raise" or cpu_agrees is False:
        why = "where CPU PyTorch's result is finite" if cpu_agrees is False else "(DEFERFUSE_DEBUG_NAN_CHECK=raise)"
        raise RuntimeError(
            f"deferfuse debug: {func} produced NaN or Inf from finite inputs {why} (at {sources.fmt(where)}); "
            "set DEFERFUSE_DEBUG_NAN_CHECK=0 to disable this check")
    if (func, where) not in _warned:
        _warned.add((func, where))
        filename, line, _ = sources.parts(where)
        warnings.warn_explicit(
            f"deferfuse debug: {func} produced NaN or Inf from finite inputs, as CPU PyTorch does for these "
            "values (DEFERFUSE_DEBUG_NAN_CHECK=raise makes this an error)", RuntimeWarning, filename, line)


def _reported_in_info(func, out) -> bool:
    """linalg's *_ex kernels (inv_ex, solve_ex, cholesky_ex, ...) report a singular or indefinite
    input in their `info` output and leave NaN or Inf in the others, as on CPU, for the caller to
    decide: torch.linalg.inv checks `info` next and raises CPU's LinAlgError."""
    names = [r.name for r in func._schema.returns]
    if "info" not in names or not isinstance(out, (tuple, list)):
        return False
    info = out[names.index("info")]
    return isinstance(info, TpuTensor) and bool((pending.concrete(info, Cause.DEBUG_OP, None) != 0).any())


def _cpu_agrees(func, args, kwargs, out, inputs: dict) -> bool | None:
    """Whether CPU PyTorch, given the same input values, is non-finite wherever deferfuse's output
    is; None where it cannot tell (no CPU kernel, a CPU error, outputs that do not pair up)."""
    def host(x):
        if isinstance(x, TpuTensor):
            return jax_to_host(inputs[id(x)], x.dtype).clone() if id(x) in inputs else None
        if isinstance(x, (list, tuple)):
            return type(x)(host(y) for y in x)
        if isinstance(x, torch.device) and x.type == "tpu" or isinstance(x, str) and x.startswith("tpu"):
            return torch.device("cpu")
        return x

    try:
        with torch.no_grad(), torch.utils._python_dispatch._disable_current_modes(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = func(*host(args), **{k: host(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - no CPU kernel (deferfuse's own ops) or one that refuses
        return None
    ours, theirs = _leaves(out), _leaves(want)
    if len(ours) != len(theirs):
        return None
    for got, ref in zip(ours, theirs):
        if not isinstance(got, TpuTensor) or not (got.dtype.is_floating_point or got.dtype.is_complex):
            continue
        bad = ~torch.isfinite(jax_to_host(pending.concrete(got, Cause.DEBUG_OP, None), got.dtype))
        if bad.shape != ref.shape:
            return None
        if bad.any() and torch.isfinite(ref.detach()[bad]).any():
            return False
    return True


def _leaves(x) -> list:
    if isinstance(x, (list, tuple)):
        return [leaf for y in x for leaf in _leaves(y)]
    return [x] if isinstance(x, torch.Tensor) else []
