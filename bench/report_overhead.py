"""What collecting report events costs: a small deferred loop with collection off and on.

    python bench/report_overhead.py [--reps 15] [--steps 20]

Collection (what `deferfuse-report`, DEFERFUSE_REPORT=1 and `deferfuse.explain` turn on) times
every top-level op and keeps one event dict per flush and compile; the budget is 10% on a loop
that is all recording and cache hits, the worst case for per-op costs. Repetitions alternate
off/on so a noisy shared machine affects both columns alike; the table shows medians (and
minima), the overhead (median of the per-pair ratios), and the time to build the report.

This is a benchmark, not a test: timing assertions on a shared 2-core CI machine would flake.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import deferfuse
from deferfuse import events
from deferfuse.report import collect

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

BUDGET = 0.10


def chain_loop(steps: int, ops: int = 50) -> None:
    """`ops` elementwise ops per step and one `.item()`: recording and cache hits only."""
    x = torch.ones(64).to("tpu")
    with deferfuse.mode():
        for _ in range(steps):
            for _ in range(ops // 2):
                x = x * 0.5 + 1.0
            x.sum().item()


def mlp_loop(steps: int) -> None:
    """The MLP example's training step (forward, backward, AdamW) at a small width."""
    from mlp_train import batches, make_model

    torch.manual_seed(0)
    model = make_model(64).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(64, 32)
    with deferfuse.mode():
        for _ in range(steps):
            x, y = next(data)
            loss = F.mse_loss(model(x.to("tpu")), y.to("tpu"))
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()


def timed(fn, steps: int, collecting: bool) -> tuple[float, list]:
    evs: list = []
    if collecting:
        events.start_collecting()
    t0 = time.perf_counter()
    try:
        fn(steps)
    finally:
        dt = time.perf_counter() - t0
        if collecting:
            evs = events.stop_collecting()
    return dt, evs


def measure(name: str, fn, steps: int, reps: int) -> list:
    fn(steps)  # compile everything once: the loop measured is steady state
    off, on, build = [], [], []
    for _ in range(reps):
        off.append(timed(fn, steps, False)[0])
        dt, evs = timed(fn, steps, True)
        on.append(dt)
        t0 = time.perf_counter()
        collect.build(evs, deferfuse.metrics())
        build.append(time.perf_counter() - t0)
    m_off, m_on = statistics.median(off), statistics.median(on)
    # the median of paired ratios: each pair ran back to back, so slow drift in the machine's
    # load cancels out within a pair
    over = statistics.median(b / a for a, b in zip(off, on)) - 1
    return [name, f"{m_off * 1e3:.1f} ({min(off) * 1e3:.1f})", f"{m_on * 1e3:.1f} ({min(on) * 1e3:.1f})",
            f"{100 * over:+.1f}%", "ok" if over <= BUDGET else "OVER", f"{statistics.median(build) * 1e3:.1f}"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    rows = [measure(f"chain: 50 ops/step, {args.steps} steps", chain_loop, args.steps, args.reps),
            measure(f"mlp_train width 64, {args.steps} steps", mlp_loop, args.steps, args.reps)]
    headers = ["loop", "off ms (min)", "collecting ms (min)", "overhead", f"<= {BUDGET:.0%}", "build report ms"]
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for r in [headers, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    return 0 if all(r[4] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
