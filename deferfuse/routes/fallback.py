"""The CPU fallback: an op with no lowering runs in CPU PyTorch, counted and warned about.

Never silently wrong: every fallback increments `metrics()["cpu_fallbacks"][op]`, warns once per
op naming it, and emits a report event with the user's line; DEFERFUSE_NO_CPU_FALLBACK=1 turns it
into a NotImplementedError naming the op.

Where PyTorch's meta kernel knows the output shapes and the op mutates and draws nothing, the
fallback is *recorded* as a host node (after the first call of its signature, which runs at
once): the fuser splits programs around it and the rest of the flush still fuses. Otherwise the
pending graph is flushed and the op runs at once.
"""
from __future__ import annotations

import warnings

import torch

from .. import events, pending, sources
from ..config import CONFIG
from ..events import METRICS
from ..meta import signature
from ..record import RECIPES, emit, make_recipe, spec_of
from ..tensor import TpuTensor, from_concrete, host_to_jax
from ..transfers import resize, to_cpu

_warned: set[str] = set()
_AT_ONCE: set = set()  # host signatures whose meta kernel lays results out unlike CPU: never recorded
# A random op draws from its generator when it runs. Recorded, it would run at the flush, with the
# generator its recipe kept from the signature's first call, after draws the host made since.
_SEEDED = torch.Tag.nondeterministic_seeded


def _note(func, reason: str) -> None:
    name = str(func)
    if CONFIG.no_cpu_fallback:
        raise NotImplementedError(
            f"'{name}' is not implemented for TPU in deferfuse ({reason}); "
            "unset DEFERFUSE_NO_CPU_FALLBACK to let it run on CPU"
        )
    METRICS.cpu_fallbacks[name] += 1
    where = sources.user_frame(3)
    if name not in _warned:
        _warned.add(name)
        filename, line, _ = sources.parts(where)
        warnings.warn_explicit(
            f"deferfuse: Falling back to CPU for '{name}' ({reason}); this copies its inputs to the host. "
            "See deferfuse.metrics()['cpu_fallbacks'].",
            UserWarning,
            filename,
            line,
        )
    events.emit("fallback", op=name, where=where, reason=reason)


def run(func, args, kwargs, reason: str = "no lowering", record: bool = True):
    walked = _walk(func, args, kwargs)
    _note(func, reason)
    if record and walked is not None and not func._schema.is_mutable and _SEEDED not in func.tags:
        recorded = _try_record(func, args, kwargs, *walked)
        if recorded is not NotImplemented:
            return recorded
    return run_now(func, args, kwargs)


def _walk(func, args, kwargs):
    """The call's signature walk, which also raises PyTorch's error for a CPU tensor (other than
    a 0-dim one) beside tpu tensors, as a lowered op does: run on the host, the call would take
    it (`searchsorted(sorted_tpu, values_cpu)`). None where the walk cannot key the call."""
    try:
        return signature(spec_of(func), args, kwargs)
    except TypeError:
        return None


def _sparse(func, x: torch.Tensor):
    """tpu tensors are strided only. The common way in is nn.Embedding / nn.EmbeddingBag with
    sparse=True, whose backward builds a sparse gradient (raised from backward(): backward.py)."""
    raise NotImplementedError(
        f"deferfuse: tpu tensors cannot have a sparse layout ('{func}' made a {x.layout} tensor). nn.Embedding "
        "and nn.EmbeddingBag with sparse=True make sparse gradients: use sparse=False on tpu (dense gradients, "
        "the same values).")


def _try_record(func, args, kwargs, key, tensors, scalars):
    hkey = ("host", key)
    r = RECIPES.get(hkey)
    if r is not None:
        return emit(r, tensors, scalars)
    if hkey in _AT_ONCE:
        return NotImplemented
    try:
        r = make_recipe(func, spec_of(func), key, args, kwargs, low=None, host=True)
    except Exception:  # noqa: BLE001
        # no meta kernel, a data-dependent shape, a meta kernel with a bug, or bad input:
        # running the CPU kernel now gives the result, or CPU's own error for bad input
        return NotImplemented
    # The first call of a signature runs at once, on the real inputs: a CPU kernel that refuses
    # what the meta kernel let through (a dtype it lacks: cummax of complex; put's source size)
    # raises its own error at the user's line, where a recorded node would fail at the flush.
    # (A rehearsal over stand-in values is not safe: CPU kernels trust their inputs, and CTC
    # loss's crashed the process.) Later calls of a signature that ran are recorded.
    out = run_now(func, args, kwargs)
    if _same_layouts(out, r.outs):
        RECIPES[hkey] = r
    else:  # the meta kernel lays the result out unlike CPU's kernel (angle of a transposed complex
        # tensor): recorded, later calls would disagree with this one, so each runs at once
        _AT_ONCE.add(hkey)
    return out


def _same_layouts(out, outs) -> bool:
    leaves = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
    return len(leaves) == len(outs) and all(
        _significant(t.shape, t.stride()) == _significant(o.size, o.stride) for t, o in zip(leaves, outs))


def _significant(size, stride) -> tuple:
    """The strides that decide a layout: those of dims longer than one, in a tensor with elements."""
    return tuple(s for n, s in zip(size, stride) if n > 1) if all(size) else ()


def run_now(func, args, kwargs):
    """Flush, copy inputs to the host, run on CPU, copy results (and mutated inputs) back."""
    cargs = to_cpu(args)
    ckwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    with torch.utils._python_dispatch._disable_current_modes():
        out = func(*cargs, **ckwargs)
    schema = func._schema
    written = {}
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        orig = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        new = cargs[i] if i < len(args) and not a.kwarg_only else ckwargs.get(a.name)
        for o, n in zip(orig if isinstance(orig, (list, tuple)) else [orig],
                        new if isinstance(new, (list, tuple)) else [new]):
            if isinstance(o, TpuTensor):
                if tuple(o.shape) != tuple(n.shape):
                    resize(o, tuple(n.shape))
                pending.write_concrete(o, host_to_jax(n, str(func)))
                written[id(n)] = o

    def back(x):
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided:
                return _sparse(func, x)
            if id(x) in written:
                return written[id(x)]
            return from_concrete(host_to_jax(x, str(func)), x.dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(back(y) for y in x)
        return x

    return back(out)


def route_fallback(func, args, kwargs):
    return run(func, args, kwargs)
