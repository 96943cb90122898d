"""One compile cache for all three modes.

The key of a flush is its structure: per node the op's interned id (op + argument signature)
and its operand refs, the refs that must come out, and the (shape, dtype) of each input by
position. It is built incrementally while recording, so a hit costs a dict lookup and one
comparison. Only on a miss does the fuser partition the graph (networkx) and XLA compile; the
resulting plan is cached under the key. A Strict op and a one-op DeferAndFuse group with the same
signature are the same entry.

The key leaves out which inputs a flush may donate (reuse for its outputs): that depends on
what else holds them, known only at the call, so each compiled group keeps a few donating
variants of its program (`Compiled`); compiling one on a cache hit is counted as a compile.

Tier 3 (persistent, across processes) is JAX's own compilation cache (persistent.py).
"""
from __future__ import annotations

import sys
import time
from typing import Any

import jax

from . import events, fuser, program, sources
from .config import CONFIG
from .events import METRICS
from .graph import OUT_BITS, Graph


class Key:
    __slots__ = ("sig", "outs", "avals", "_h")

    def __init__(self, g: Graph | None, outs: tuple):
        if g is not None:
            self.sig = g.sig
            self.outs = outs
            self.avals = tuple(g.input_avals)
            self._h = hash((tuple(g.sig), outs, self.avals))

    @classmethod
    def of(cls, sig: list, outs: tuple, avals: tuple) -> "Key":
        k = cls(None, outs)
        k.sig, k.outs, k.avals = sig, outs, avals
        k._h = hash((tuple(sig), outs, avals))
        return k

    def __hash__(self):
        return self._h

    def __eq__(self, other):
        return self._h == other._h and self.outs == other.outs and self.avals == other.avals and self.sig == other.sig


class Step:
    __slots__ = ("group", "fn", "scalar_ids", "ops", "dies")

    def __init__(self, group, fn, scalar_ids, ops):
        self.group = group
        self.fn = fn  # a Compiled, or None for a host step
        self.scalar_ids = scalar_ids
        self.ops = ops
        self.dies: frozenset = frozenset()  # positions in group.in_refs read for the last time here


class Plan:
    """A cached, compiled flush: its programs and host steps in order."""

    def __init__(self, key_hash: int):
        self.key_hash = key_hash
        self.steps: list[Step] = []
        self.single: Compiled | None = None  # the program when the flush is one group over all inputs
        self.has_host = False  # a step runs on the host (a CPU fallback)
        self.n_internal = 0
        self.bytes_internal = 0
        self.bytes_out = 0
        self.n_ops = 0
        self.op_names: list[str] = []
        self.compile_seconds = 0.0
        self.hits = 0
        self.where = None

    def programs_compiled(self) -> int:
        """Programs (donation variants included) this plan's steps have compiled so far."""
        return sum(step.fn.compiled for step in self.steps if step.fn is not None)

    def run(self, g: Graph, out_refs: tuple) -> list:
        t0 = time.perf_counter()
        try:
            return self._run(g, out_refs)
        finally:
            METRICS.execute_seconds += time.perf_counter() - t0

    def _run(self, g: Graph, out_refs: tuple) -> list:
        if self.single is not None:
            METRICS.execute_calls += 1
            if g.sources is not None:  # capturing: the replays keep reading these inputs
                return self.single(g.inputs, g.scalars)
            return self.single.run(g.inputs, g.scalars, lambda: _replaces(g, None))
        env: dict[int, Any] = {-(i + 1): a for i, a in enumerate(g.inputs)}
        # a host step (a CPU fallback) can fail on its data; the graph's inputs must then still be
        # there for engine._recover, so a plan with one donates nothing
        donate = g.sources is None and not self.has_host
        for step in self.steps:
            grp = step.group
            dies = step.dies
            # a value read for the last time leaves env, so the step may donate its buffer
            ins = [env.pop(r) if k in dies else env[r] for k, r in enumerate(grp.in_refs)]
            if grp.host:
                # the group's inputs are distinct values; the op takes its own argument list, in
                # which one value may appear twice (`op(x, x)`)
                node = g.nodes[grp.nodes[0]]
                local = dict(zip(grp.in_refs, ins))
                outs = program.run_host(node, [local[r] for r in node.inputs], g.scalars)
                base = grp.nodes[0] << OUT_BITS
                for k, o in enumerate(outs):
                    env[base | k] = o
            else:
                METRICS.execute_calls += 1
                scs = [g.scalars[i] for i in step.scalar_ids]
                outs = step.fn.run(ins, scs, lambda grp=grp: _replaces(g, grp)) if donate else step.fn(ins, scs)
                for r, o in zip(grp.out_refs, outs):
                    env[r] = o
        return [env[r] for r in out_refs]


