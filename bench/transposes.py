"""What folding transposes into matrix products (deferfuse/passes.py) buys, per workload and engine.

    python bench/transposes.py [--reps 20] [--workloads gpt,kv]

Runs one steady step of each workload, keeps every program that step ran with its inputs, then
times each program jitted as it was traced (`plain`) and with the pass (`fold`), interleaved, in
one process, and prints the sum of the medians, each times the runs it had in the step: device
time per step, host work left out.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

import deferfuse  # noqa: E402,F401  (makes "tpu" a device)
from deferfuse import passes  # noqa: E402
from deferfuse.cache import runtime  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


def programs_of_one_step(runner) -> list:
    """[Compiled, inputs, scalars, times run] of each distinct program one steady step runs."""
    seen: dict = {}
    run, call = runtime.Compiled.run, runtime.Compiled.__call__

    def keep(c, inputs, scalars):
        seen.setdefault(id(c), [c, list(inputs), list(scalars), 0])[3] += 1

    inside_run = [False]  # `run` without a buffer to donate calls the program through `__call__`

    def run_kept(self, inputs, scalars, replaces=None):
        keep(self, inputs, scalars)
        inside_run[0] = True
        try:
            return run(self, inputs, scalars, replaces)
        finally:
            inside_run[0] = False

    def call_kept(self, inputs, scalars):
        if not inside_run[0]:
            keep(self, inputs, scalars)
        return call(self, inputs, scalars)

    runtime.Compiled.run, runtime.Compiled.__call__ = run_kept, call_kept
    try:
        runner.step()
        runner.sync()
    finally:
        runtime.Compiled.run, runtime.Compiled.__call__ = run, call
    return list(seen.values())


def measure(programs, reps: int) -> dict[str, float]:
    total = {"plain": 0.0, "fold": 0.0}
    for c, inputs, scalars, runs in programs:
        traced = c.fn.__wrapped__  # what jax.jit was given
        plain = getattr(traced, "unfolded", traced)
        scs = c._scalars(scalars)
        fns = {"plain": jax.jit(plain), "fold": jax.jit(passes.fold_transposes(plain))}
        times: dict[str, list] = {k: [] for k in fns}
        for f in fns.values():
            jax.block_until_ready(f(inputs, scs))
        for _ in range(reps):
            for k, f in fns.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f(inputs, scs))
                times[k].append(time.perf_counter() - t0)
        for k in total:
            total[k] += statistics.median(times[k]) * 1e3 * runs
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--workloads", default="mlp train (3x512,gpt train (4,convnet,kv decode")
    p.add_argument("--engines", default="strict,defer_and_fuse,jit,compiled")
    a = p.parse_args()
    prefixes = a.workloads.split(",")
    print("| workload | engine | programs | plain ms | folded ms | plain / folded |")
    print("|---|---|---:|---:|---:|---:|")
    for name, make in WORKLOADS.items():
        if not any(name.startswith(x) for x in prefixes):
            continue
        for engine in a.engines.split(","):
            try:
                runner = make(engine)
            except NotImplementedError:
                continue
            for _ in range(3):
                runner.step()
            runner.sync()
            progs = programs_of_one_step(runner)
            t = measure(progs, a.reps)
            print(f"| {name} | {engine} | {len(progs)} | {t['plain']:.2f} | {t['fold']:.2f} | "
                  f"{t['plain'] / t['fold']:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
