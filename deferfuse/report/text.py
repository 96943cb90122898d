"""The terminal form of the report: small aligned tables, about one screen for a typical run.

It renders the dict from `collect.build` and nothing else, so what a user reads in the terminal
is exactly what `--json` holds; `top` only shortens the lists.
"""
from __future__ import annotations

from typing import Any, Sequence

from .labels import short_path

_BOLD, _YELLOW, _RESET = "\x1b[1m", "\x1b[33m", "\x1b[0m"
_CODE_WIDTH = 44


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"


def secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 0.01:
        return f"{x * 1e3:.1f}ms"
    return f"{x:.2f}s"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def clip(s: Any, width: int) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= width else s[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> list[str]:
    """Aligned columns; a column whose cells are all numbers is right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [bool(rows) and all(_is_num(r[i]) for r in rows) for i in range(len(headers))]
    out = []
    for r in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)]
        out.append((indent + "  ".join(parts)).rstrip())
    return out


def _is_num(c: Any) -> bool:
    if isinstance(c, (int, float)):
        return True
    s = str(c).rstrip("%sm×")
    try:
        float(s)
        return True
    except ValueError:
        return False


def _where(row: dict) -> str:
    if row.get("file") and row.get("line"):
        return f"{short_path(row['file'])}:{row['line']}"
    return row.get("where") or "<unknown>"


def _ops_line(op_counts: list[dict] | None, width: int = 70) -> str:
    if not op_counts:
        return ""
    parts = [f"{c['op']}×{c['count']}" if c["count"] > 1 else c["op"] for c in op_counts]
    return clip(" ".join(parts), width)


def render(rep: dict[str, Any], top: int = 5, color: bool = False) -> str:
    """The whole terminal report as one string."""
    b, y, r = (_BOLD, _YELLOW, _RESET) if color else ("", "", "")
    if rep.get("compare"):
        return "\n".join(render_compare(rep, rep["compare"], top=top, color=color))
    s, t, fl, mem = rep["summary"], rep["time"], rep["flushes"], rep["memory"]
    lines: list[str] = []
    script = rep.get("script") or {}
    title = "deferfuse report"
    if script.get("argv"):
        title += ": " + " ".join([short_path(script["argv"][0])] + list(script["argv"][1:]))
    meta = []
    if rep.get("mode"):
        meta.append(f"default mode {rep['mode']}")
    if script.get("exit_code") not in (None, 0):
        meta.append(f"exit code {script['exit_code']}")
    lines.append(f"{b}{title}{r}" + (f"  ({', '.join(meta)})" if meta else ""))
    if rep.get("note"):
        lines.append(f"{y}note: {rep['note']}{r}")

    lines.append(f"{b}Summary{r}")
    lines.append(
        f"  {s['ops_recorded']} ops recorded ({s.get('ops_replayed', 0)} of the calls replayed from a step's trace), "
        f"{s['flushes']} flushes, {s['programs_compiled']} programs compiled, "
        f"{s['cache_hits']} cache hits ({pct(s['cache_hit_rate'])} hit rate), {s['cpu_fallbacks']} CPU fallbacks"
    )
    ahead, wasted = s.get("programs_ran_ahead", 0), s.get("programs_ran_ahead_wasted", 0)
    if ahead:
        lines.append(f"  {ahead} programs of replayed steps launched before their flush (run-ahead)"
                     + (f", {wasted} of them run again because their step's flush ran another plan" if wasted else ""))
    disk_hits, disk_misses = s.get("persistent_cache_hits", 0), s.get("persistent_cache_misses", 0)
    if disk_hits or disk_misses:
        loaded = s.get("programs_loaded", 0)
        lines.append(f"  XLA compiles: {disk_hits} loaded from the persistent cache ({loaded} of them without tracing: "
                     f"deferfuse's own store), {disk_misses} compiled and written to it")
    ratio = "-" if s["fusion_ratio"] is None else f"{s['fusion_ratio']:.1f}"
    lines.append(
        f"  {s['programs_executed']} programs run: {ratio} ops per program; {mem['intermediates_skipped']} intermediates "
        f"never materialised ({human_bytes(mem['bytes_skipped'])}) vs {mem['outputs_materialized']} tensors "
        f"materialised ({human_bytes(mem['bytes_materialized'])}); {mem['buffers_donated']} written in place "
        f"into buffers their old values gave up ({human_bytes(mem['bytes_donated'])})"
    )
    split = [("record", t["record_seconds"]), ("compile", t["compile_seconds"]), ("execute", t["execute_seconds"]),
             ("sync wait", t["sync_wait_seconds"]), ("other flush", t["flush_other_seconds"])]
    if t.get("other_seconds") is not None:
        split.append(("rest of script", t["other_seconds"]))
    lines.append(f"  time: wall {secs(t['wall_seconds'])} = " + " + ".join(f"{k} {secs(v)}" for k, v in split))

    lines.append(f"{b}Flushes{r} by cause: " + (", ".join(
        f"{c['cause']} {c['count']}" + ("" if c.get("host_waits", True) else " (engine cut, no wait)")
        for c in fl["by_cause"]) or "none"))
    if fl.get("main_sync_point"):
        ms = fl["main_sync_point"]
        lines.append(f"  the host waits most at {ms['where']} ({ms['cause']}, {ms['count']} reads)")
    if fl["by_source"]:
        rows = [[_where(x), x["count"], x["compiles"], ",".join(x["causes"]), clip(x.get("code"), _CODE_WIDTH)]
                for x in fl["by_source"][:top]]
        lines += table(["source line", "flushes", "compiles", "cause", "code"], rows)
        _more(lines, len(fl["by_source"]) + fl.get("by_source_omitted", 0), top)

    rc = rep.get("recompiles")
    if rc is not None:
        lines.append(f"{b}Recompiles{r}: {rc['count']} ({rc['after_warm_up']} after warm-up, "
                     f"{rc['late_recompiles']} in the last {rc['late_flushes']} flushes)")
        if rc["by_site"]:
            rows = [[_where(g), g["count"], clip(g["example"], 90)] for g in rc["by_site"][:top]]
            lines += table(["source line", "times", "what changed (latest shown)"], rows)
            _more(lines, len(rc["by_site"]), top)
        if rc.get("warning"):
            lines.append(f"  {y}warning: {rc['warning']}{r}")

    fu = rep["fusion"]
    if fu["ops_per_program"]:
        lines.append(f"{b}Fusion{r}: ops per program (compiled / runs): " + ", ".join(
            f"{h['ops']}: {h['programs_compiled']}/{h['program_runs']}" for h in fu["ops_per_program"]))
        if fu["breaks"]:
            lines.append("  programs end at: " + ", ".join(f"{x['why']} {x['count']}" for x in fu["breaks"]))
        rows = [[p["ops"], p["programs"], p["runs"], _where(p), _ops_line(p["op_counts"], 60)]
                for p in fu["largest_programs"][: min(top, 3)]]
        lines += table(["ops", "programs", "runs", "recorded at", "largest flushes' ops"], rows)
    if fu.get("decompositions_replayed"):
        lines.append("  decomposed ops recorded as one node: " + ", ".join(
            f"{x['op']} {x['count']}" for x in fu["decompositions_replayed"][:top]))

    progs = rep["programs_by_time"]
    if progs:
        lines.append(f"{b}Programs by time{r}")
        rows = [[secs(p["total_seconds"]), secs(p["compile_seconds"]), p["flushes"], p["ops"], _where(p),
                 _ops_line(p["op_counts"], 50)] for p in progs[:top]]
        lines += table(["total", "compile", "runs", "ops", "flushed at", "ops"], rows)

    fb = rep["fallbacks"]
    if fb["total"]:
        lines.append(f"{b}CPU fallbacks{r}: {fb['total']} (" + ", ".join(f"{x['op']} {x['count']}" for x in fb["by_op"][:top]) + ")")
        rows = [[x["op"], x["count"], _where(x), clip(x.get("reason"), 30), clip(x.get("code"), _CODE_WIDTH)]
                for x in fb["by_source"][:top]]
        if rows:
            lines += table(["op", "times", "source line", "reason", "code"], rows)
    else:
        lines.append(f"{b}CPU fallbacks{r}: none")

    rp = rep.get("replay")
    if rp and rp["stops"]:
        lines.append(f"{b}Step replay{r}: {rp['ops_replayed']} calls replayed; where steps stopped replaying, and why")
        lines += table(["op", "times", "source line", "why"],
                       [[clip(x["op"], 40), x["count"], x["where"], clip(x["why"], 80)] for x in rp["stops"][:top]])

    co = rep.get("compiled")
    if co and (co["graphs"] or co["calls"]):
        lines.append(f"{b}torch.compile{r}: {co['graphs']} graphs, {co['calls']} compiled calls, "
                     f"{co['graph_breaks']} graph breaks")
        rows = [[x["graph"], x["ops"], x["signatures"], "replay" if x["replays"] else "recorded each call",
                 clip(x.get("where"), 60)] for x in co["recordings"][:top]]
        if rows:
            lines += table(["graph", "ATen ops", "signature", "runs as", "first traced op at"], rows)

    return "\n".join(lines)


def _more(lines: list[str], n: int, top: int) -> None:
    if n > top:
        lines.append(f"  ... {n - top} more (--top, --json)")


def compare_rows(a: dict, b: dict) -> list[tuple[str, str, str]]:
    """The side-by-side rows for two reports: (metric, value in a, value in b)."""
    sa, sb, ta, tb = a["summary"], b["summary"], a["time"], b["time"]

    def num(x: Any) -> str:
        if x is None:
            return "-"
        return f"{x:.1f}" if isinstance(x, float) else str(x)

    rows = [
        ("ops recorded", num(sa["ops_recorded"]), num(sb["ops_recorded"])),
        ("flushes", num(sa["flushes"]), num(sb["flushes"])),
        ("programs compiled", num(sa["programs_compiled"]), num(sb["programs_compiled"])),
        ("cache hits", num(sa["cache_hits"]), num(sb["cache_hits"])),
        ("cache hit rate", pct(sa["cache_hit_rate"]), pct(sb["cache_hit_rate"])),
        ("programs run", num(sa["programs_executed"]), num(sb["programs_executed"])),
        ("ops per program", num(sa["fusion_ratio"]), num(sb["fusion_ratio"])),
        ("recompiles", num(sa["recompiles"]), num(sb["recompiles"])),
        ("CPU fallbacks", num(sa["cpu_fallbacks"]), num(sb["cpu_fallbacks"])),
        ("intermediates skipped", num(a["memory"]["intermediates_skipped"]), num(b["memory"]["intermediates_skipped"])),
        ("bytes materialised", human_bytes(a["memory"]["bytes_materialized"]), human_bytes(b["memory"]["bytes_materialized"])),
    ]
    for k, label in (("wall_seconds", "wall"), ("record_seconds", "record"), ("compile_seconds", "compile"),
                     ("execute_seconds", "execute"), ("sync_wait_seconds", "sync wait")):
        rows.append((f"{label} time", secs(ta.get(k)), secs(tb.get(k))))
    causes = sorted({c["cause"] for c in a["flushes"]["by_cause"]} | {c["cause"] for c in b["flushes"]["by_cause"]})
    ca = {c["cause"]: c["count"] for c in a["flushes"]["by_cause"]}
    cb = {c["cause"]: c["count"] for c in b["flushes"]["by_cause"]}
    for c in causes:
        rows.append((f"flushes: {c}", str(ca.get(c, 0)), str(cb.get(c, 0))))
    return rows


def render_compare(a: dict, b: dict, top: int = 5, color: bool = False) -> list[str]:
    """Two runs of one script side by side, then where each one flushed most."""
    bo, y, r = (_BOLD, _YELLOW, _RESET) if color else ("", "", "")
    script = a.get("script") or {}
    title = "deferfuse report"
    if script.get("argv"):
        title += ": " + " ".join([short_path(script["argv"][0])] + list(script["argv"][1:]))
    lines = [f"{bo}{title}{r}  (default mode {a.get('mode')} against {b.get('mode')}, one process each)"]
    lines += table(["", f"mode {a.get('mode')}", f"mode {b.get('mode')}"], compare_rows(a, b))
    for rep in (a, b):
        srcs = rep["flushes"]["by_source"][: min(top, 3)]
        if srcs:
            lines.append(f"{bo}Top flush sources, {rep.get('mode')}{r}")
            lines += table(["source line", "flushes", "compiles", "cause"],
                           [[_where(x), x["count"], x["compiles"], ",".join(x["causes"])] for x in srcs])
        w = (rep.get("recompiles") or {}).get("warning")
        if w:
            lines.append(f"  {y}[{rep.get('mode')}] warning: {w}{r}")
    return lines
