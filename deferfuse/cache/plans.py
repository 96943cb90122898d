"""A flush's plan: the fuser's groups, each compiled once as a program (shared by every group of
the same structure), and the host steps between them, run in order.
"""
from __future__ import annotations

import time
from typing import Any


from .. import cluster, fuser, passes, program, spmd, target
from ..config import CONFIG
from ..events import METRICS
from ..graph import OUT_BITS, Graph
from ..target import jax_device
from . import fills, stored
from .key import Key, group_key
from .runtime import ONLY_THE_LIST, Compiled, nbytes


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
        self.fills: list | None = None  # zeros and ones alone: what makes each output on the host (fills.py)
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

    def run(self, g: Graph, out_refs: tuple, live: list = (), live_refs: dict | None = None, ran=None) -> list:
        """The flush's outputs, in `out_refs` order. `live`: the storages that receive them, and
        `live_refs` each one's position among them (what the programs may donate into). `ran`:
        (the values, how many steps) of the steps already launched from this plan (ahead.py)."""
        t0 = time.perf_counter()
        try:
            return self._run(g, out_refs, live, live_refs, ran)
        finally:
            METRICS.execute_seconds += time.perf_counter() - t0

    def _run(self, g: Graph, out_refs: tuple, live, live_refs, ran=None) -> list:
        if self.fills is not None:
            return [made() for made in self.fills]
        if self.single is not None:
            METRICS.execute_calls += 1
            if g.sources is not None:  # capturing: the replays keep reading these inputs
                return self.single(g.inputs, g.scalars)
            return self.single.run(g.inputs, g.scalars, lambda: _replaces(g, None, live, live_refs))
        env: dict[int, Any] = {-(i + 1): a for i, a in enumerate(g.inputs)}
        # a host step (a CPU fallback) can fail on its data; the graph's inputs must then still be
        # there for pending._recover, so a plan with one donates nothing
        donate = g.sources is None and not self.has_host
        steps = self.steps
        if ran is not None:  # one dict, so that a value read for the last time is held by nothing else
            made, done = ran
            made.update(env)
            env = made
            steps = steps[done:]
            # The loop holds a step's output list while the next step runs, which keeps those values
            # from being donated there. The last launched step's outputs are held so too: the next
            # step then donates what it always does, and run-ahead compiles no variant of its own.
            outs = [env[r] for r in self.steps[done - 1].group.out_refs]  # noqa: F841
        for step in steps:
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
                outs = step.fn.run(ins, scs, lambda grp=grp: _replaces(g, grp, live, live_refs)) if donate else step.fn(ins, scs)
                for r, o in zip(grp.out_refs, outs):
                    env[r] = o
        return [env[r] for r in out_refs]


def _replaces(g: Graph, grp, live, live_refs) -> dict[int, int]:
    """Which output of a program is the new value of which of its inputs: position of the
    input -> position of the output (among the flush's outputs for the single program, among the
    group's for a step), for storages that were read here and then written."""
    prior = g.prior
    if not prior:
        return {}
    if grp is None:
        return {prior[id(s)]: live_refs[s.ref] for s in live if id(s) in prior}
    ins = {r: k for k, r in enumerate(grp.in_refs)}
    outs = {r: j for j, r in enumerate(grp.out_refs)}
    pairs = {}
    for s in live:
        pos = prior.get(id(s))
        if pos is not None and -(pos + 1) in ins and s.ref in outs:
            pairs[ins[-(pos + 1)]] = outs[s.ref]
    return pairs