def _replaces(g: Graph, grp) -> dict[int, int]:
    """Which output of a program is the new value of which of its inputs: position of the
    input -> position of the output (among the flush's outputs for the single program, among the
    group's for a step), for storages that were read here and then written."""
    prior = g.prior
    if not prior:
        return {}
    if grp is None:
        refs = g.live_refs
        return {prior[id(s)]: refs[s.ref] for s in g.live if id(s) in prior}
    ins = {r: k for k, r in enumerate(grp.in_refs)}
    outs = {r: j for j, r in enumerate(grp.out_refs)}
    pairs = {}
    for s in g.live:
        pos = prior.get(id(s))
        if pos is not None and -(pos + 1) in ins and s.ref in outs:
            pairs[ins[-(pos + 1)]] = outs[s.ref]
    return pairs


_PLANS: dict[Key, Plan] = {}
# Most recent plan per flush site, to explain a recompile by what changed in the key.
_LAST_AT_SITE: dict[Any, Key] = {}
# flush causes of Strict and Debug, which flush each top-level op on its own
ONE_OP_CAUSES = ("strict_op", "debug_op")


def lookup(key: Key) -> Plan | None:
    """A compiled single-program plan for key, if one exists (Strict's fast path)."""
    plan = _PLANS.get(key)
    if plan is None or plan.single is None:
        return None
    plan.hits += 1
    return plan


def clear() -> None:
    _PLANS.clear()
    _GROUP_PROGRAMS.clear()
    _DONATING.clear()
    _RAN.clear()
    _LAST_AT_SITE.clear()


def size() -> int:
    return len(_PLANS)


def execute(g: Graph, out_refs: tuple, cause: str, where) -> tuple[list, Plan, bool]:
    key = Key(g, out_refs)
    plan = _PLANS.get(key)
    hit = plan is not None
    if hit:
        METRICS.cache_hits += 1
        plan.hits += 1
    else:
        METRICS.cache_misses += 1
        plan = _build(g, out_refs, key)
        _PLANS[key] = plan
    why = None
    if not hit:
        site = where if where is not None else cause
        if cause in ONE_OP_CAUSES:
            # Strict and Debug flush each op: the many ops of one line (an optimizer step's) are
            # different programs, not recompiles of one; a recompile is the same op again
            site = (site, tuple(n.op.name for n in g.nodes))
        prev = _LAST_AT_SITE.get(site)
        if prev is not None and (events.collecting() or CONFIG.log):
            why = explain_miss(prev, key, g)
        _LAST_AT_SITE[site] = key
    ran = plan.programs_compiled()
    t0 = time.perf_counter()
    results = plan.run(g, out_refs)
    if hit and plan.programs_compiled() != ran:
        # a cached plan met a new donation pattern: that is one more XLA compile
        hit = False
        METRICS.cache_hits -= 1
        METRICS.cache_misses += 1
        site = where if where is not None else cause
        prev = key  # a recompile at this site
        why = {"what": "donation", "inputs": len(g.inputs)}
    if not hit:
        dt = time.perf_counter() - t0
        METRICS.compile_seconds += dt
        plan.compile_seconds += dt
        METRICS.execute_seconds -= dt  # the first run's time is compilation
        if events.collecting() or CONFIG.log:
            events.emit("compile", where=where, cause=cause, seconds=dt, ops=plan.n_ops, key=key._h,
                        groups=len(plan.steps), op_names=plan.op_names[:200], why=why, recompile=prev is not None,
                        breaks=[s.group.why for s in plan.steps], program_sizes=[len(s.group.nodes) for s in plan.steps],
                        hosts=[s.group.host for s in plan.steps])
            _maybe_snapshot(g, plan)
    return results, plan, hit


