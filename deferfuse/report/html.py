"""The HTML form of the report: one self-contained file, no network.

Everything is inline: CSS, SVG drawn here in Python, and the report dict itself as JSON in a
`<script type="application/json">` block for anyone who wants to script against the page. There
is no JavaScript to run and nothing fetched, so the file opens the same offline, in a sandboxed
viewer, or years later. Pictures:

- the largest flushed DAG, nodes coloured by the program (group) they were fused into and
  labelled by op, in a layered layout (longest-path layers, then a few barycentre sweeps to
  reduce crossings: good enough to see where groups split, with no layout library);
- compiles and cache hits per flush over the run (stacked bars, bucketed on long runs), with
  the cumulative number of programs compiled as a line: a line that keeps climbing after the
  first steps is a recompilation problem.
"""
from __future__ import annotations

import html as _html
import json
from collections import defaultdict
from typing import Any

from .labels import short_path
from .text import compare_rows, human_bytes, pct, secs

_NODE_W, _NODE_H, _GAP_X, _GAP_Y = 120, 22, 14, 34
_HOST_COLOR = "#9e9e9e"


def esc(x: Any) -> str:
    return _html.escape("" if x is None else str(x), quote=True)


def group_color(g: int) -> str:
    """A distinct, readable fill per program: golden-angle hues at fixed saturation/lightness."""
    return f"hsl({(g * 137.508) % 360:.0f},62%,74%)"


# --- DAG layout ----------------------------------------------------------------------------------


def layout(nodes: list[int], edges: list[tuple[int, int]], sweeps: int = 4) -> dict[int, tuple[int, int]]:
    """(layer, position) per node: layer = longest path from a source; positions by barycentre."""
    preds: dict[int, list[int]] = defaultdict(list)
    succs: dict[int, list[int]] = defaultdict(list)
    node_set = set(nodes)
    for a, b in edges:
        if a in node_set and b in node_set and a != b:
            preds[b].append(a)
            succs[a].append(b)
    layer: dict[int, int] = {}
    for n in sorted(nodes):  # node ids are in recording order, which is a topological order
        layer[n] = max((layer[p] + 1 for p in preds[n] if p in layer), default=0)
    for n in sorted(nodes, reverse=True):
        # an input-like node (a view read, a constant) sits just above its first consumer
        # instead of on the top row, which would draw every such edge across the whole graph
        if not preds[n] and succs[n]:
            layer[n] = min(layer[m] for m in succs[n]) - 1
    rows: dict[int, list[int]] = defaultdict(list)
    for n in sorted(nodes):
        rows[layer[n]].append(n)
    pos = {n: i for r in rows.values() for i, n in enumerate(r)}
    depth = max(rows) + 1 if rows else 0
    for sweep in range(sweeps):
        order = range(1, depth) if sweep % 2 == 0 else range(depth - 2, -1, -1)
        nbrs = preds if sweep % 2 == 0 else succs
        for lv in order:
            def bary(n: int) -> float:
                ns = nbrs[n]
                return sum(pos[m] for m in ns) / len(ns) if ns else pos[n]

            rows[lv].sort(key=lambda n: (bary(n), n))
            for i, n in enumerate(rows[lv]):
                pos[n] = i
    return {n: (layer[n], pos[n]) for n in nodes}


