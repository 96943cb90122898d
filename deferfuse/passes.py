"""Rewrites of a group program's jaxpr before XLA sees it, for what XLA leaves undone.

`fold_transposes`: a matrix product whose operand is a transpose (`x @ w.T`, the weight of
every linear layer, read through a transposed view) takes the transposed operand as it is, its
contracting and batch dimensions renumbered, wherever the product's output order allows. XLA:CPU
does not fold such a transpose itself: it copies the weight transposed on every call and, for
the small products of a decode step, emits the product as a plain loop instead of a matrix
kernel (docs/performance.md). The product computed is the same; only the operand layout XLA
reads changes. Other backends choose operand layouts themselves, and skip the pass
(cache/plans.py).
"""
from __future__ import annotations

from typing import Callable

import jax
from jax.extend.core import ClosedJaxpr, Var, jaxpr_as_fun
from jax.extend.core.primitives import dot_general_p, transpose_p


def fold_transposes(fn: Callable) -> Callable:
    """fn, traced once to a jaxpr, rewritten, and evaluated in the enclosing trace."""

    def folded(*args):
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        rewritten = _fold(closed)
        outs = jaxpr_as_fun(rewritten)(*jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    folded.unfolded = fn  # for measuring what the pass buys (bench/transposes.py)
    return folded


def _fold(closed: ClosedJaxpr) -> ClosedJaxpr:
    jaxpr = closed.jaxpr
    perm_of: dict = {}  # transposed var -> (its operand, the permutation)
    eqns = []
    changed = False
    for eqn in jaxpr.eqns:
        if eqn.primitive is transpose_p:
            perm_of[eqn.outvars[0]] = (eqn.invars[0], tuple(eqn.params["permutation"]))
        elif eqn.primitive is dot_general_p:
            new = _fold_dot(eqn, perm_of)
            if new is not eqn:
                eqn, changed = new, True
        eqns.append(eqn)
    if not changed:
        return closed
    return ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)


def _fold_dot(eqn, perm_of: dict):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    dims = [[lc, lb], [rc, rb]]
    invars = list(eqn.invars)
    for side in (0, 1):
        v = invars[side]
        hit = perm_of.get(v) if isinstance(v, Var) else None
        if hit is None:
            continue
        base, perm = hit
        contract, batch = dims[side]
        free = [d for d in range(len(perm)) if d not in contract and d not in batch]
        # the product lists an operand's free dimensions in that operand's order: they must keep
        # their order through the permutation, or the output would come out transposed
        mapped = [perm[d] for d in free]
        if mapped != sorted(mapped):
            continue
        dims[side] = [tuple(perm[d] for d in contract), tuple(perm[d] for d in batch)]
        invars[side] = base
    if invars == list(eqn.invars):
        return eqn
    (lc, lb), (rc, rb) = dims
    params = dict(eqn.params, dimension_numbers=((lc, rc), (lb, rb)))
    return eqn.replace(invars=invars, params=params)
