"""Build the report dict from deferfuse's events and counters.

Everything here is a pure function of plain data (the event list from `deferfuse.events` and the
dict of `deferfuse.metrics()`), so the report can be tested without running a model, and the
terminal, JSON and HTML forms all render one and the same dict. The dict's layout is the stable
schema documented in docs/report-schema.md: add keys freely, never rename or remove one without
bumping SCHEMA_VERSION.

Lists in the dict are complete up to LIST_CAP entries (the count of what was left off is kept);
`--top` only shortens what the terminal and HTML show.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from .labels import (Locator, bucket, bucket_label, capped, key_str, op_counts, rate, short_op, source_text,
                     split_events, why_text)

SCHEMA_VERSION = 1
# The first compiles at a flush site are warm-up: the first step, and the first step that sees
# state created by the first (optimizer moments, a cached mask). Compiles beyond that are the
# ones to explain.
WARM_UP_COMPILES_PER_SITE = 2
WARM_UP_FLUSH_DIVISOR = 4
# "recompiling every step": more than this many recompiles in the second half of the run's
# flushes, and at least LATE_COMPILE_RATE of those flushes recompiling.
LATE_COMPILES_WARN = 2
LATE_COMPILE_RATE = 0.1
TIMELINE_BUCKETS = 400
DAG_NODE_CAP = 2000

_NOT_COLLECTING = (
    "events were not being collected, so only the counters are shown; run under deferfuse-report, "
    "set DEFERFUSE_REPORT=1, or use deferfuse.explain(fn) for flush sources, recompiles and fusion"
)


def _summary(m: dict, n_recompiles: int | None) -> dict[str, Any]:
    hits, misses = m.get("cache_hits", 0), m.get("cache_misses", 0)
    return {
        "ops_recorded": m.get("ops_recorded", 0),
        "ops_replayed": m.get("ops_replayed", 0),
        "programs_ran_ahead": m.get("programs_ran_ahead", 0),
        "programs_ran_ahead_wasted": m.get("programs_ran_ahead_wasted", 0),
        "flushes": m.get("flushes", sum(m.get("flushes_by_cause", {}).values())),
        "programs_compiled": misses,
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_rate": rate(hits, hits + misses),
        "persistent_cache_hits": m.get("persistent_cache_hits", 0),
        "persistent_cache_misses": m.get("persistent_cache_misses", 0),
        "programs_loaded": m.get("programs_loaded", 0),
        "programs_executed": m.get("execute_calls", 0),
        "fills_on_host": m.get("fills_on_host", 0),
        "fusion_ratio": rate(m.get("ops_recorded", 0), m.get("execute_calls", 0)),
        "cpu_fallbacks": m.get("cpu_fallbacks_total", sum(m.get("cpu_fallbacks", {}).values())),
        "recompiles": n_recompiles,
        "pending_nodes": m.get("pending_nodes", 0),
        "cache_entries": m.get("cache_entries"),
    }


def _compiled(graphs: list[dict], m: dict) -> dict[str, Any]:
    """torch.compile(backend="tpu"): graphs, calls, graph breaks, and each graph as first recorded."""
    return {
        "graphs": m.get("compiled_graphs", 0),
        "calls": m.get("compiled_calls", 0),
        "graph_breaks": m.get("graph_breaks", 0),
        "recordings": capped([{"graph": e.get("graph"), "ops": e.get("ops"), "where": e.get("where"),
                               "signatures": e.get("signatures"), "replays": e.get("replays")} for e in graphs])[0],
    }


def _time(m: dict, wall: float | None) -> dict[str, Any]:
    rec = m.get("record_seconds", 0.0)
    comp = m.get("compile_seconds", 0.0)
    # the engine books a program's first run as compile time by subtracting it from execute
    # time, which can leave a rounding-sized negative
    ex = max(0.0, m.get("execute_seconds", 0.0))
    wait = m.get("sync_wait_seconds", 0.0)
    fl = m.get("flush_seconds", 0.0)
    other = None if wall is None else max(0.0, wall - rec - fl - wait)
    return {
        "wall_seconds": wall,
        "record_seconds": rec,
        "compile_seconds": comp,
        "execute_seconds": ex,
        "sync_wait_seconds": wait,
        "flush_seconds": fl,
        "flush_other_seconds": max(0.0, fl - comp - ex),
        "other_seconds": other,
    }


# Flushes the engine takes on its own without waiting for the device: the host goes on recording
# while the cut-off program runs. Every other cause is a point where the host waits for a value.
ENGINE_CUTS = frozenset({"repeated_op_heuristic", "size_cap", "optimizer_step", "optimizer_state"})


def _flushes(flushes: list[dict], m: dict, loc: Locator, syncs: list[dict] = ()) -> dict[str, Any]:
    by_cause_counts = Counter(m.get("flushes_by_cause", {}))
    if not by_cause_counts and flushes:
        by_cause_counts = Counter(f["cause"] for f in flushes)
    by_cause = [{"cause": c, "count": k, "host_waits": c not in ENGINE_CUTS}
                for c, k in sorted(by_cause_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    sites: dict[str, dict[str, Any]] = {}
    for f in flushes:
        lo = loc(f.get("where"))
        s = sites.get(lo["where"])
        if s is None:
            s = sites[lo["where"]] = dict(lo, count=0, causes=Counter(), seconds=0.0, compiles=0,
                                          intermediates_skipped=0, bytes_skipped=0,
                                          code=source_text(lo["file"], lo["line"]))
        s["count"] += 1
        s["intermediates_skipped"] += f.get("skipped", 0)
        s["bytes_skipped"] += f.get("bytes_skipped", 0)
        s["causes"][f["cause"]] += 1
        s["seconds"] += f.get("seconds", 0.0)
        s["compiles"] += 0 if f.get("hit", True) else 1
    rows = sorted(sites.values(), key=lambda s: (-s["count"], s["where"]))
    for s in rows:
        s["causes"] = dict(sorted(s["causes"].items(), key=lambda kv: (-kv[1], kv[0])))
    rows, omitted = capped(rows)
    total = sum(by_cause_counts.values())
    # counted but never seen as events: flushes before collection started (deferfuse.report()
    # called late) or taken by a path that emits no event
    unattributed = max(0, total - len(flushes))
    return {"total": total, "by_cause": by_cause, "by_source": rows, "by_source_omitted": omitted,
            "unattributed": unattributed, "main_sync_point": _main_sync_point(syncs, loc)}


def _main_sync_point(syncs: list[dict], loc: "Locator") -> dict[str, Any] | None:
    """The line where the host reads values back most often (.item(), .cpu(), print, ...). A read
    is a sync point even when it flushes nothing because an engine cut already ran the program
    that computed the value; engine cuts themselves never make the host wait."""
    sites: dict[str, dict[str, Any]] = {}
    for e in syncs:
        lo = loc(e.get("where"))
        s = sites.setdefault(lo["where"], {"where": lo["where"], "count": 0, "causes": Counter(), "seconds": 0.0})
        s["count"] += 1
        s["causes"][e["cause"]] += 1
        s["seconds"] += e.get("seconds", 0.0)
    if not sites:
        return None
    top = max(sites.values(), key=lambda s: (s["count"], s["seconds"]))
    return {"where": top["where"], "count": top["count"], "cause": top["causes"].most_common(1)[0][0],
            "wait_seconds": top["seconds"]}


def _recompiles(compiles: list[dict], flushes: list[dict], loc: Locator) -> dict[str, Any]:
    per_site: Counter = Counter()
    items = []
    after_warm_up = 0
    # A run warms up for its first quarter of flushes: an engine-cut loop settles where its cuts
    # land only after a few iterations (the GPT example compiles its last new program at flush 10
    # of 53); a site that compiles a third time after that is recompiling.
    warm_flushes = len(flushes) // WARM_UP_FLUSH_DIVISOR
    by_site: dict[tuple, dict[str, Any]] = {}
    for c in compiles:
        lo = loc(c.get("where"))
        site = lo["where"] if c.get("where") is not None else f"<{c.get('cause')}>"
        per_site[site] += 1
        late = per_site[site] > WARM_UP_COMPILES_PER_SITE and c["flush_index"] >= warm_flushes
        if not c.get("recompile"):
            continue
        after_warm_up += late
        why = c.get("why")
        text = why_text(why, True)
        items.append(dict(lo, flush_index=c["flush_index"], cause=c.get("cause"), why=why, why_text=text,
                          seconds=c.get("seconds", 0.0), ops=c.get("ops", 0), after_warm_up=late,
                          code=source_text(lo["file"], lo["line"])))
        what = (why or {}).get("what", "unexplained")
        g = by_site.get((site, what))
        if g is None:
            g = by_site[(site, what)] = dict(lo, what=what, count=0, seconds=0.0, example=text,
                                             code=source_text(lo["file"], lo["line"]))
        g["count"] += 1
        g["seconds"] += c.get("seconds", 0.0)
        g["example"] = text  # the latest change: the one a user will see if they rerun
    n = len(flushes)
    late_from = n // 2
    late_flushes = n - late_from
    late_compiles = sum(1 for f in flushes[late_from:] if not f.get("hit", True))
    # Only a site compiling *again* is a recompile: new code reached late in a run (an eval loop
    # after training) compiles too, but once.
    late_recompiles = sum(1 for c in compiles if c.get("recompile") and c["flush_index"] >= late_from)
    warning = None
    if late_recompiles > LATE_COMPILES_WARN and late_recompiles >= LATE_COMPILE_RATE * late_flushes:
        top = max(by_site.values(), key=lambda g: g["count"], default=None)
        hint = f"; most at {top['where']}: {top['example']}" if top else ""
        warning = (
            f"recompiling every step: {late_recompiles} of the last {late_flushes} flushes recompiled a flush "
            f"site{hint}. Like PyTorch/XLA's 'CompileTime too frequent': keep shapes static (pad or bucket "
            "them) so every step reuses one program"
        )
    groups = sorted(by_site.values(), key=lambda g: (-g["count"], g["where"]))
    items, omitted = capped(items)
    groups, _ = capped(groups)
    return {
        "count": sum(g["count"] for g in by_site.values()),
        "after_warm_up": after_warm_up,
        "warm_up_compiles_per_site": WARM_UP_COMPILES_PER_SITE,
        "warm_up_flushes": warm_flushes,
        "late_flushes": late_flushes,
        "late_compiles": late_compiles,
        "late_recompiles": late_recompiles,
        "warning": warning,
        "by_site": groups,
        "items": items,
        "items_omitted": omitted,
    }


def _fusion(compiles: list[dict], flushes: list[dict], m: dict, loc: Locator) -> dict[str, Any]:
    runs_by_key = Counter(f.get("key") for f in flushes)
    compiled_hist: Counter = Counter()
    run_hist: Counter = Counter()
    breaks: Counter = Counter()
    plans: dict[Any, dict] = {}
    for c in compiles:
        sizes = c.get("program_sizes") or []
        hosts = c.get("hosts") or [False] * len(sizes)
        reasons = c.get("breaks") or []
        runs = runs_by_key.get(c.get("key"), 0)
        for i, size in enumerate(sizes):
            if i < len(hosts) and hosts[i]:
                continue  # a host step (CPU fallback) is not a program
            b = bucket(size)
            compiled_hist[b] += 1
            run_hist[b] += runs
            if i < len(reasons):
                breaks[reasons[i]] += 1
        plans[c.get("key")] = c
    hist = [
        {"ops": bucket_label(lo, hi), "lo": lo, "hi": hi, "programs_compiled": compiled_hist[(lo, hi)],
         "program_runs": run_hist[(lo, hi)]}
        for lo, hi in sorted(set(compiled_hist) | set(run_hist))
    ]
    largest = []
    for c in sorted(plans.values(), key=lambda c: (-c.get("ops", 0), c["flush_index"])):
        lo = loc(c.get("where"))
        names = c.get("op_names") or []
        largest.append(dict(
            lo, key=key_str(c.get("key")), ops=c.get("ops", 0), programs=_n_programs(c),
            program_sizes=c.get("program_sizes") or [], cause=c.get("cause"),
            runs=runs_by_key.get(c.get("key"), 0), op_counts=op_counts(names), op_names=names,
        ))
    largest, omitted = capped(largest, 20)
    return {
        "programs_executed": m.get("execute_calls", 0),
        "fusion_ratio": rate(m.get("ops_recorded", 0), m.get("execute_calls", 0)),
        "ops_per_program": hist,
        "largest_programs": largest,
        "largest_programs_omitted": omitted,
        "breaks": [{"why": k, "count": v} for k, v in sorted(breaks.items(), key=lambda kv: (-kv[1], kv[0]))],
        # calls to decomposed ops (no lowering of their own) recorded as one node each from a kept
        # expansion instead of re-entering the dispatcher with their smaller ops
        "decompositions_replayed": [
            {"op": op, "count": k}
            for op, k in sorted(m.get("decompositions_replayed", {}).items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }


def _n_programs(c: dict) -> int:
    sizes = c.get("program_sizes") or []
    hosts = c.get("hosts") or [False] * len(sizes)
    return sum(1 for h in hosts if not h)


def _fallbacks(fallbacks: list[dict], m: dict, loc: Locator) -> dict[str, Any]:
    counts = Counter(m.get("cpu_fallbacks", {}))
    if not counts:
        counts = Counter(f["op"] for f in fallbacks)
    by_op = [{"op": op, "count": k} for op, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    sites: dict[tuple, dict[str, Any]] = {}
    for f in fallbacks:
        lo = loc(f.get("where"))
        s = sites.get((f["op"], lo["where"]))
        if s is None:
            s = sites[(f["op"], lo["where"])] = dict(lo, op=f["op"], reason=f.get("reason"), count=0,
                                                     code=source_text(lo["file"], lo["line"]))
        s["count"] += 1
    rows = sorted(sites.values(), key=lambda s: (-s["count"], s["op"], s["where"]))
    rows, omitted = capped(rows)
    return {"total": sum(counts.values()), "by_op": by_op, "by_source": rows, "by_source_omitted": omitted}


def _replay(stops: list[dict], m: dict, loc: Locator) -> dict[str, Any]:
    """DeferAndFuse's step replay: the calls it served, and where and why steps stopped replaying."""
    sites: Counter = Counter()
    for s in stops:
        sites[(s["op"], loc(s.get("where"))["where"], s["why"])] += 1
    rows = [{"op": op, "where": where, "why": why, "count": n}
            for (op, where, why), n in sorted(sites.items(), key=lambda kv: (-kv[1], kv[0]))]
    rows, omitted = capped(rows)
    return {"ops_replayed": m.get("ops_replayed", 0), "stops": rows, "stops_omitted": omitted}


