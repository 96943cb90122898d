"""Where a training step's CPU goes, thread by thread.

    python bench/threads.py [--workloads mlp,gpt] [--engines defer_and_fuse,jit] [--cores all,1] [--rounds 3]

On JAX's CPU backend the program XLA runs and the host thread that records the next step share
the machine's cores, so a step's wall time is set by how much CPU each side takes, not by either
one alone. This prints, per workload and engine, the wall time of a steady step and the CPU time
per step of:
- the main thread: deferfuse's dispatcher and flush plus PyTorch's own autograd, optimizer and
  module code (for jit, only the replay's call);
- XLA's compute threads (`tf_XLAEigen`, one per core);
- every other thread (PJRT's dispatch threads and the like).
`--cores 1` runs the same step with the process confined to one core before JAX starts, so
XLA's thread pool has one thread: jit's CPU there is the program's own work, and the difference
from its all-core row is what running it on several threads costs (synchronisation and threads
waiting for work). Each row is the median of `--rounds` fresh processes, run in alternation.
The clock is /proc's per-thread CPU time, in ticks of 10 ms, so each run lasts about 2 s.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SHORT = {"mlp": "mlp train (3x512, batch 64)", "gpt": "gpt train (4 layers, d128)",
         "convnet": "convnet train (2 conv, bs 32)", "chain": "chain (20 ops, 16M floats)"}


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, grouped as main, xla and other."""
    tick = os.sysconf("SC_CLK_TCK")
    pid = os.getpid()
    out = {"main": 0.0, "xla": 0.0, "other": 0.0}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            stat = open(task + "/stat").read()
            name = open(task + "/comm").read().strip()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        tid = int(task.rsplit("/", 1)[1])
        group = "main" if tid == pid else "xla" if name.startswith("tf_XLAEigen") else "other"
        out[group] += seconds
    return out


def measure(name: str, engine: str, seconds: float = 2.0, warm: int = 5) -> dict:
    """One workload and engine in this process: wall and per-thread CPU ms per steady step."""
    sys.path.insert(0, HERE)
    import deferfuse  # noqa: F401  (makes "tpu" a device)
    import workloads

    r = workloads.WORKLOADS[name](engine)
    for _ in range(warm):
        r.step()
    r.sync()
    t0 = time.perf_counter()
    for _ in range(warm):
        r.step()
    r.sync()
    per_step = (time.perf_counter() - t0) / warm
    steps = max(warm, int(seconds / max(per_step, 1e-4)))
    before = thread_cpu()
    t0 = time.perf_counter()
    for _ in range(steps):
        r.step()
    r.sync()
    wall = time.perf_counter() - t0
    after = thread_cpu()
    res = {k: (after[k] - before[k]) / steps * 1e3 for k in before}
    res["wall"] = wall / steps * 1e3
    res["total"] = res["main"] + res["xla"] + res["other"]
    res["steps"] = steps
    return res


def _child(name: str, engine: str, cores: str, seconds: float) -> dict:
    code = (
        "import os, sys, json\n"
        f"if {cores!r} == '1': os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import threads\n"
        f"print(json.dumps(threads.measure({name!r}, {engine!r}, {seconds!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"rc {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(rows: list[dict]) -> str:
    lines = ["| workload | engine | cores | wall ms/step | main thread | XLA threads | other threads | total CPU |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['workload']} | {row['engine']} | {row['cores']} | {row['error']} |||||")
            continue
        lines.append(f"| {row['workload']} | {row['engine']} | {row['cores']} | {row['wall']:.2f} | "
                     f"{row['main']:.2f} | {row['xla']:.2f} | {row['other']:.2f} | {row['total']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="mlp,gpt")
    ap.add_argument("--engines", default="defer_and_fuse,jit")
    ap.add_argument("--cores", default="all,1", help="'all', '1', or both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each timed run")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    names = [SHORT.get(w, w) for w in args.workloads.split(",")]
    combos = [(n, e, c) for n in names for c in args.cores.split(",") for e in args.engines.split(",")]
    results: dict[tuple, list] = {c: [] for c in combos}
    for rnd in range(args.rounds):
        for combo in combos:
            print(f"... round {rnd + 1}: {' / '.join(combo)}", file=sys.stderr, flush=True)
            results[combo].append(_child(*combo, args.seconds))
    rows = []
    for (name, engine, cores), runs in results.items():
        row = {"workload": name, "engine": engine, "cores": cores}
        ok = [r for r in runs if "error" not in r]
        if not ok:
            row["error"] = runs[0]["error"]
        else:
            for k in ("wall", "main", "xla", "other", "total"):
                row[k] = statistics.median(r[k] for r in ok)
        rows.append(row)
    print(render(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "runs": {" / ".join(k): v for k, v in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
