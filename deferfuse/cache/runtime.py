"""Running a compiled group program, donating the buffers of inputs nothing else holds.

The key leaves out which inputs a flush may donate (reuse for its outputs): that depends on what
else holds them, known only at the call, so each compiled group keeps a few donating variants of
its program (`Compiled`); compiling one on a cache hit is counted as a compile.
"""
from __future__ import annotations

import sys
from typing import Any


from .. import program, spmd, target
from . import stored
from ..config import CONFIG
from ..events import METRICS


class Compiled:
    """fn(inputs, scalars) -> outputs of one group program: a one-group flush (then all graph
    scalars, and the values of out_refs in their order) or one step of a larger plan.

    The program itself is the group program, so a layer flushed alone shares the one compiled
    for the same layer as a group of a larger flush. `run` also donates the buffers of inputs
    nothing else holds (the old values of parameters and optimizer state an in-place update
    replaces, temporaries already dropped) to outputs of the same shape and dtype: XLA then
    writes the new values in place, so a training step needs no second copy of its state and
    the call allocates nothing for those outputs.
    """

    __slots__ = ("key", "fn", "ids", "pack", "back", "donors", "budget", "nbytes", "variants", "compiled",
                 "in_avals", "out_avals", "stored")

    def __init__(self, key, fn, ids, back, in_avals, out_avals, expect=None, layout=None, stored=None):
        self.key = key
        self.fn = fn
        self.stored = stored  # the program's name in deferfuse's store on disk (stored.py), if it has one
        self.ids = ids
        # where the program's packed scalars are, as positions in the list the caller passes
        self.pack = None if layout is None else tuple(
            part if ids is None else tuple(ids[k] for k in part) for part in layout)
        self.back = back
        self.in_avals = in_avals
        self.out_avals = out_avals
        budget: dict = {}
        for av in out_avals:
            budget[av] = budget.get(av, 0) + 1
        self.budget = budget
        # inputs that could alias an output, with the aval they would take
        # (with the reference count that means nothing else holds it: see `donatable`)
        self.donors = [(i, av, ONLY_THE_LIST if expect is None else expect[i])
                       for i, av in enumerate(in_avals) if av in budget]
        self.nbytes = {i: nbytes(*av) for i, av, _ in self.donors}
        # donated positions -> (program, the order it takes them in, the kept positions, where
        # each output lands)
        self.variants: dict[tuple, tuple] = {(): (fn, (), tuple(range(len(in_avals))), back)}
        self.compiled = 0  # programs this object ran first (each one an XLA compile)

    def __call__(self, inputs, scalars):
        fn = self.fn
        packed = self._scalars(scalars)
        run = _RAN.get(fn)
        if run is None:
            run = self._first(fn, self.stored, (inputs, packed))
        return self._finish(run(inputs, packed))

    def run(self, inputs, scalars, replaces=None):
        """Like calling it, donating what `donatable` finds. `replaces()` says which output is the
        new value of which input (see `_replaces`); the first call with a new donation pattern
        asks it, so that each donated buffer takes its own input's new value. XLA then updates
        it in place, where a buffer handed to another output of its shape costs a copy.

        The caller holds signal handlers (`interrupts.hold`) until the outputs are in their
        storages: an exception from one in between would lose them with the donated inputs."""
        if not self.donors or not CONFIG.donate:
            return self(inputs, scalars)
        mask = self.donatable(inputs)
        if mask not in self.variants:
            if len(self.variants) > _MAX_VARIANTS:  # a pattern that keeps changing: stop compiling
                mask = max((m for m in self.variants if set(m) <= set(mask)), key=len)
            else:
                pairs = replaces() if replaces is not None else {}
                if self._prefer(pairs):
                    mask = self.donatable(inputs)
                if mask not in self.variants:
                    self.variants[mask] = self._variant(mask, pairs)
        return self.run_variant(mask, inputs, scalars)

    def run_variant(self, mask: tuple, inputs, scalars):
        """Run the variant that donates the inputs at `mask` (compiled here on its first call)."""
        if not mask:
            return self(inputs, scalars)
        fn, give, kept, back = self.variants[mask]
        args = ([inputs[i] for i in kept], [inputs[i] for i in give], self._scalars(scalars))
        run = _RAN.get(fn)
        if run is None:
            run = self._first(fn, _NAMES.get(fn), args)
        m = METRICS
        m.buffers_donated += len(mask)
        nbytes = self.nbytes
        m.bytes_donated += sum([nbytes[i] for i in mask])
        outs = run(*args)
        return outs if back is None else [outs[k] for k in back]

    def _prefer(self, replaces: dict[int, int]) -> bool:
        """Offer the inputs that an output replaces first, so that dead temporaries of the same
        shape (a gradient read for the last time) do not take the outputs they would alias."""
        donors = sorted(self.donors, key=lambda d: d[0] not in replaces)
        if donors == self.donors:
            return False
        self.donors = donors
        return True

    def _variant(self, mask: tuple, replaces: dict[int, int]) -> tuple:
        """The donating program for `mask`, with the donated inputs and the outputs reordered so
        that JAX, which hands each output the first unclaimed donated input of its shape, pairs
        every input with its own new value; the rest pair as before."""
        back = self.back
        raw = (lambda k: k) if back is None else back.__getitem__
        paired, outs, taken = [], [], set()
        for i in mask:
            k = replaces.get(i)
            if k is not None:
                j = raw(k)
                if j not in taken and self.in_avals[i] == self.out_avals[j]:
                    paired.append(i)
                    outs.append(j)
                    taken.add(j)
        first = set(paired)
        give = tuple(paired) + tuple(i for i in mask if i not in first)
        order = tuple(outs) + tuple(j for j in range(len(self.out_avals)) if j not in taken)
        fn = _donating_variant(self.key, self.fn, give, order, self.stored)
        where = {j: p for p, j in enumerate(order)}
        final = [where[raw(k)] for k in range(len(order))]
        donated = set(give)
        kept = tuple(i for i in range(len(self.in_avals)) if i not in donated)
        return fn, give, kept, None if final == list(range(len(final))) else final

    def donatable(self, inputs) -> tuple:
        """Positions of inputs referenced only by the graph's input list, up to one per output
        of the same aval. A live tensor, a cache or the user holding the array adds a reference
        and keeps it; PJRT itself declines buffers with external (numpy) references."""
        budget = None
        out = []
        for i, av, only in self.donors:
            a = inputs[i]
            if _refcount(a) == only:
                if budget is None:
                    budget = dict(self.budget)
                if budget[av]:
                    budget[av] -= 1
                    out.append(i)
        return tuple(sorted(out))

    def _first(self, fn, name: str | None, args: tuple):
        """What runs `fn` from now on (in every plan that shares it): its executable, compiled
        here ahead of time or loaded from deferfuse's store under `name` (stored.py)."""
        self.compiled += 1
        run = _RAN[fn] = fn if isinstance(fn, spmd.SpmdProgram) else stored.executable(name, fn, args)
        return run

    def _scalars(self, scalars):
        pack = self.pack
        if pack is not None:
            return _pack(scalars, *pack)
        ids = self.ids
        return scalars if ids is None else [scalars[i] for i in ids]

    def _finish(self, outs):
        back = self.back
        return outs if back is None else [outs[k] for k in back]