def _build(g: Graph, out_refs: tuple, key: Key, block_ops: int | None = None) -> Plan:
    plan = Plan(key._h)
    nodes = g.nodes
    hosts = [n.op.host for n in nodes]
    groups = fuser.partition(g.sig, hosts, out_refs, CONFIG.max_group_ops, CONFIG.fusion_fuel,
                              CONFIG.fuse_block_ops if block_ops is None else block_ops, CONFIG.fuse_block_repeats,
                              [n.op.family == "foreach" for n in nodes])
    live = set()
    for grp in groups:
        live.update(grp.nodes)
    plan.n_ops = len(live)
    plan.op_names = [nodes[i].op.name for i in sorted(live)]
    plan.where = next((n.where for n in nodes if n.where is not None), None)
    outs = set(out_refs)
    for i, node in enumerate(nodes):
        for k, (shape, dt) in enumerate(node.op.out_avals):
            nbytes = _nbytes(shape, dt)
            if ((i << OUT_BITS) | k) in outs:
                plan.bytes_out += nbytes
            else:
                plan.n_internal += 1
                plan.bytes_internal += nbytes
    n_inputs = len(g.inputs)
    if len(groups) == 1 and not groups[0].host:
        grp = groups[0]
        grp.in_refs = [-(i + 1) for i in range(n_inputs)]
        plan.single = _single_program(g, grp, out_refs)
        plan.steps.append(Step(grp, plan.single, None, [nodes[i].op.name for i in grp.nodes]))
        return plan
    for grp in groups:
        if grp.host:
            plan.steps.append(Step(grp, None, None, [nodes[grp.nodes[0]].op.name]))
            plan.has_host = True
            continue
        scalar_ids = []
        for i in grp.nodes:
            n = nodes[i]
            scalar_ids.extend(range(n.scalar_lo, n.scalar_lo + n.op.n_scalars))
        gkey = group_key(g, grp)
        fn, layout = _group_program(g, grp, scalar_ids, gkey)
        # held besides the step's input list: g.inputs holds the graph's inputs
        expect = [_ONLY_THE_LIST + (r < 0) for r in grp.in_refs]
        prog = _compiled(g, grp, gkey, fn, None, None, expect, layout)
        plan.steps.append(Step(grp, prog, scalar_ids, [nodes[i].op.name for i in grp.nodes]))
    last: dict[int, int] = {}
    for si, step in enumerate(plan.steps):
        for r in step.group.in_refs:
            last[r] = si
    for si, step in enumerate(plan.steps):
        if not step.group.host:
            step.dies = frozenset(k for k, r in enumerate(step.group.in_refs) if last[r] == si and r not in outs)
    return plan


# Programs of multi-group plans by their structure alone: the twelve layers of a model, cut
# apart by the fuser, are twelve groups with one key and share one jitted (compiled) program,
# across flushes and plans too.
_GROUP_PROGRAMS: dict[tuple, Any] = {}


def _group_program(g: Graph, grp, scalar_ids, key: tuple | None = None) -> tuple:
    """(jitted program, its scalar layout): the layout follows from the key, which holds the
    Python type of every runtime scalar (program.scalar_layout)."""
    if key is None:
        key = group_key(g, grp)
    entry = _GROUP_PROGRAMS.get(key)
    if entry is None:
        fn = program.build(g.nodes, grp.nodes, grp.in_refs, grp.out_refs, scalar_ids)
        layout = program.scalar_layout([g.scalars[i] for i in scalar_ids])
        if layout is not None:
            fn = program.unpacking(fn, layout)
        entry = _GROUP_PROGRAMS[key] = (jax.jit(fn), layout)
        METRICS.programs_built += 1
    return entry


def _single_program(g: Graph, grp, out_refs: tuple) -> "Compiled":
    order = sorted(range(len(out_refs)), key=out_refs.__getitem__)
    grp.out_refs = [out_refs[k] for k in order]
    ids = [i for n in (g.nodes[i] for i in grp.nodes) for i in range(n.scalar_lo, n.scalar_lo + n.op.n_scalars)]
    key = group_key(g, grp)
    fn, layout = _group_program(g, grp, ids, key)
    back = None
    if order != list(range(len(order))):
        back = [0] * len(order)
        for pos, k in enumerate(order):
            back[k] = pos
    if ids == list(range(len(g.scalars))):
        ids = None
    return _compiled(g, grp, key, fn, ids, back, None, layout)


