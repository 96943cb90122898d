"""The route of an op with a lowering: walk the call's signature, find (or make) its recipe,
record one node. A call the lowering does not support (its `supports` predicate) takes PyTorch's
decomposition if there is one, else the CPU fallback.
"""
from __future__ import annotations

from .. import rng
from ..lowering import LOWERINGS
from ..meta import meta_args, signature
from ..record import RECIPES, emit, make_recipe, spec_of
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
        low = LOWERINGS[func]
        if low.supports is not None and not low.supports(*meta_args(args, kwargs)):
            if func in expansion.DECOMPOSITIONS:  # PyTorch's own expansion before the CPU
                return expansion.route_decomposed(func, args, kwargs)
            return fallback.run(func, args, kwargs, reason="unsupported arguments")
        r = RECIPES[key] = make_recipe(func, spec, key, args, kwargs, low)
    if 0 < n <= info.whole_n and not kwargs and all(type(a) is TpuTensor for a in args):
        info.whole[key[2] if n == 1 else key[2:4]] = r
    return emit(r, tensors, scalars, rng.key_for(kwargs) if r.rng else None)
