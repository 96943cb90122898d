"""One compile cache for all three modes.

A flush is looked up under its structure (`key.py`). Only on a miss does the fuser partition the
graph (networkx) and XLA compile (`plans.py`); the resulting plan is kept under the key, and its
programs run donating what they may (`runtime.py`). A Strict op and a one-op DeferAndFuse group
with the same signature are the same entry.

Tier 3 (persistent, across processes) is a folder on disk (persistent.py) holding deferfuse's own
store of programs under its keys (stored.py), which a warm run loads without tracing, and JAX's
compilation cache, which finds a program by its lowered text.
"""
from __future__ import annotations

import time
import warnings
from typing import Any

import jax

from .. import events
from ..causes import ONE_OP, Cause
from ..config import CONFIG
from ..events import METRICS
from ..graph import OUT_BITS, Graph
from . import ahead, plans, pressure, runtime
from .key import Key, explain_miss, group_key  # noqa: F401  (the cache's API)
from .plans import Plan, one_program  # noqa: F401
from .runtime import Compiled, run_single  # noqa: F401


_PLANS: dict[Key, Plan] = {}
# Most recent plan per flush site, to explain a recompile by what changed in the key.
_LAST_AT_SITE: dict[Any, Key] = {}


def lookup(key: Key) -> Plan | None:
    """A compiled single-program plan for key, if one exists (Strict's fast path)."""
    plan = _PLANS.get(key)
    if plan is None or plan.single is None:
        return None
    plan.hits += 1
    return plan


def clear() -> None:
    _PLANS.clear()
    ahead.forget()
    plans.clear()
    runtime.clear()
    _LAST_AT_SITE.clear()


def size() -> int:
    return len(_PLANS)


def execute(g: Graph, out_refs: tuple, cause: str, where, live: list, live_refs: dict) -> tuple[list, Plan, bool]:
    """Run a flush through its cached plan (made on a miss): (results, plan, hit), hit False
    when the flush compiled. `live` and `live_refs` are the storages that receive the results and
    their positions among them."""
    key = Key(g, out_refs)
    plan = _PLANS.get(key)
    hit = plan is not None
    if not hit:
        _relieve()
        plan = plans.build(g, out_refs, key)
        _PLANS[key] = plan
    if plan.fills is not None:  # made on the host (fills.py): nothing compiles, nothing to explain,
        METRICS.fills_on_host += 1  # and the flush's event says so (its report counts a miss as a compile)
        return plan.run(g, out_refs, live, live_refs), plan, True
    if hit:
        METRICS.cache_hits += 1
        plan.hits += 1
    else:
        METRICS.cache_misses += 1
    why = None
    if not hit:
        site = where if where is not None else cause
        if cause in ONE_OP:
            # Strict and Debug flush each op: the many ops of one line (an optimizer step's) are
            # different programs, not recompiles of one; a recompile is the same op again
            site = (site, tuple(n.op.name for n in g.nodes))
        prev = _LAST_AT_SITE.get(site)
        if prev is not None and (events.collecting() or CONFIG.log):
            why = explain_miss(prev, key, g)
        _LAST_AT_SITE[site] = key
    ran = plan.programs_compiled()
    t0 = time.perf_counter()
    results = plan.run(g, out_refs, live, live_refs, ahead.take(g, plan))
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


_WARNED = False


def _relieve() -> None:
    """Empty the in-memory caches when their executables near the process's mapping limit
    (pressure.py)."""
    global _WARNED
    n = pressure.too_many()
    if n is None:
        return
    held = size()
    clear()
    jax.clear_caches()
    METRICS.cache_resets += 1
    events.emit("cache_reset", mappings=n, plans=held)
    if not _WARNED:
        _WARNED = True
        warnings.warn(f"deferfuse: {held} compiled flush plans held {n} memory mappings, near the process's "
                      "limit (vm.max_map_count); the in-memory compile cache was emptied and programs in use "
                      "will compile again. So many programs usually means shapes that keep changing: "
                      "deferfuse-report's recompile section says which.", stacklevel=2)


def run_one(plan: Plan, arrays: list, scalars: list, n_out: int, n_nodes: int = 1) -> list:
    """Run a one-op plan on concrete inputs (Strict's fast path, record.run_now), counted as the
    flush of the op (and the reads of its view inputs: `n_nodes` in all) it stands for."""
    single = plan.single
    ran = single.compiled
    values = single(arrays, scalars)
    m = METRICS
    m.ops_recorded += 1
    if single.compiled != ran:  # the plan's flush ran a donating variant; this one compiled now
        m.cache_misses += 1
    else:
        m.cache_hits += 1
    m.execute_calls += 1
    m.flushes[Cause.STRICT_OP] += 1
    m.nodes_flushed += n_nodes
    m.outputs_materialized += n_out
    return values


_LARGEST = 0


def _maybe_snapshot(g: Graph, plan: Plan) -> None:
    """Emit the DAG of the largest flush so far (nodes labelled by op, coloured by program)."""
    global _LARGEST
    if plan.n_ops <= _LARGEST:
        return
    _LARGEST = plan.n_ops
    group_of = {}
    for gi, step in enumerate(plan.steps):
        for i in step.group.nodes:
            group_of[i] = gi
    nodes = [(i, g.nodes[i].op.name, group_of[i]) for i in sorted(group_of)]
    edges = [(r >> OUT_BITS, i) for i in group_of for r in g.nodes[i].inputs if r >= 0 and (r >> OUT_BITS) in group_of]
    events.emit("dag", nodes=nodes, edges=edges, key=plan.key_hash, where=plan.where)


def reset_snapshot() -> None:
    global _LARGEST
    _LARGEST = 0