def _compiled(g: Graph, grp, key: tuple, fn, ids, back, expect=None, layout=None) -> "Compiled":
    """A group's program with the (shape, dtype) of its inputs and outputs as the arrays have
    them (the key's input avals name torch dtypes), which decide what may alias what."""
    nodes = g.nodes
    mask = (1 << OUT_BITS) - 1

    def aval(r):
        if r < 0:
            a = g.inputs[-r - 1]
            return tuple(a.shape), a.dtype
        return nodes[r >> OUT_BITS].op.out_avals[r & mask]

    return Compiled(key, fn, ids, back, [aval(r) for r in grp.in_refs], [aval(r) for r in grp.out_refs], expect,
                    layout)


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
                 "in_avals", "out_avals")

    def __init__(self, key, fn, ids, back, in_avals, out_avals, expect=None, layout=None):
        self.key = key
        self.fn = fn
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
        self.donors = [(i, av, _ONLY_THE_LIST if expect is None else expect[i])
                       for i, av in enumerate(in_avals) if av in budget]
        self.nbytes = {i: _nbytes(*av) for i, av, _ in self.donors}
        # donated positions -> (program, the order it takes them in, the kept positions, where
        # each output lands)
        self.variants: dict[tuple, tuple] = {(): (fn, (), tuple(range(len(in_avals))), back)}
        self.compiled = 0  # programs this object ran first (each one an XLA compile)

    def __call__(self, inputs, scalars):
        fn = self.fn
        if fn not in _RAN:
            self._first(fn)
        return self._finish(fn(inputs, self._scalars(scalars)))

    def run(self, inputs, scalars, replaces=None):
        """Like calling it, donating what `donatable` finds. `replaces()` says which output is the
        new value of which input (see `_replaces`); the first call with a new donation pattern
        asks it, so that each donated buffer takes its own input's new value. XLA then updates
        it in place, where a buffer handed to another output of its shape costs a copy."""
        if not self.donors or not CONFIG.donate:
            return self(inputs, scalars)
        mask = self.donatable(inputs)
        variant = self.variants.get(mask)
        if variant is None:
            if len(self.variants) > _MAX_VARIANTS:  # a pattern that keeps changing: stop compiling
                mask = max((m for m in self.variants if set(m) <= set(mask)), key=len)
                variant = self.variants[mask]
            else:
                pairs = replaces() if replaces is not None else {}
                if self._prefer(pairs):
                    mask = self.donatable(inputs)
                variant = self.variants.get(mask)
                if variant is None:
                    variant = self.variants[mask] = self._variant(mask, pairs)
        if not mask:
            return self(inputs, scalars)
        fn, give, kept, back = variant
        if fn not in _RAN:
            self._first(fn)
        m = METRICS
        m.buffers_donated += len(mask)
        nbytes = self.nbytes
        m.bytes_donated += sum([nbytes[i] for i in mask])
        outs = fn([inputs[i] for i in kept], [inputs[i] for i in give], self._scalars(scalars))
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
        fn = _donating_variant(self.key, self.fn, give, order)
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

    def _first(self, fn) -> None:
        _RAN.add(fn)
        self.compiled += 1

    def _scalars(self, scalars):
        pack = self.pack
        if pack is not None:
            return _pack(scalars, *pack)
        ids = self.ids
        return scalars if ids is None else [scalars[i] for i in ids]

    def _finish(self, outs):
        back = self.back
        return outs if back is None else [outs[k] for k in back]


def _donating_variant(key: tuple, fn, give: tuple, order: tuple):
    """The group program `fn` taking the inputs at `give` (in that order) as a second, donated
    list, and returning its outputs in `order`."""
    variant = _DONATING.get((key, give, order))
    if variant is None:
        raw = fn.__wrapped__  # jax.jit keeps the traceable function
        slot = {i: p for p, i in enumerate(give)}

        def donating(keep, donated, scalars):
            it_keep = iter(keep)
            inputs = [donated[slot[i]] if i in slot else next(it_keep) for i in range(len(keep) + len(donated))]
            outs = raw(inputs, scalars)
            return [outs[j] for j in order]

        variant = _DONATING[(key, give, order)] = jax.jit(donating, donate_argnums=1)
        METRICS.programs_built += 1
    return variant


