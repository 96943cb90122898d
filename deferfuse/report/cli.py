"""`deferfuse-report [options] script.py [args...]`: run a script under deferfuse and report on it.

The script runs exactly as `python script.py args` would (its own sys.argv, `__name__ ==
"__main__"`, its directory first on sys.path), in DeferAndFuse unless `--mode` says otherwise, with
event collection on from its first line. A script that exits with an error still gets its report
(that is often when it is needed most), and the tool exits with the script's exit code.

`--compare MODE` runs the script twice, each in a fresh subprocess (a shared process would share
the compile cache and hide the second run's compiles), and shows both runs side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

import deferfuse

from .. import cache, events
from . import collect, format_text, write_html, write_json

MODES = ("defer_and_fuse", "strict", "debug")
# Options that take a value: the first argument that is neither one of these nor an option is
# the script, and everything after it belongs to the script.
_VALUED = {"--mode", "--json", "--html", "--top", "--compare"}

USAGE = "deferfuse-report [--mode M] [--json FILE] [--html FILE] [--top N] [--compare MODE] [--quiet] script.py [args ...]"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="deferfuse-report",
        usage=USAGE,
        description="Run a Python script with deferfuse and report its flushes, compiles, recompiles, fusion, "
        "CPU fallbacks and memory (schema of --json: docs/report-schema.md).",
    )
    p.add_argument("--mode", choices=MODES, default="defer_and_fuse",
                   help="default mode for tpu ops outside `with deferfuse.mode()` blocks (default: defer_and_fuse)")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (DAG drawing, charts)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="rows per list in the terminal and HTML (default 5)")
    p.add_argument("--compare", choices=MODES, metavar="MODE",
                   help="run the script twice, in --mode and in MODE (one subprocess each), and compare")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the terminal report")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """(our options, script, script args): the script is the first non-option argument."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i], (argv[i + 1] if i + 1 < len(argv) else None), argv[i + 2 :]
        if a in _VALUED:
            i += 2
            continue
        if a.startswith("-") and a != "-":
            i += 1
            continue
        return argv[:i], a, argv[i + 1 :]
    return argv, None, []


def main(argv: list[str] | None = None) -> int:
    """Entry point of `deferfuse-report` and `python -m deferfuse.report`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, script, script_args = split_argv(argv)
    opts = _parser().parse_args(ours)
    if script is None:
        _parser().error("no script given")
    if not os.path.isfile(script):
        print(f"deferfuse-report: can't open file {script!r}", file=sys.stderr)
        return 2
    if opts.compare:
        return _compare(opts, script, script_args)
    rep, code = run_script(script, script_args, opts.mode)
    _emit(rep, opts)
    return code


def run_script(script: str, args: list[str], mode: str) -> tuple[dict[str, Any], int]:
    """Run `script` here as `python script args` would, collecting events; (report, exit code)."""
    previous_mode = deferfuse.get_default_mode()
    deferfuse.set_default_mode(mode)
    if events.collecting():
        events.stop_collecting()
    deferfuse.reset_metrics()
    cache.reset_snapshot()
    path = os.path.abspath(script)
    saved_argv, saved_path0 = sys.argv, (sys.path[0] if sys.path else None)
    sys.argv = [script, *args]
    if sys.path:
        sys.path[0] = os.path.dirname(path)
    else:
        sys.path.insert(0, os.path.dirname(path))
    code, error = 0, None
    events.start_collecting()
    t0 = time.perf_counter()
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:  # noqa: BLE001 - the report is most useful when the script failed
        traceback.print_exc()
        code, error = (130 if isinstance(e, KeyboardInterrupt) else 1), f"{type(e).__name__}: {e}"
    finally:
        wall = time.perf_counter() - t0
        evs = events.stop_collecting()
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] == os.path.dirname(path):
            sys.path[0] = saved_path0
    metrics = deferfuse.metrics()  # before restoring the mode: that flushes what the script left pending
    try:
        deferfuse.set_default_mode(previous_mode)
    except Exception as e:  # noqa: BLE001 - a failure in leftover work is the script's, not the report's
        print(f"[deferfuse-report] running the work the script left pending failed: {e}", file=sys.stderr)
    sys.stdout.flush()
    script_info = {"path": path, "argv": [script, *args], "exit_code": code, "error": error}
    rep = collect.build(evs, metrics, collecting=True, wall_seconds=wall, script=script_info, mode=mode,
                        events_truncated=len(evs) >= events._EVENT_CAP)
    return rep, code


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _emit(rep: dict[str, Any], opts: argparse.Namespace) -> None:
    if opts.json:
        write_json(rep, opts.json)
    if opts.html:
        write_html(rep, opts.html, top=opts.top)
    if not opts.quiet:
        print(file=sys.stdout)
        print(format_text(rep, top=opts.top, color=sys.stdout.isatty()), file=sys.stdout)
        written = [f for f in (opts.json, opts.html) if f]
        if written:
            print("written: " + ", ".join(written), file=sys.stdout)
    sys.stdout.flush()


def _compare(opts: argparse.Namespace, script: str, args: list[str]) -> int:
    """Run the script in --mode and in --compare MODE, each in a subprocess; report side by side."""
    reports, codes = [], []
    with tempfile.TemporaryDirectory(prefix="deferfuse-report-") as tmp:
        for i, mode in enumerate((opts.mode, opts.compare)):
            out = os.path.join(tmp, f"run{i}.json")
            print(f"[deferfuse-report] run {i + 1}/2: mode {mode}", file=sys.stderr, flush=True)
            cmd = [sys.executable, "-m", "deferfuse.report", "--quiet", "--mode", mode, "--json", out, script, *args]
            codes.append(subprocess.run(cmd).returncode)
            if not os.path.exists(out):
                print(f"[deferfuse-report] the {mode} run wrote no report (exit code {codes[-1]})", file=sys.stderr)
                return codes[-1] or 1
            with open(out, encoding="utf-8") as f:
                reports.append(json.load(f))
    rep = reports[0]
    rep["compare"] = reports[1]
    _emit(rep, opts)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
