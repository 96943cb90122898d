"""Run fuzz programs on CPU and on tpu in each mode, compare, shrink, and print reproducers.

Each statement runs on its own, so an exception is attributed to the statement that raised it: a
bad call must raise CPU's exception type at that call in every mode, and a DeferAndFuse error
that surfaces at a later flush shows up as a disagreement at a later statement (or at the final
read). At the end every live name is compared: tensors by dtype, shape, significant strides
(dims longer than one, as PyTorch's own tests compare them) and values; host reads by value.

    python tests/fuzz/fuzz_run.py --count 10000        # a long run; --start, --modes, --log
    python tests/fuzz/fuzz_run.py --count 10000 --jobs 2   # in fresh processes, two at a time
"""
from __future__ import annotations

import argparse
import cmath
import concurrent.futures
import contextlib
import inspect
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import deferfuse  # noqa: E402
from fuzz_gen import generate, inp, namespace  # noqa: E402

MODES = ("strict", "debug", "defer_and_fuse")
DATA_CHECK = "# data-check"
_NAME = re.compile(r"[avr]\d+")  # the program's own names (not torch, d, _t, __warningregistry__)
# per dtype (rtol, atol): the inputs are exact, but transcendental functions and reductions in a
# different order round differently, and a chain of up to 40 ops carries that along
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.complex64: (1e-4, 1e-4), torch.float64: (1e-7, 1e-7),
             torch.bfloat16: (2e-2, 2e-2)}


@dataclass
class Trace:
    errors: list = field(default_factory=list)  # per statement: None or (type, message)
    values: dict = field(default_factory=dict)  # name -> snapshot, after the last statement
    final: tuple | None = None  # an exception raised by the final read or leaving the mode


@dataclass
class Failure:
    mode: str
    kind: str  # error, late, missing, dtype, shape, stride, value
    where: str  # the statement (error) or the name (everything else)
    detail: str

    @property
    def signature(self):
        return (self.mode, self.kind, self.where)

    def __str__(self):
        return f"[{self.mode}] {self.kind} at {self.where}: {self.detail}"


def _snapshot(v):
    if isinstance(v, torch.Tensor):
        meta = (v.dtype, tuple(v.shape), tuple(v.stride()))
        return ("tensor",) + meta + (v.detach().cpu().clone(),)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, [_snapshot(x) for x in v])
    return ("py", v)


def run(stmts: list[str], device: str, mode: str | None, cpu: Trace | None = None) -> Trace:
    """Run a program statement by statement. `cpu`: CPU's trace, which tells a data check
    Strict and DeferAndFuse do not make (CPU raised, tpu computed) to drop the result."""
    trace = Trace()
    ns = namespace(device)
    codes = [compile(s, "<fuzz>", "exec") for s in stmts]
    ctx = deferfuse.mode(mode) if mode else contextlib.nullcontext()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with ctx:
                for i, code in enumerate(codes):
                    try:
                        exec(code, ns)
                        trace.errors.append(None)
                    except Exception as err:  # noqa: BLE001 - compared with CPU's
                        trace.errors.append((type(err), str(err)))
                    if cpu is not None and mode != "debug" and stmts[i].endswith(DATA_CHECK) \
                            and cpu.errors[i] is not None and trace.errors[i] != cpu.errors[i]:
                        # unchecked in this mode, as documented: tpu computed, or raised the error
                        # CPU raises after its data check (a complex alpha after the index range)
                        trace.errors[i] = cpu.errors[i]
                        ns.pop(stmts[i].split(" = ")[0], None)
                for k in sorted(ns):
                    if _NAME.fullmatch(k):
                        trace.values[k] = _snapshot(ns[k])
        except Exception as err:  # noqa: BLE001
            trace.final = (type(err), str(err))
    return trace


def _sig_strides(shape, stride):
    return tuple(s for n, s in zip(shape, stride) if n > 1) if math.prod(shape) else ()


