"""Per-op overhead and example step times, side by side in one run.

    python bench/overhead.py [--reps 7] [--steps 20]

Prints medians (and minima) of interleaved repetitions, so a noisy shared machine affects every
column alike. Columns:
- bare mode: a pass-through TorchDispatchMode returning a precomputed tensor (the floor any
  Python dispatch-mode engine pays per op);
- record: DeferAndFuse recording cost per op (8-element adds, nothing executed);
- strict: Strict per op (each op compiled once, then dispatched on its own).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import deferfuse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

N_OPS = 1000


class _Bare(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _Bare.result


def _chain(a, b, n):
    x = a
    for _ in range(n):
        x = x + b
    return x


def per_op_us(reps: int) -> dict[str, list[float]]:
    a = torch.ones(8).to("tpu")
    b = torch.ones(8).to("tpu")
    _Bare.result = a
    cpu = torch.ones(8)
    results: dict[str, list[float]] = {"cpu eager": [], "bare mode": [], "record (defer)": [], "strict": []}

    def cpu_run():
        t0 = time.perf_counter()
        _chain(cpu, cpu, N_OPS)
        return time.perf_counter() - t0

    def bare_run():
        with _Bare():
            t0 = time.perf_counter()
            _chain(a, b, N_OPS)
            return time.perf_counter() - t0

    def record_run():
        with deferfuse.mode():
            t0 = time.perf_counter()
            _chain(a, b, N_OPS)
            dt = time.perf_counter() - t0
        return dt

    def strict_run():
        with deferfuse.mode("strict"):
            t0 = time.perf_counter()
            y = _chain(a, b, N_OPS)
            dt = time.perf_counter() - t0
        y.cpu()
        return dt

    runs = {"cpu eager": cpu_run, "bare mode": bare_run, "record (defer)": record_run, "strict": strict_run}
    for fn in runs.values():  # warm-up: compile, fill caches
        fn()
    for _ in range(reps):
        for name, fn in runs.items():
            results[name].append(fn() / N_OPS * 1e6)
    return results


def _step_loop(workload: str, mode: str):
    """A prepared training loop: returns run(n) that times n steady-state steps (ending in a sync)."""
    import contextlib

    import torch.nn.functional as F

    import gpt_train
    import mlp_train

    device = "cpu" if mode == "cpu" else "tpu"
    torch.manual_seed(0)
    if workload.startswith("mlp"):
        model = mlp_train.make_model().to(device)
        data = mlp_train.batches(512, 64)

        def loss_fn(x, y):
            return F.mse_loss(model(x), y)
    else:
        cfg = gpt_train.GPTConfig()
        model = gpt_train.GPT(cfg).to(device)
        data = gpt_train.batches(cfg, 8)

        def loss_fn(x, y):
            return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [next(data) for _ in range(4)]
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    ctx = deferfuse.mode(mode) if device == "tpu" else contextlib.nullcontext()

    def run(n: int) -> float:
        with ctx:
            t0 = time.perf_counter()
            for i in range(n):
                x, y = batches[i % len(batches)]
                loss = loss_fn(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad()
            loss.item()
            return time.perf_counter() - t0

    return run


def step_ms(reps: int, steps: int) -> dict[str, dict[str, list[float]]]:
    workloads = ["mlp (3x512, batch 64)", "gpt (4 layers, d128, batch 8)"]
    modes = ["cpu", "strict", "defer_and_fuse"]
    out: dict[str, dict[str, list[float]]] = {w: {m: [] for m in modes} for w in workloads}
    for w in workloads:
        loops = {m: _step_loop(w, m) for m in modes}
        for m in modes:
            loops[m](steps)  # warm-up: every program compiled, the cut pattern settled
            loops[m](steps)
        for _ in range(reps):
            for m in modes:
                out[w][m].append(loops[m](steps) / steps * 1e3)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-reps", type=int, default=3)
    args = p.parse_args(argv)

    ops = per_op_us(args.reps)
    print(f"\n## Per-op cost (8-element add, {N_OPS} ops per rep, {args.reps} reps)\n")
    print("| | median µs/op | min µs/op | × bare mode (median) |")
    print("|---|---:|---:|---:|")
    bare = statistics.median(ops["bare mode"])
    for name, xs in ops.items():
        med = statistics.median(xs)
        print(f"| {name} | {med:.1f} | {min(xs):.1f} | {med / bare:.2f} |")

    steps = step_ms(args.step_reps, args.steps)
    print(f"\n## Training step time (ms/step, median of {args.step_reps} runs of {args.steps} steps)\n")
    print("| workload | cpu | strict | defer_and_fuse | cpu / defer | strict / defer |")
    print("|---|---:|---:|---:|---:|---:|")
    for w, by in steps.items():
        med = {m: statistics.median(v) for m, v in by.items()}
        print(f"| {w} | {med['cpu']:.1f} | {med['strict']:.1f} | {med['defer_and_fuse']:.1f} | "
              f"{med['cpu'] / med['defer_and_fuse']:.2f} | {med['strict'] / med['defer_and_fuse']:.2f} |")


if __name__ == "__main__":
    main()
