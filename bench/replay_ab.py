"""DeferAndFuse with its step replay on and off, in alternating blocks of steps (issue 41).

    python bench/replay_ab.py [--blocks 40] [--steps 25] [--workload "gpt host (4 layers, d16, T8, B2)"]

Two models of the same workload in one process, the same programs: one steps with the replay on
(executors/replay.py), the other with it off (`DEFERFUSE_REPLAY=0`, every step recorded). Blocks
alternate, their order flipping each block, so a shared machine's drift falls on both; the figure
to read is the median of each block pair's ratio. Thread CPU time (the host's own work) and wall
time, one intra-op thread.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import deferfuse
from deferfuse.config import CONFIG

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import workloads  # noqa: E402

HOST = "gpt host (4 layers, d16, T8, B2)"


def measure(blocks: int, steps: int, workload: str = HOST) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    was = CONFIG.replay
    try:
        make = workloads.WORKLOADS[workload]
        runners = {"on": make("defer_and_fuse"), "off": make("defer_and_fuse")}
        for name, r in runners.items():
            CONFIG.replay = name == "on"
            for _ in range(5):
                r.step()
            r.sync()
        times = {f"{k}_{c}": [] for k in runners for c in ("thread", "wall")}
        replayed = deferfuse.metrics()["ops_replayed"]
        for b in range(blocks):
            for name in ("off", "on") if b % 2 == 0 else ("on", "off"):
                r = runners[name]
                CONFIG.replay = name == "on"
                t0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(steps):
                    r.step()
                r.sync()
                times[f"{name}_thread"].append((time.thread_time() - t0) / steps * 1e3)
                times[f"{name}_wall"].append((time.perf_counter() - w0) / steps * 1e3)
        replayed = (deferfuse.metrics()["ops_replayed"] - replayed) / (blocks * steps)
    finally:
        CONFIG.replay = was
        torch.set_num_threads(threads)
    return {"times": times, "workload": workload, "blocks": blocks, "steps": steps, "replayed_per_step": replayed}


def render(res: dict) -> str:
    t = res["times"]
    rows = []
    for clock in ("thread", "wall"):
        on, off = t[f"on_{clock}"], t[f"off_{clock}"]
        pairs = sorted(a / b for a, b in zip(on, off))
        q = len(pairs) // 4
        rows.append(f"| {clock} | {statistics.median(off):.2f} | {statistics.median(on):.2f} "
                    f"| {statistics.median(pairs):.3f} | {pairs[q]:.3f} to {pairs[-1 - q]:.3f} |")
    return "\n".join([
        f"## Step replay on and off, {res['workload']} (ms per step, {res['blocks']} alternating blocks of "
        f"{res['steps']} steps)",
        "",
        "| clock | recorded | replayed | replayed / recorded (paired median) | interquartile |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"top-level calls replayed per step: {res['replayed_per_step']:.0f}",
    ])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--workload", default=HOST, choices=sorted(workloads.WORKLOADS))
    a = p.parse_args(argv)
    print(render(measure(a.blocks, a.steps, a.workload)))


if __name__ == "__main__":
    main()