def _diff(exp, got) -> tuple[str, str] | None:
    """(kind, detail) of the first difference between two snapshots, or None."""
    if exp[0] != got[0]:
        return "value", f"CPU gave {exp[0]}, tpu {got[0]}"
    if exp[0] == "tensor":
        _, edt, esh, est, ev = exp
        _, gdt, gsh, gst, gv = got
        if edt != gdt:
            return "dtype", f"CPU {edt}, tpu {gdt}"
        if esh != gsh:
            return "shape", f"CPU {esh}, tpu {gsh}"
        if _sig_strides(esh, est) != _sig_strides(gsh, gst):
            return "stride", f"CPU {est}, tpu {gst} (shape {esh})"
        if edt.is_floating_point or edt.is_complex:
            rtol, atol = TOLERANCE.get(edt, (1e-4, 1e-4))
            if edt.is_complex:  # which parts of a non-finite complex number are NaN is not kept (docs/limits.md)
                both = ~torch.isfinite(ev) & ~torch.isfinite(gv)
                ev, gv = ev.masked_fill(both, 0), gv.masked_fill(both, 0)
            try:
                torch.testing.assert_close(gv, ev, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
            except AssertionError as err:
                return "value", str(err).replace("\n", " ")[:300] + f"\nCPU: {ev}\ntpu: {gv}"
        elif not torch.equal(gv, ev):
            return "value", f"\nCPU: {ev}\ntpu: {gv}"
        return None
    if exp[0] == "py":
        e, g = exp[1], got[1]
        if type(e) is not type(g) and not (isinstance(e, tuple) and isinstance(g, tuple)):
            return "value", f"CPU {e!r} ({type(e).__name__}), tpu {g!r} ({type(g).__name__})"
        if not _py_close(e, g):
            return "value", f"CPU {e!r}, tpu {g!r}"
        return None
    if len(exp[1]) != len(got[1]):
        return "value", f"CPU has {len(exp[1])} items, tpu {len(got[1])}"
    for e, g in zip(exp[1], got[1]):
        d = _diff(e, g)
        if d is not None:
            return d
    return None


def _py_close(e, g) -> bool:
    if isinstance(e, (list, tuple)):
        return isinstance(g, (list, tuple)) and len(e) == len(g) and all(_py_close(a, b) for a, b in zip(e, g))
    if isinstance(e, (float, complex)):
        if isinstance(e, float) and math.isnan(e):
            return isinstance(g, float) and math.isnan(g)
        # as for tensors: which parts of a non-finite complex number are NaN is not kept
        # (docs/limits.md), and a NaN part never compares equal (seed 8801: `.item()` of nan+nanj)
        if isinstance(e, complex) and isinstance(g, complex) and not cmath.isfinite(e) and not cmath.isfinite(g):
            return True
        return type(e) is type(g) and (e == g or abs(e - g) <= 2e-2 * abs(e) + 1e-3)
    return type(e) is type(g) and e == g


def _err_name(e) -> str:
    return "no error" if e is None else f"{e[0].__name__}: {e[1][:200]}"


def compare(stmts, cpu: Trace, got: Trace, mode: str) -> list[Failure]:
    out = []
    for s, e, g in zip(stmts, cpu.errors, got.errors):
        if (e is None) != (g is None) or (e is not None and e[0] is not g[0]):
            out.append(Failure(mode, "error", s, f"CPU {_err_name(e)} | tpu {_err_name(g)}"))
    if got.final is not None:
        out.append(Failure(mode, "late", "the final read", _err_name(got.final)))
        return out
    for k in sorted(set(cpu.values) | set(got.values)):
        if k not in cpu.values or k not in got.values:
            out.append(Failure(mode, "missing", k, f"defined on {'CPU' if k in cpu.values else 'tpu'} only"))
            continue
        d = _diff(cpu.values[k], got.values[k])
        if d is not None:
            out.append(Failure(mode, d[0], k, d[1]))
    return out


def check(stmts: list[str], modes=MODES) -> list[Failure]:
    cpu = run(stmts, "cpu", None)
    out = []
    for m in modes:
        out += compare(stmts, cpu, run(stmts, "tpu", m, cpu), m)
    return out


def _still_fails(stmts, failure: Failure) -> bool:
    cpu = run(stmts, "cpu", None)
    if any(e is not None and e[0] in (NameError, UnboundLocalError) for e in cpu.errors):
        return False  # a statement lost a name it uses
    got = run(stmts, "tpu", failure.mode, cpu)
    return any(f.signature == failure.signature for f in compare(stmts, cpu, got, failure.mode))


def shrink(stmts: list[str], failure: Failure, budget: int = 80) -> list[str]:
    """Drop statements (halves, then quarters, ..., then one at a time) while the same failure,
    in the same mode at the same statement or name, persists."""
    cur = list(stmts)
    chunk = max(len(cur) // 2, 1)
    while budget > 0:
        changed = False
        i = len(cur) - chunk
        while i >= 0 and budget > 0:
            cand = cur[:i] + cur[i + chunk:]
            budget -= 1
            if cand and _still_fails(cand, failure):
                cur, changed = cand, True
            i -= chunk
        if chunk == 1 and not changed:
            break
        chunk = max(chunk // 2, 1) if not changed or chunk > 1 else 1
    return cur


def reproducer(stmts: list[str], failure: Failure, seed=None) -> str:
    cpu = run(stmts, "cpu", None)
    lines = [f"# deferfuse fuzz{'' if seed is None else f' seed {seed}'}: {failure}",
             "# run the body with d = 'cpu' and with d = 'tpu' and compare; a line marked 'raises' raises on CPU",
             "import torch, torch.nn.functional as F, deferfuse", "", inspect.getsource(inp).rstrip(), "",
             "d = 'tpu'", f"with deferfuse.mode({failure.mode!r}):"]
    for s, e in zip(stmts, cpu.errors):
        lines.append(f"    {s}" + (f"  # raises {e[0].__name__}: {e[1][:80]!r}" if e is not None else ""))
    return "\n".join(lines)


def check_seed(seed: int, modes=MODES, shrink_budget: int = 80) -> tuple[str | None, set]:
    """(None, {}) when the seed's program agrees with CPU in every mode, else a report of its
    first failure with a shrunk reproducer (and the other failures listed), and the modes that
    disagreed."""
    stmts = generate(seed)
    failures = check(stmts, modes)
    if not failures:
        return None, set()
    first = failures[0]
    small = shrink(stmts, first, shrink_budget) if shrink_budget else stmts
    rest = "".join(f"\n#   also: {f}".replace("\n", "\n#   ") for f in failures[1:6])
    report = reproducer(small, first, seed) + ("\n# other failures of the full program:" + rest if rest else "")
    return report, {f.mode for f in failures}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--log", default=None, help="append each failure's reproducer to this file")
    p.add_argument("--shrink", type=int, default=80, help="tpu runs to spend shrinking each failure")
    p.add_argument("--jobs", type=int, default=0, help="run the seeds in this many processes at once, in chunks")
    p.add_argument("--chunk", type=int, default=250, help="seeds per process with --jobs")
    p.add_argument("--summary", default=None, help=argparse.SUPPRESS)  # a chunk's counts, for --jobs
    a = p.parse_args(argv)
    if a.jobs:
        return _run_chunks(a)
    modes = tuple(a.modes.split(","))
    ok = bad = 0
    agreed = dict.fromkeys(modes, 0)
    t0 = time.time()
    for seed in range(a.start, a.start + a.count):
        rep, failed = check_seed(seed, modes, a.shrink)
        for m in modes:
            agreed[m] += m not in failed
        if rep is None:
            ok += 1
        else:
            bad += 1
            print(rep.splitlines()[0], flush=True)
            if a.log:
                with open(a.log, "a") as f:
                    f.write(rep + "\n\n")
        done = ok + bad
        if done % 100 == 0 or done == a.count:
            per_mode = ", ".join(f"{m} {n}" for m, n in agreed.items())
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
            print(f"{done} programs (seeds {seed + 1 - done}..{seed}): {ok} agreed in every mode, {bad} disagreed; "
                  f"agreed per mode: {per_mode}; {time.time() - t0:.0f} s, max RSS {rss} MiB", flush=True)
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump({"ok": ok, "bad": bad, "agreed": agreed}, f)
    return 1 if bad else 0


def _run_chunks(a) -> int:
    """--jobs: chunks of seeds in fresh processes, `jobs` at a time. A fresh process per chunk
    keeps memory bounded (every process holds the programs it compiled), and with the persistent
    compile cache on (DEFERFUSE_CACHE_DIR) the processes share what each compiled."""
    def chunk(start: int) -> tuple[int, dict]:
        count = min(a.chunk, a.start + a.count - start)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        cmd = [sys.executable, os.path.abspath(__file__), "--start", str(start), "--count", str(count),
               "--modes", a.modes, "--shrink", str(a.shrink), "--summary", path] + (["--log", a.log] if a.log else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("# "):  # a failure's first line; the log has its reproducer
                print(line, flush=True)
        try:
            with open(path) as f:
                return start, json.load(f)
        except (OSError, ValueError):
            print(f"chunk {start}..{start + count - 1} died (exit {proc.returncode}):\n{proc.stderr[-2000:]}", flush=True)
            return start, {"ok": 0, "bad": count, "agreed": {}}
        finally:
            os.unlink(path)

    t0, ok, bad, agreed = time.time(), 0, 0, dict.fromkeys(a.modes.split(","), 0)
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for start, res in pool.map(chunk, range(a.start, a.start + a.count, a.chunk)):
            ok, bad = ok + res["ok"], bad + res["bad"]
            for m, n in res["agreed"].items():
                agreed[m] += n
            per_mode = ", ".join(f"{m} {n}" for m, n in agreed.items())
            print(f"{ok + bad} programs (seeds {a.start}..{start + a.chunk - 1}, {a.jobs} processes): {ok} agreed in "
                  f"every mode, {bad} disagreed; agreed per mode: {per_mode}; {time.time() - t0:.0f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