def _memory(m: dict) -> dict[str, Any]:
    sk, skb = m.get("intermediates_skipped", 0), m.get("bytes_skipped", 0)
    mat, matb = m.get("outputs_materialized", 0), m.get("bytes_materialized", 0)
    return {
        "intermediates_skipped": sk,
        "bytes_skipped": skb,
        "outputs_materialized": mat,
        "bytes_materialized": matb,
        "skipped_fraction": rate(sk, sk + mat),
        "bytes_skipped_fraction": rate(skb, skb + matb),
        "buffers_donated": m.get("buffers_donated", 0),
        "bytes_donated": m.get("bytes_donated", 0),
    }


def _programs(compiles: list[dict], flushes: list[dict], loc: Locator) -> list[dict[str, Any]]:
    per: dict[Any, dict[str, Any]] = {}
    for f in flushes:
        p = per.get(f.get("key"))
        if p is None:
            p = per[f.get("key")] = {"key": f.get("key"), "flushes": 0, "hits": 0, "seconds": 0.0, "ops": f.get("ops", 0),
                                     "where": f.get("where"), "cause": f.get("cause"), "compile_seconds": 0.0,
                                     "compiles": 0, "op_names": None}
        p["flushes"] += 1
        p["hits"] += 1 if f.get("hit") else 0
        p["seconds"] += f.get("seconds", 0.0)
    for c in compiles:
        p = per.get(c.get("key"))
        if p is None:
            continue
        p["compile_seconds"] += c.get("seconds", 0.0)
        p["compiles"] += 1
        p["op_names"] = c.get("op_names") or []
    rows = []
    for p in sorted(per.values(), key=lambda p: (-p["seconds"], -p["flushes"])):
        lo = loc(p["where"])
        names = p["op_names"]
        rows.append(dict(
            lo, key=key_str(p["key"]), total_seconds=p["seconds"], compile_seconds=p["compile_seconds"],
            run_seconds=max(0.0, p["seconds"] - p["compile_seconds"]), flushes=p["flushes"], hits=p["hits"],
            compiles=p["compiles"], ops=p["ops"], cause=p["cause"],
            op_counts=op_counts(names) if names is not None else None, op_names=names,
        ))
    return capped(rows, 50)[0]


