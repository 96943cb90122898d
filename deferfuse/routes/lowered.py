"""The route of an op with a lowering: walk the call's signature, find (or make) its recipe,
record one node. A call the lowering does not support (its `supports` predicate) takes PyTorch's
decomposition if there is one, else the CPU fallback; a call in a dtype the device's XLA lacks
(lowering/device_limits.py) takes the CPU fallback. A contraction (matmul, conv, attention)
keeps its recipes per float32 matmul precision at the call (precision.py).
"""
from __future__ import annotations

from .. import rng
from ..lowering import LOWERINGS
from ..lowering.device_limits import lacks
from ..meta import meta_args, signature
from ..precision import current as matmul_precision
from ..probe import divides_by_a_zero_number, run_cpu_probe
from ..record import CONTRACTIONS, RECIPES, emit, make_recipe, spec_of
from ..tensor import TpuTensor
from . import expansion, fallback


def route_lowered(func, args, kwargs):
    info = func._df
    n = len(args)
    if n <= info.whole_n and not kwargs:
        # the signature walk's key for such a call is (fid, n, the tensors' layout ids): the
        # recipe it found is kept under the ids alone
        r = None
        if n == 2:
            a, b = args
            if type(a) is TpuTensor and type(b) is TpuTensor:
                r = info.whole.get((a._lid, b._lid))
        elif n == 1 and type(args[0]) is TpuTensor:
            r = info.whole.get(args[0]._lid)
        if r is not None:
            return emit(r, [*args], [], rng.next_key() if r.rng else None)
    spec = info.spec or spec_of(func)
    key, tensors, scalars = signature(spec, args, kwargs)
    r = RECIPES.get(key)
    if r is None:
        why = lacks(func, key, args, kwargs)
        if why is not None:  # a dtype the device's XLA cannot run this op in
            return fallback.run(func, args, kwargs, reason=why)
        low = LOWERINGS[func]
        if low.supports is not None and not low.supports(*meta_args(args, kwargs)):
            return _unsupported(func, args, kwargs)
        r = RECIPES[key] = make_recipe(func, spec, key, args, kwargs, low)
    elif scalars and divides_by_a_zero_number(func, args):
        run_cpu_probe(func, args, kwargs)  # CPU's ZeroDivisionError for an integer `x // 0`
    if 0 < n <= info.whole_n and not kwargs and all(type(a) is TpuTensor for a in args):
        info.whole[key[2] if n == 1 else key[2:4]] = r
    return emit(r, tensors, scalars, rng.key_for(kwargs) if r.rng else None)


def route_contracting(func, args, kwargs):
    """route_lowered for an op that contracts float32 operands: each precision has recipes (and
    Ops) of its own, and the fast path of `a @ b` holds the precision beside the two layout ids."""
    info = func._df
    precision = matmul_precision()
    two = len(args) == 2 and info.whole_n == 2 and not kwargs
    if two:
        a, b = args
        two = type(a) is TpuTensor and type(b) is TpuTensor
        if two:
            r = info.whole.get((a._lid, b._lid, precision))
            if r is not None:
                return emit(r, [a, b], [], rng.next_key() if r.rng else None)
    spec = info.spec or spec_of(func)
    key, tensors, scalars = signature(spec, args, kwargs)
    recipes = CONTRACTIONS[precision]  # not one dict under (key, precision): that hashes key again
    r = recipes.get(key)
    if r is None:
        why = lacks(func, key, args, kwargs)
        if why is not None:
            return fallback.run(func, args, kwargs, reason=why)
        low = LOWERINGS[func]
        if low.supports is not None and not low.supports(*meta_args(args, kwargs)):
            return _unsupported(func, args, kwargs)
        r = recipes[key] = make_recipe(func, spec, key, args, kwargs, low, precision=precision)
    if two:
        info.whole[(*key[2:4], precision)] = r
    return emit(r, tensors, scalars, rng.key_for(kwargs) if r.rng else None)


def _unsupported(func, args, kwargs):
    """A call outside its lowering's `supports`: PyTorch's own expansion, else the CPU."""
    if func in expansion.DECOMPOSITIONS:
        return expansion.route_decomposed(func, args, kwargs)
    return fallback.run(func, args, kwargs, reason="unsupported arguments")