_pack = program.pack
_refcount = sys.getrefcount
_ONLY_THE_LIST = 3  # the inputs list, the local name and getrefcount's argument
_MAX_VARIANTS = 3  # donating variants per plan; past it a flush donates a subset already compiled
_DONATING: dict[tuple, Any] = {}
# Jitted programs that have run once, so compiled: a plan meeting a variant that has not costs
# a compile on a cache hit, and is counted as one.
_RAN: set = set()


def group_key(g: Graph, grp) -> tuple:
    """A group's nodes, operands and outputs relative to the group, and its inputs' avals.

    Two groups with equal keys trace to the same program: inputs arrive by position, scalars in
    node order, outputs in the order of `out_refs` (ascending refs, so also in node order)."""
    nodes = g.nodes
    mask = (1 << OUT_BITS) - 1
    sig, local = fuser.relative(grp.nodes, g.sig, grp.in_refs)
    outs = tuple((local[r >> OUT_BITS] << OUT_BITS) | (r & mask) for r in grp.out_refs)
    avals = tuple(g.input_avals[-r - 1] if r < 0 else nodes[r >> OUT_BITS].op.out_avals[r & mask] for r in grp.in_refs)
    return sig, outs, avals


def one_program(g: Graph, out_refs: tuple) -> Plan:
    """A plan for g that fuses it whole, whatever the cached plan for its key does (capture)."""
    return _build(g, out_refs, Key(g, out_refs), block_ops=0)


_LARGEST = [0]


def _maybe_snapshot(g: Graph, plan: Plan) -> None:
    """Emit the DAG of the largest flush so far (nodes labelled by op, coloured by program)."""
    if plan.n_ops <= _LARGEST[0]:
        return
    _LARGEST[0] = plan.n_ops
    group_of = {}
    for gi, step in enumerate(plan.steps):
        for i in step.group.nodes:
            group_of[i] = gi
    nodes = [(i, g.nodes[i].op.name, group_of[i]) for i in sorted(group_of)]
    edges = [(r >> OUT_BITS, i) for i in group_of for r in g.nodes[i].inputs if r >= 0 and (r >> OUT_BITS) in group_of]
    events.emit("dag", nodes=nodes, edges=edges, key=plan.key_hash, where=plan.where)


def reset_snapshot() -> None:
    _LARGEST[0] = 0


def _nbytes(shape, dt) -> int:
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
        fn = _SINGLE[k] = jax.jit(lambda i, s: op.fn(i, s))
    return fn(list(ins), list(scs))


def explain_miss(prev: Key | None, key: Key, g: Graph) -> dict | None:
    """What changed against the previous key compiled at the same site."""
    if prev is None:
        return None
    from .graph import Op

    if prev.avals != key.avals:
        for i, (a, b) in enumerate(zip(prev.avals, key.avals)):
            if a != b:
                return {"what": "input", "input": i, "before": _aval_str(a), "now": _aval_str(b)}
        return {"what": "inputs", "before": len(prev.avals), "now": len(key.avals)}
    ops = {op.id: op for op in Op._interned.values()}
    for i, (a, b) in enumerate(zip(prev.sig, key.sig)):
        if a != b:
            oa, ob = ops.get(a[0]), ops.get(b[0])
            where = g.nodes[i].where if i < len(g.nodes) else None
            if oa is not None and ob is not None and oa.name == ob.name:
                return {"what": "op_args", "op": ob.name, "node": i, "where": sources.fmt(where),
                        "before": _key_str(oa.key), "now": _key_str(ob.key)}
            return {"what": "structure", "node": i, "where": sources.fmt(where),
                    "before": oa.name if oa else "?", "now": ob.name if ob else "?"}
    if len(prev.sig) != len(key.sig):
        return {"what": "length", "before": len(prev.sig), "now": len(key.sig)}
    if prev.outs != key.outs:
        return {"what": "outputs", "before": len(prev.outs), "now": len(key.outs)}
    return {"what": "unknown"}


def _aval_str(a) -> str:
    shape, dt = a
    return f"{dt}{list(shape)}"


def _key_str(k) -> str:
    from .tensor import LAYOUTS

    if isinstance(k, tuple) and k and hasattr(k[0], "_schema"):
        parts = []
        for p in k[2:]:
            if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < len(LAYOUTS):
                parts.append(repr(p))
            else:
                parts.append(repr(p))
        return ", ".join(parts)
    return repr(k)