def _timeline(flushes: list[dict], t0: float | None) -> list[dict[str, Any]]:
    n = len(flushes)
    if not n:
        return []
    size = max(1, -(-n // TIMELINE_BUCKETS))
    out = []
    for start in range(0, n, size):
        chunk = flushes[start : start + size]
        compiles = sum(1 for f in chunk if not f.get("hit", True))
        out.append({
            "first_flush": start,
            "flushes": len(chunk),
            "hits": len(chunk) - compiles,
            "compiles": compiles,
            "seconds": sum(f.get("seconds", 0.0) for f in chunk),
            "t": None if t0 is None else chunk[0].get("t", t0) - t0,
        })
    return out


def _dag(dags: list[dict], compiles: list[dict], loc: Locator) -> dict[str, Any] | None:
    if not dags:
        return None
    d = max(dags, key=lambda d: len(d.get("nodes", ())))
    hosts = next((c.get("hosts") for c in compiles if c.get("key") == d.get("key")), None) or []
    nodes = [{"id": int(i), "op": short_op(str(op)), "group": int(gi)} for i, op, gi in d.get("nodes", ())]
    truncated = max(0, len(nodes) - DAG_NODE_CAP)
    nodes = nodes[:DAG_NODE_CAP]
    keep = {n["id"] for n in nodes}
    edges = [[int(a), int(b)] for a, b in d.get("edges", ()) if a in keep and b in keep]
    groups = Counter(n["group"] for n in nodes)
    return dict(
        loc(d.get("where")), key=key_str(d.get("key")), nodes=nodes, edges=edges, nodes_omitted=truncated,
        groups=[{"group": g, "ops": k, "host": bool(g < len(hosts) and hosts[g])} for g, k in sorted(groups.items())],
    )


# --- the report ----------------------------------------------------------------------------------


def build(events: list[dict] | None, metrics: dict[str, Any], *, collecting: bool = True,
          wall_seconds: float | None = None, script: dict[str, Any] | None = None, mode: str | None = None,
          events_truncated: bool = False) -> dict[str, Any]:
    """The report dict (schema in docs/report-schema.md) from events and `deferfuse.metrics()`.

    `collecting=False` means no events exist: the event-based sections are empty and `note` says
    why, but every counter-based number (summary, time, flushes by cause, fallbacks by op,
    memory) is still filled in.
    """
    events = list(events or ())
    loc = Locator()
    by_kind = split_events(events)
    flushes, compiles = by_kind["flush"], by_kind["compile"]
    rec = _recompiles(compiles, flushes, loc) if collecting else None
    t0 = events[0].get("t") if events else None
    notes = []
    if not collecting:
        notes.append(_NOT_COLLECTING)
    if events_truncated:
        notes.append("the event buffer was full: the oldest events were dropped (counters are complete)")
    if metrics.get("pending_nodes"):
        notes.append(f"{metrics['pending_nodes']} recorded nodes were still pending (never flushed) at the end")
    return {
        "schema_version": SCHEMA_VERSION,
        "collecting": collecting,
        "note": "; ".join(notes) or None,
        "mode": mode,
        "script": script,
        "summary": _summary(metrics, rec["count"] if rec else None),
        "time": _time(metrics, wall_seconds),
        "flushes": _flushes(flushes, metrics, loc, by_kind["sync"]),
        "recompiles": rec,
        "fusion": _fusion(compiles, flushes, metrics, loc),
        "fallbacks": _fallbacks(by_kind["fallback"], metrics, loc),
        "replay": _replay(by_kind["replay_stop"], metrics, loc),
        "memory": _memory(metrics),
        "compiled": _compiled(by_kind["compiled_graph"], metrics),
        "programs_by_time": _programs(compiles, flushes, loc),
        "timeline": _timeline(flushes, t0),
        "dag": _dag(by_kind["dag"], compiles, loc),
        "counters": dict(metrics),
        "events": {"count": len(events), "truncated": events_truncated},
        "compare": None,
    }


def diff_metrics(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """after - before for every counter (dicts of counts subtract key by key); the rest as after."""
    out: dict[str, Any] = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, bool) or k in ("max_pending", "pending_nodes", "cache_entries"):
            out[k] = v
        elif isinstance(v, (int, float)) and isinstance(b, (int, float)):
            out[k] = v - b
        elif isinstance(v, dict) and isinstance(b, dict):
            out[k] = {kk: vv - b.get(kk, 0) for kk, vv in v.items() if vv - b.get(kk, 0)}
        else:
            out[k] = v
    return out