def dag_svg(dag: dict[str, Any]) -> str:
    nodes = dag["nodes"]
    if not nodes:
        return "<p>(empty DAG)</p>"
    host_groups = {g["group"] for g in dag.get("groups", []) if g.get("host")}
    ids = [n["id"] for n in nodes]
    lay = layout(ids, [tuple(e) for e in dag["edges"]])
    width_of: dict[int, int] = defaultdict(int)
    for lv, p in lay.values():
        width_of[lv] = max(width_of[lv], p + 1)
    max_w = max(width_of.values())
    step_x, step_y = _NODE_W + _GAP_X, _NODE_H + _GAP_Y
    total_w = max_w * step_x + _GAP_X
    total_h = (max(width_of) + 1) * step_y + _GAP_Y

    def xy(n: int) -> tuple[float, float]:
        lv, p = lay[n]
        offset = (max_w - width_of[lv]) * step_x / 2  # centre each layer
        return _GAP_X + offset + p * step_x, _GAP_Y / 2 + lv * step_y

    parts = [f'<svg class="dag" width="{total_w:.0f}" height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}" '
             f'role="img" aria-label="largest flushed DAG">']
    parts.append('<g class="edges" stroke="#8a8a8a" stroke-opacity="0.55" fill="none">')
    for a, b in dag["edges"]:
        if a not in lay or b not in lay:
            continue
        x1, y1 = xy(a)
        x2, y2 = xy(b)
        x1, y1, x2, y2 = x1 + _NODE_W / 2, y1 + _NODE_H, x2 + _NODE_W / 2, y2
        my = (y1 + y2) / 2
        parts.append(f'<path d="M{x1:.0f},{y1:.0f} C{x1:.0f},{my:.0f} {x2:.0f},{my:.0f} {x2:.0f},{y2:.0f}"/>')
    parts.append("</g><g class=\"nodes\" font-size=\"10\" font-family=\"monospace\">")
    for n in nodes:
        x, y = xy(n["id"])
        g = n["group"]
        fill = _HOST_COLOR if g in host_groups else group_color(g)
        label = n["op"] if len(n["op"]) <= 18 else n["op"][:17] + "…"
        tip = f"#{n['id']} {n['op']} (program {g}{', runs on CPU' if g in host_groups else ''})"
        parts.append(
            f'<g><title>{esc(tip)}</title><rect x="{x:.0f}" y="{y:.0f}" width="{_NODE_W}" height="{_NODE_H}" rx="4" '
            f'fill="{fill}" stroke="#555"/><text x="{x + _NODE_W / 2:.0f}" y="{y + 15:.0f}" '
            f'text-anchor="middle">{esc(label)}</text></g>'
        )
    parts.append("</g></svg>")
    return "".join(parts)


def dag_legend(dag: dict[str, Any]) -> str:
    items = []
    for g in dag.get("groups", []):
        fill = _HOST_COLOR if g.get("host") else group_color(g["group"])
        what = "host op (CPU)" if g.get("host") else "program"
        items.append(f'<span class="chip" style="background:{fill}">{what} {g["group"]}: {g["ops"]} ops</span>')
    return "".join(items)


# --- the timeline chart -------------------------------------------------------------------------------