def run_compiled(c: Compiled, inputs: list, scalars, allowed) -> list | None:
    """Run c as `Compiled.run` would, but donating only inputs at positions in `allowed`, and
    only with a variant of its program that has run before: None if none has (run-ahead,
    ahead.py, must never compile, nor donate a graph input its fallback would need)."""
    mask = ()
    if c.donors and CONFIG.donate and allowed:
        mask = tuple(i for i in c.donatable(inputs) if i in allowed)
    best = None
    for m, variant in c.variants.items():
        if variant[0] in _RAN and (best is None or len(m) > len(best)) and set(m) <= set(mask):
            best = m
    return None if best is None else c.run_variant(best, inputs, scalars)


def _donating_variant(key: tuple, fn, give: tuple, order: tuple, name: str | None = None):
    """The group program `fn` taking the inputs at `give` (in that order) as a second, donated
    list, and returning its outputs in `order`; `name`: the stored name of `fn`."""
    variant = _DONATING.get((key, give, order))
    if variant is None:
        raw = fn.__wrapped__  # jax.jit keeps the traceable function
        slot = {i: p for p, i in enumerate(give)}

        def donating(keep, donated, scalars):
            it_keep = iter(keep)
            inputs = [donated[slot[i]] if i in slot else next(it_keep) for i in range(len(keep) + len(donated))]
            outs = raw(inputs, scalars)
            return [outs[j] for j in order]

        variant = _DONATING[(key, give, order)] = target.jit(donating, donate_argnums=1)
        if name is not None:
            _NAMES[variant] = stored.variant_name(name, give, order)
        METRICS.programs_built += 1
    return variant


_pack = program.pack
_refcount = sys.getrefcount
ONLY_THE_LIST = 3  # the inputs list, the local name and getrefcount's argument
_MAX_VARIANTS = 3  # donating variants per plan; past it a flush donates a subset already compiled
_DONATING: dict[tuple, Any] = {}
# Jitted programs that have run once, so compiled, and what runs them: a plan meeting a variant
# that has not costs a compile on a cache hit, and is counted as one.
_RAN: dict = {}
_NAMES: dict = {}  # donating variant -> its stored name


def nbytes(shape, dt) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * dt.itemsize


_SINGLE: dict = {}


def run_single(op, ins, scs) -> list:
    """Run one op on concrete values as its own program (error isolation, eager helpers)."""
    avals = tuple((tuple(a.shape), a.dtype) for a in ins)
    k = (op.id, avals)
    fn = _SINGLE.get(k)
    if fn is None:
        fn = _SINGLE[k] = target.jit(lambda i, s: op.fn(i, s))
    return fn(list(ins), list(scs))


def clear() -> None:
    _DONATING.clear()
    _RAN.clear()
    _NAMES.clear()
