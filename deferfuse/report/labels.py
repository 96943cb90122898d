"""Plain-data helpers of the report: where an event happened (file, line, source text), how
ops, keys and recompile reasons read, and how lists are capped and bucketed. Pure functions of
the event list, shared by collect.py (which builds the dict) and the text and HTML forms.
"""
from __future__ import annotations

import linecache
import os
from collections import Counter, defaultdict
from typing import Any, Iterable

from .. import sources

LIST_CAP = 100


# --- locations ---------------------------------------------------------------------------------


class Locator:
    """Formats recorded locations once each: a run has millions of events but few distinct lines."""

    def __init__(self) -> None:
        self._memo: dict[Any, dict[str, Any]] = {}

    def __call__(self, where: Any) -> dict[str, Any]:
        if isinstance(where, str):
            return loc_from_string(where)
        try:
            hit = self._memo.get(where)
        except TypeError:  # an unhashable location: format it without memoising
            return loc(where)
        if hit is None:
            hit = self._memo[where] = loc(where)
        return hit


def loc(where: Any) -> dict[str, Any]:
    if where is None:
        return {"where": "<unknown>", "file": None, "line": None, "function": None}
    filename, line, function = sources.parts(where)
    return {
        "where": f"{filename}:{line}" if line else filename,
        "file": filename,
        "line": line or None,
        "function": function or None,
    }


def loc_from_string(s: str) -> dict[str, Any]:
    head, sep, tail = s.rpartition(":")
    if sep and tail.isdigit():
        return {"where": s, "file": head, "line": int(tail), "function": None}
    return {"where": s, "file": s, "line": None, "function": None}


def source_text(file: str | None, line: int | None) -> str | None:
    """The stripped source line, for the terminal and HTML (None when the file is not readable)."""
    if not file or not line:
        return None
    text = linecache.getline(file, line).strip()
    return text or None


def short_path(path: str | None) -> str:
    """A path relative to the working directory when it lies under it (what a user typed)."""
    if not path:
        return "<unknown>"
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def short_op(name: str) -> str:
    """'aten.addmm.default' -> 'addmm', 'aten.add.Tensor' -> 'add.Tensor' (labels stay short)."""
    if name.startswith("aten."):
        name = name[5:]
    if name.endswith(".default"):
        name = name[: -len(".default")]
    return name


def key_str(key: Any) -> str | None:
    """A cache key hash as 16 hex digits: JSON-safe (JavaScript loses 64-bit integers)."""
    if key is None:
        return None
    if isinstance(key, str):
        return key
    return format(int(key) & 0xFFFFFFFFFFFFFFFF, "016x")


# --- recompiles ----------------------------------------------------------------------------------


def why_text(why: dict | None, recompile: bool = True) -> str:
    """One line saying what changed in the cache key against the last program compiled here."""
    if why is None:
        return "first compile at this site" if not recompile else "changed (not explained: collection started late)"
    what = why.get("what")
    b, n = why.get("before"), why.get("now")
    if what == "input":
        return f"input #{why.get('input')} changed shape/dtype: {b} -> {n}"
    if what == "input_order":
        return (f"the same inputs in another order (#{why.get('input')}: {b} -> {n}): the step read one "
                "of them first somewhere else this time")
    if what == "inputs":
        return f"number of inputs changed: {b} -> {n}"
    if what == "precision":
        return f"float32 matmul precision of {short_op(str(why.get('op')))} at {why.get('where')} changed: {b} -> {n}"
    if what == "op_args":
        return f"arguments of {short_op(str(why.get('op')))} at {why.get('where')} changed: ({b}) -> ({n})"
    if what == "structure":
        return f"different op at node {why.get('node')} ({why.get('where')}): {short_op(str(b))} -> {short_op(str(n))}"
    if what == "length":
        return f"number of recorded nodes changed: {b} -> {n}"
    if what == "outputs":
        return (f"number of outputs changed: {b} -> {n} (the tensors still alive when the graph ran: one kept "
                "from another step, or one only a reference cycle holds until Python's collector runs)")
    if what == "donation":
        return ("same graph, but a different set of inputs was free to donate to outputs (some value "
                "was held elsewhere this time, or released): compiled a variant that reuses their buffers")
    return "cache key changed (no single difference found)"


# --- building blocks -------------------------------------------------------------------------------


def capped(items: list, cap: int = LIST_CAP) -> tuple[list, int]:
    return items[:cap], max(0, len(items) - cap)


def rate(a: float, b: float) -> float | None:
    return a / b if b else None


def op_counts(names: Iterable[str]) -> list[dict[str, Any]]:
    c = Counter(short_op(n) for n in names)
    return [{"op": op, "count": k} for op, k in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]


def bucket(n: int) -> tuple[int, int | None]:
    """Power-of-two histogram bucket [lo, hi] holding n (hi None for the last, open bucket)."""
    lo = 1
    while lo * 2 <= n:
        lo *= 2
    if lo >= 1024:
        return 1024, None
    return lo, lo * 2 - 1


def bucket_label(lo: int, hi: int | None) -> str:
    if hi is None:
        return f"{lo}+"
    return str(lo) if lo == hi else f"{lo}-{hi}"


def split_events(events: list[dict]) -> dict[str, list[dict]]:
    """Events by kind, each compile/fallback tagged with the index of the flush it belongs to.

    The cache emits a flush's compile event just before the flush event itself, and a fallback
    is noted while recording the ops of the next flush, so "the number of flushes seen so far"
    is the index of the flush each belongs to.
    """
    out: dict[str, list[dict]] = defaultdict(list)
    n_flush = 0
    for e in events:
        kind = e.get("kind")
        if kind == "flush":
            e = dict(e, index=n_flush)
            n_flush += 1
        elif kind in ("compile", "fallback"):
            e = dict(e, flush_index=n_flush)
        out[kind].append(e)
    return out


# --- sections ----------------------------------------------------------------------------------------