def timeline_svg(timeline: list[dict[str, Any]]) -> str:
    if not timeline:
        return "<p>(no flushes)</p>"
    w, h, left, bottom, top = 900, 230, 48, 28, 22
    n = len(timeline)
    peak = max(b["flushes"] for b in timeline) or 1
    total_compiles = sum(b["compiles"] for b in timeline) or 1
    bw = (w - left - 10) / n
    plot_h = h - bottom - top
    parts = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
             f'aria-label="compiles and cache hits per flush" font-size="10" font-family="sans-serif">']
    parts.append(f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="#444"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="#444"/>')
    parts.append(f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{peak}</text>')
    parts.append(f'<text x="{left - 4}" y="{h - bottom}" text-anchor="end">0</text>')
    cum, points = 0, []
    for i, b in enumerate(timeline):
        x = left + i * bw
        hc = plot_h * b["compiles"] / peak
        hh = plot_h * b["hits"] / peak
        span = f"flush {b['first_flush']}" + (f"-{b['first_flush'] + b['flushes'] - 1}" if b["flushes"] > 1 else "")
        tip = f"{span}: {b['compiles']} compiled, {b['hits']} cache hits, {secs(b['seconds'])}"
        parts.append(f'<g><title>{esc(tip)}</title>')
        if b["hits"]:
            parts.append(f'<rect x="{x:.1f}" y="{h - bottom - hh:.1f}" width="{max(bw - 0.5, 0.5):.1f}" '
                         f'height="{hh:.1f}" fill="#6ab187"/>')
        if b["compiles"]:
            parts.append(f'<rect x="{x:.1f}" y="{h - bottom - hh - hc:.1f}" width="{max(bw - 0.5, 0.5):.1f}" '
                         f'height="{hc:.1f}" fill="#e0794a"/>')
        parts.append("</g>")
        cum += b["compiles"]
        points.append(f"{x + bw / 2:.1f},{h - bottom - plot_h * cum / total_compiles:.1f}")
    parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#3b5ba5" stroke-width="1.5"/>')
    parts.append(f'<text x="{w - 12}" y="{top - 8}" text-anchor="end" fill="#3b5ba5">cumulative compiles '
                 f'(max {sum(b["compiles"] for b in timeline)})</text>')
    last = timeline[-1]["first_flush"] + timeline[-1]["flushes"] - 1
    parts.append(f'<text x="{left}" y="{h - 8}">flush 0</text>')
    parts.append(f'<text x="{w - 10}" y="{h - 8}" text-anchor="end">flush {last}</text>')
    parts.append("</svg>")
    return "".join(parts)


# --- tables ------------------------------------------------------------------------------------------------


def html_table(headers: list[str], rows: list[list[Any]], code_col: int | None = None) -> str:
    if not rows:
        return "<p class=\"none\">none</p>"
    out = ["<table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in headers), "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>")
        for i, c in enumerate(r):
            cls = ' class="code"' if i == code_col else (' class="num"' if isinstance(c, (int, float)) else "")
            out.append(f"<td{cls}>{esc(c)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _where(row: dict) -> str:
    if row.get("file") and row.get("line"):
        return f"{short_path(row['file'])}:{row['line']}"
    return row.get("where") or "<unknown>"


def _ops(op_counts: list[dict] | None) -> str:
    if not op_counts:
        return ""
    return " ".join(f"{c['op']}×{c['count']}" if c["count"] > 1 else c["op"] for c in op_counts)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:4px 0} th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums} td.code{font-family:monospace;white-space:pre}
.cards{display:flex;flex-wrap:wrap;gap:10px} .card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px}
.card b{display:block;font-size:20px} .warn{background:#fff4d6;border:1px solid #e0b84a;padding:8px;border-radius:6px}
.note{color:#6b5600} .chip{display:inline-block;padding:2px 8px;margin:2px;border-radius:10px;font-size:12px;border:1px solid #999}
.scroll{overflow:auto;max-height:900px;border:1px solid #ddd} .none{color:#888} .ops{font-family:monospace;font-size:12px}
"""


def render(rep: dict[str, Any], top: int = 5) -> str:
    """The whole HTML page as one string."""
    s, t, mem, fl, fu = rep["summary"], rep["time"], rep["memory"], rep["flushes"], rep["fusion"]
    script = rep.get("script") or {}
    title = "deferfuse report"
    if script.get("argv"):
        title += ": " + " ".join([short_path(script["argv"][0])] + list(script["argv"][1:]))
    p: list[str] = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
                    f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
                    f"<h1>{esc(title)}</h1>"]
    meta = [f"default mode {rep.get('mode')}"]
    if script.get("exit_code"):
        meta.append(f"exit code {script['exit_code']}: {script.get('error') or ''}")
    p.append(f"<p>{esc(', '.join(meta))}</p>")
    if rep.get("note"):
        p.append(f'<p class="note">{esc(rep["note"])}</p>')

    cards = [("ops recorded", s["ops_recorded"]), ("flushes", s["flushes"]), ("programs compiled", s["programs_compiled"]),
             ("cache hits", f"{s['cache_hits']} ({pct(s['cache_hit_rate'])})"), ("programs run", s["programs_executed"]),
             ("ops per program", "-" if s["fusion_ratio"] is None else f"{s['fusion_ratio']:.1f}"),
             ("recompiles", "-" if s["recompiles"] is None else s["recompiles"]), ("CPU fallbacks", s["cpu_fallbacks"]),
             ("wall time", secs(t["wall_seconds"]))]
    p.append("<h2>Summary</h2><div class=\"cards\">")
    p += [f'<div class="card"><b>{esc(v)}</b>{esc(k)}</div>' for k, v in cards]
    p.append("</div>")
    p.append("<h2>Time</h2>")
    p.append(html_table(["recording", "compiling", "executing", "waiting at syncs", "other flush work", "rest of script", "wall"],
                        [[secs(t["record_seconds"]), secs(t["compile_seconds"]), secs(t["execute_seconds"]),
                          secs(t["sync_wait_seconds"]), secs(t["flush_other_seconds"]), secs(t["other_seconds"]),
                          secs(t["wall_seconds"])]]))

    if rep.get("compare"):
        other = rep["compare"]
        p.append("<h2>Side by side</h2>")
        p.append(html_table(["", f"mode {rep.get('mode')}", f"mode {other.get('mode')}"], [list(r) for r in compare_rows(rep, other)]))

    p.append("<h2>Compiles and cache hits per flush</h2>")
    p.append('<p>Orange: flushes that compiled a new program; green: cache hits; blue line: programs compiled so far.</p>')
    p.append(timeline_svg(rep.get("timeline") or []))

    p.append("<h2>Flushes</h2>")
    p.append(html_table(["cause", "count"], [[c["cause"], c["count"]] for c in fl["by_cause"]]))
    p.append(html_table(["source line", "flushes", "compiles", "causes", "code"],
                        [[_where(x), x["count"], x["compiles"], ", ".join(f"{k} {v}" for k, v in x["causes"].items()),
                          x.get("code") or ""] for x in fl["by_source"][: max(top, 10)]], code_col=4))

    rc = rep.get("recompiles")
    p.append("<h2>Recompilations</h2>")
    if rc is None:
        p.append('<p class="none">not collected</p>')
    else:
        p.append(f"<p>{rc['count']} recompiles, {rc['after_warm_up']} after warm-up (the first "
                 f"{rc['warm_up_compiles_per_site']} compiles at each flush site); {rc['late_recompiles']} recompiles and {rc['late_compiles']} "
                 f"compiles in all in the last {rc['late_flushes']} flushes.</p>")
        if rc.get("warning"):
            p.append(f'<p class="warn">{esc(rc["warning"])}</p>')
        p.append(html_table(["source line", "times", "what changed", "code"],
                            [[_where(g), g["count"], g["example"], g.get("code") or ""] for g in rc["by_site"][: max(top, 10)]],
                            code_col=3))

    p.append("<h2>Fusion</h2>")
    ratio = "-" if fu["fusion_ratio"] is None else f"{fu['fusion_ratio']:.1f}"
    p.append(f"<p>{ratio} ops recorded per program run ({s['ops_recorded']} ops / {fu['programs_executed']} runs).</p>")
    p.append(html_table(["ops per program", "programs compiled", "program runs"],
                        [[h["ops"], h["programs_compiled"], h["program_runs"]] for h in fu["ops_per_program"]]))
    p.append("<p>Why programs end:</p>")
    p.append(html_table(["reason", "programs"], [[b["why"], b["count"]] for b in fu["breaks"]]))
    p.append("<p>Largest flushes:</p>")
    p.append(html_table(["ops", "programs", "runs", "flushed at", "ops"],
                        [[x["ops"], x["programs"], x["runs"], _where(x), _ops(x["op_counts"])] for x in fu["largest_programs"][:top]],
                        code_col=4))
    if fu.get("decompositions_replayed"):
        p.append("<p>Decomposed ops recorded as one node (their expansion was learned once):</p>")
        p.append(html_table(["op", "calls"], [[x["op"], x["count"]] for x in fu["decompositions_replayed"][:top]]))

    dag = rep.get("dag")
    p.append("<h2>Largest flushed DAG</h2>")
    if dag:
        more = f" ({dag['nodes_omitted']} more nodes not drawn)" if dag.get("nodes_omitted") else ""
        p.append(f"<p>{len(dag['nodes'])} ops flushed at {esc(_where(dag))}{more}; colour = the program each op was "
                 f"fused into; hover a node for details.</p><p>{dag_legend(dag)}</p>")
        p.append(f'<div class="scroll">{dag_svg(dag)}</div>')
    else:
        p.append('<p class="none">no DAG: nothing was compiled while collecting</p>')

    p.append("<h2>Programs that took the most time</h2>")
    p.append(html_table(["total", "compile", "runs", "ops", "flushed at", "ops"],
                        [[secs(x["total_seconds"]), secs(x["compile_seconds"]), x["flushes"], x["ops"], _where(x),
                          _ops(x["op_counts"])] for x in rep["programs_by_time"][:top]], code_col=5))

    fb = rep["fallbacks"]
    p.append("<h2>CPU fallbacks</h2>")
    p.append(html_table(["op", "count"], [[x["op"], x["count"]] for x in fb["by_op"]]))
    if fb["by_source"]:
        p.append(html_table(["op", "times", "source line", "reason", "code"],
                            [[x["op"], x["count"], _where(x), x.get("reason") or "", x.get("code") or ""]
                             for x in fb["by_source"][: max(top, 10)]], code_col=4))

    p.append("<h2>Memory</h2>")
    p.append(html_table(["", "tensors", "bytes"], [
        ["intermediates never materialised", mem["intermediates_skipped"], human_bytes(mem["bytes_skipped"])],
        ["tensors materialised", mem["outputs_materialized"], human_bytes(mem["bytes_materialized"])],
        ["of those, written in place (donated buffers)", mem["buffers_donated"], human_bytes(mem["bytes_donated"])],
    ]))
    data = json.dumps(rep, default=str).replace("</", "<\\/")
    p.append(f'<script type="application/json" id="deferfuse-report">{data}</script>')
    p.append("</body></html>")
    return "\n".join(p)