def build(g: Graph, out_refs: tuple, key: Key, block_ops: int | None = None, on_host: bool = True) -> Plan:
    """`on_host=False`: programs even for fills the host could make (a capture replays programs)."""
    cluster.start()  # a program that makes its values (torch.zeros) may be the first JAX use
    plan = Plan(key._h)
    nodes = g.nodes
    plan.where = next((n.where for n in nodes if n.where is not None), None)
    made = fills.makers(g, out_refs) if on_host else None
    if made is not None:
        plan.fills, plan.bytes_out = made
        plan.n_ops = len(out_refs)
        plan.op_names = [nodes[r >> OUT_BITS].op.name for r in out_refs]
        return plan
    hosts = [n.op.host for n in nodes]
    groups = fuser.partition(g.sig, hosts, out_refs, CONFIG.max_group_ops, CONFIG.fusion_fuel,
                              CONFIG.fuse_block_ops if block_ops is None else block_ops, CONFIG.fuse_block_repeats,
                              [n.op.family == "foreach" for n in nodes])
    live = set()
    for grp in groups:
        live.update(grp.nodes)
    plan.n_ops = len(live)
    plan.op_names = [nodes[i].op.name for i in sorted(live)]
    outs = set(out_refs)
    for i, node in enumerate(nodes):
        for k, (shape, dt) in enumerate(node.op.out_avals):
            size = nbytes(shape, dt)
            if ((i << OUT_BITS) | k) in outs:
                plan.bytes_out += size
            else:
                plan.n_internal += 1
                plan.bytes_internal += size
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
        fn, layout, name = _group_program(g, grp, scalar_ids, gkey)
        # held besides the step's input list: g.inputs holds the graph's inputs
        expect = [ONLY_THE_LIST + (r < 0) for r in grp.in_refs]
        prog = _compiled(g, grp, gkey, fn, None, None, expect, layout, name)
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
    """(jitted program, its scalar layout, its name in deferfuse's store or None): the layout
    follows from the key, which holds the Python type of every runtime scalar
    (program.scalar_layout)."""
    if key is None:
        key = group_key(g, grp)
    entry = _GROUP_PROGRAMS.get(key)
    if entry is None:
        fn = program.build(g.nodes, grp.nodes, grp.in_refs, grp.out_refs, scalar_ids)
        layout = program.scalar_layout([g.scalars[i] for i in scalar_ids])
        if layout is not None:
            fn = program.unpacking(fn, layout)
        ranks = _collective_ranks(g, grp)
        if ranks is None:
            name = stored.program_key(g.nodes, grp.nodes, key, (layout, _rewrites()))
            entry = _GROUP_PROGRAMS[key] = (target.jit(_rewritten(fn)), layout, name)
        else:  # it holds collectives (spmd_safe): the program runs on every process of their group
            entry = _GROUP_PROGRAMS[key] = (spmd.SpmdProgram(fn, spmd.mesh(ranks), [len(_aval(g, r)[0]) for r in grp.in_refs],
                                                             [len(_aval(g, r)[0]) for r in grp.out_refs]), layout, None)
        METRICS.programs_built += 1
    return entry


def _rewrites() -> bool:
    return jax_device().platform == "cpu"


def _rewritten(fn):
    """The group program with the jaxpr rewrites its backend needs (passes.py): folding transposes
    into matrix products is for XLA:CPU alone, which does not do it itself. Elsewhere the pass
    would only trace each program a second time: on a TPU host that is a second or more of every
    compile, and of every load from the persistent cache, which traces a program to find it."""
    return passes.fold_transposes(fn) if _rewrites() else fn


def _single_program(g: Graph, grp, out_refs: tuple) -> "Compiled":
    order = sorted(range(len(out_refs)), key=out_refs.__getitem__)
    grp.out_refs = [out_refs[k] for k in order]
    ids = [i for n in (g.nodes[i] for i in grp.nodes) for i in range(n.scalar_lo, n.scalar_lo + n.op.n_scalars)]
    key = group_key(g, grp)
    fn, layout, name = _group_program(g, grp, ids, key)
    back = None
    if order != list(range(len(order))):
        back = [0] * len(order)
        for pos, k in enumerate(order):
            back[k] = pos
    if ids == list(range(len(g.scalars))):
        ids = None
    return _compiled(g, grp, key, fn, ids, back, None, layout, name)


def _collective_ranks(g: Graph, grp) -> tuple | None:
    """The processes of the collectives a group holds (their ops' keys name them), or None."""
    ranks = {g.nodes[i].op.key[2] for i in grp.nodes if g.nodes[i].op.family == "collective"}
    if len(ranks) > 1:  # distributed/recorded.py flushes before recording on another group
        raise AssertionError(f"deferfuse: one program holds collectives of several groups: {sorted(ranks)}")
    return ranks.pop() if ranks else None


def _aval(g: Graph, r: int) -> tuple:
    if r < 0:
        a = g.inputs[-r - 1]
        return tuple(a.shape), a.dtype
    return g.nodes[r >> OUT_BITS].op.out_avals[r & ((1 << OUT_BITS) - 1)]


def _compiled(g: Graph, grp, key: tuple, fn, ids, back, expect=None, layout=None, name=None) -> "Compiled":
    """A group's program with the (shape, dtype) of its inputs and outputs as the arrays have
    them (the key's input avals name torch dtypes), which decide what may alias what."""
    c = Compiled(key, fn, ids, back, [_aval(g, r) for r in grp.in_refs], [_aval(g, r) for r in grp.out_refs], expect,
                 layout, name)
    if isinstance(fn, spmd.SpmdProgram):
        c.donors = []  # its global arrays are made per call: nothing to donate
    return c


def one_program(g: Graph, out_refs: tuple) -> Plan:
    """A plan for g that fuses it whole, whatever the cached plan for its key does (capture)."""
    return build(g, out_refs, Key(g, out_refs), block_ops=0, on_host=False)


def clear() -> None:
    _GROUP_PROGRAMS.clear()
