"""deferfuse's report: where a run flushed, what it compiled and why, what fused, what ran on CPU.

Three ways in, one dict out (its schema is docs/report-schema.md):

- `deferfuse-report script.py args` (or `python -m deferfuse.report ...`) runs a script and prints
  the report; `--json` and `--html` write it to files (see `cli.py`);
- `deferfuse.report()` builds it for the current process, from the events collected so far
  (DEFERFUSE_REPORT=1 starts collecting at import, so a script needs no changes);
- `deferfuse.explain(fn, *args, **kwargs)` runs fn once with collection on and reports just that.

`import deferfuse` rebinds the name `deferfuse.report` to the function below, so import this
package's parts with `from deferfuse.report import collect` (a from-import), never with
`import deferfuse.report.collect as ...`.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .. import api, cache, events
from ..config import CONFIG
from ..modes import get_default_mode
from . import collect, text

__all__ = ["report", "explain", "start", "format_text", "write_html", "write_json"]

# When this process started collecting through `start()` (the wall-clock origin of `report()`).
_STARTED: float | None = None


def start() -> None:
    """Start collecting events now (and time the run from here). Idempotent."""
    global _STARTED
    if not events.collecting():
        events.start_collecting()
        _STARTED = time.perf_counter()
    elif _STARTED is None:
        _STARTED = time.perf_counter()


def _metrics() -> dict[str, Any]:
    return api.metrics()


def _truncated(evs: list) -> bool:
    return len(evs) >= events._EVENT_CAP


def report() -> dict[str, Any]:
    """The report for this process so far, as a JSON-ready dict.

    If events are not being collected, the dict says so in `note` (and `collecting` is False) but
    still carries every counter: ops, flushes by cause, cache hits and misses, times, fallbacks.
    """
    on = events.collecting()
    evs = events.events() if on else []
    wall = None if _STARTED is None or not on else time.perf_counter() - _STARTED
    return collect.build(evs, _metrics(), collecting=on, wall_seconds=wall, mode=get_default_mode().value,
                         events_truncated=on and _truncated(evs))


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run `fn(*args, **kwargs)` once with collection on and return the report of just that call.

    fn runs in whatever mode is current; afterwards `deferfuse.sync()` runs what it left pending,
    so its work is in the report (that flush has cause "sync" at the caller's line). Counters
    are the difference across the call; the DAG drawn is the largest fn compiled (a call whose
    programs are all cached compiles nothing, so it has no DAG and no compile details).
    """
    was_on = events.collecting()
    if not was_on:
        events.start_collecting()
    cache.reset_snapshot()
    before = _metrics()
    t0 = time.perf_counter()
    try:
        fn(*args, **kwargs)
        api.sync(depth=3)
        wall = time.perf_counter() - t0
        evs = [e for e in events.events() if e.get("t", t0) >= t0]
        after = _metrics()
    finally:
        if not was_on:
            events.stop_collecting()
    return collect.build(evs, collect.diff_metrics(before, after), collecting=True, wall_seconds=wall,
                         mode=get_default_mode().value, events_truncated=_truncated(evs))


def format_text(rep: dict[str, Any], top: int = 5, color: bool = False) -> str:
    """The terminal form of a report dict (about one screen with top=5)."""
    return text.render(rep, top=top, color=color)


def write_html(rep: dict[str, Any], path: str, top: int = 5) -> None:
    """Write the one-file HTML form of a report dict (no network: inline SVG and CSS only)."""
    from . import html  # noqa: PLC0415  (the HTML form's code loads only when asked for)

    with open(path, "w", encoding="utf-8") as f:
        f.write(html.render(rep, top=top))


def write_json(rep: dict[str, Any], path: str) -> None:
    """Write a report dict as JSON (schema: docs/report-schema.md)."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1, default=str)
        f.write("\n")


if CONFIG.report:
    start()
