"""Order a program so that XLA can update donated buffers in place.

A training step reads a weight in three places: the forward, the input gradient of backward,
and the optimizer's update, whose result is the weight's new value in the weight's own
(donated) buffer. The update does not depend on the input gradient, so XLA may schedule it
first; its copy insertion, which must be safe under any order, then copies the old weight
before the step starts (a seventh of the MLP program's thunk time went to one such copy).

`ordered` traces the program to a jaxpr and evaluates it again with the update depending on the
other readers of the old value: the update reads `where(p, 0, old)`, where `p` is a scalar test
that is false for every value (`isnan(e) & isinf(e)`) of one element `e` of each other reader's
result. Values are unchanged, NaNs included; XLA fuses the select into the update and, now that
all reads precede the write, drops the copy. `lax.optimization_barrier` would say this more
plainly, but XLA's CPU pipeline removes barriers before copy insertion.
"""
from __future__ import annotations

import heapq
from typing import Callable

import jax
import jax.numpy as jnp
from jax.extend.core import DropVar, Literal

# primitives XLA folds into the op that reads their result (a layout change or a bitcast): the
# reader to wait for is the op past them, since waiting on a transpose would materialize it
_LAYOUT = frozenset({"transpose", "reshape", "broadcast_in_dim", "squeeze", "expand_dims",
                     "convert_element_type", "slice", "rev", "copy", "copy_p"})


def ordered(raw: Callable, pairs: dict[int, int]) -> Callable:
    """raw(inputs, scalars) -> outputs, with output `pairs[i]` (the new value of input i)
    computed after every other read of input i. Same values, same signature."""
    if not pairs:
        return raw

    def fn(inputs, scalars):
        closed, shape = jax.make_jaxpr(raw, return_shape=True)(inputs, scalars)
        order = _schedule(closed.jaxpr, pairs)
        outs = _eval(closed.jaxpr, closed.consts, jax.tree.leaves((inputs, scalars)), order)
        return jax.tree.unflatten(jax.tree.structure(shape), outs)

    return fn


class _Tie:
    """Input `var` made to depend on `waits` (one result of each of its other readers)."""

    __slots__ = ("var", "waits")

    def __init__(self, var, waits):
        self.var = var
        self.waits = waits


def _schedule(jaxpr, pairs: dict[int, int]) -> list:
    """The equations in an order that respects the ties, each as (equation, {var: tie}) with
    the inputs it reads through a tie, and each tie just before its first reader."""
    eqns = jaxpr.eqns
    plain = [(e, None) for e in eqns]
    producer = {v: k for k, e in enumerate(eqns) for v in e.outvars}

    def ancestors(ks) -> set:
        seen, todo = set(), list(ks)
        while todo:
            k = todo.pop()
            if k not in seen:
                seen.add(k)
                todo.extend(producer[v] for v in eqns[k].invars if not isinstance(v, Literal) and v in producer)
        return seen

    # only equations that reach an output: a lowering's vjp also traces a forward that XLA drops,
    # and waiting on it would make XLA compute it
    live = ancestors([producer[v] for v in jaxpr.outvars if not isinstance(v, Literal) and v in producer])
    readers: dict = {}
    for k in sorted(live):
        for v in eqns[k].invars:
            if not isinstance(v, Literal):
                readers.setdefault(v, []).append(k)

    def real_readers(v) -> list:
        out, todo, seen = [], list(readers.get(v, ())), set()
        while todo:
            k = todo.pop()
            if k not in seen:
                seen.add(k)
                if eqns[k].primitive.name in _LAYOUT:
                    todo.extend(r for o in eqns[k].outvars for r in readers.get(o, ()))
                else:
                    out.append(k)
        return out

    ties = []  # (tie, the equations that read the input through it, the readers it waits for)
    for i, j in pairs.items():
        old, new = jaxpr.invars[i], jaxpr.outvars[j]
        if isinstance(new, Literal) or new not in producer:
            continue
        feeds = ancestors([producer[new]])
        others = [k for k in real_readers(old) if k not in feeds]
        if not others:
            continue
        before = ancestors(others)
        chain = [k for k in readers.get(old, ()) if k in feeds and k not in before]
        waits = [v for k in others for v in eqns[k].outvars[:1]
                 if not isinstance(v, DropVar) and getattr(v.aval, "size", 0) > 0]
        if chain and waits:
            ties.append((_Tie(old, waits), chain, others))
    if not ties:
        return plain

    deps = {k: {producer[v] for v in e.invars if not isinstance(v, Literal) and v in producer}
            for k, e in enumerate(eqns)}
    rank = {k: (k, 0) for k in range(len(eqns))}
    renames: dict[int, dict] = {}
    for n, (tie, chain, others) in enumerate(ties):
        node = ("tie", n)
        deps[node] = set(others)
        rank[node] = (min(chain), -1)
        for k in chain:
            deps[k].add(node)
            renames.setdefault(k, {})[tie.var] = tie
    users: dict = {}
    for node, ds in deps.items():
        for d in ds:
            users.setdefault(d, []).append(node)
    pending = {node: len(ds) for node, ds in deps.items()}
    heap = [(rank[node], n, node) for n, node in enumerate(deps) if not pending[node]]
    heapq.heapify(heap)
    out, popped, seq = [], 0, len(deps)
    while heap:
        node = heapq.heappop(heap)[2]
        popped += 1
        if isinstance(node, int):
            out.append((eqns[node], renames.get(node)))
        for u in users.get(node, ()):
            pending[u] -= 1
            if not pending[u]:
                seq += 1
                heapq.heappush(heap, (rank[u], seq, u))
    if popped != len(deps):  # a tie would make a cycle: keep the traced order
        return plain
    return out


def _after(old, results):
    """`old`, unchanged, as a value that depends on `results` (see the module docstring)."""
    never = None
    for r in results:
        e = r.reshape(-1)[0]
        if jnp.issubdtype(e.dtype, jnp.inexact):
            p = jnp.isnan(e) & jnp.isinf(e)
        else:
            p = (e == 0) & (e == 1)
        never = p if never is None else never | p
    return jnp.where(never, jnp.zeros((), old.dtype), old)


def _eval(jaxpr, consts, args, order) -> list:
    env: dict = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    tied: dict = {}  # tie -> the input's tied value, made at its first reader

    def read(v, ties=None):
        if isinstance(v, Literal):
            return v.val
        if ties is not None and v in ties:
            tie = ties[v]
            if tie not in tied:
                tied[tie] = _after(env[v], [env[w] for w in tie.waits])
            return tied[tie]
        return env[v]

    for eqn, ties in order:
        params = eqn.primitive.get_bind_params(eqn.params)
        with eqn.ctx.manager:
            ans = eqn.primitive.bind(*[read(v, ties) for v in eqn.invars], **params)
        if eqn.primitive.multiple_results:
            env.update(zip(eqn.outvars, ans))
        else:
            env[eqn.outvars[0]] = ans
    return [read(v) for v in jaxpr.outvars]
