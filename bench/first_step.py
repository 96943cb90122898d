"""Time to the first steps of one workload under one engine, in a process of its own (issue 41).

    DEFERFUSE_CACHE_DIR= python bench/first_step.py "gpt host" compiled [--steps 20]

`python -m bench` times the first step inside a process that has already run other engines;
this one starts cold, as a user's script does. The clock starts once the device is open (JAX's
first array), and stops after each of the first three steps (each synced): the time at which it
had finished, the programs deferfuse compiled for it and their seconds. Then `--steps` steps give
the steady step's wall time, and the last loss is printed to compare two builds of deferfuse (put
the other on PYTHONPATH, ahead of this checkout).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax

import deferfuse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import workloads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", help="a name prefix of bench/workloads.py's WORKLOADS")
    ap.add_argument("engine", choices=workloads.ENGINES)
    ap.add_argument("--steps", type=int, default=20, help="steps timed after the first three")
    a = ap.parse_args()
    name = next(k for k in workloads.WORKLOADS if k.startswith(a.workload))
    jax.numpy.zeros(1).block_until_ready()  # the device opened before the clock
    metrics = deferfuse.metrics
    t0 = time.perf_counter()
    runner = workloads.WORKLOADS[name](a.engine)
    for i in range(3):
        p0, c0 = metrics()["programs_compiled"], metrics()["compile_seconds"]
        loss = runner.step()
        runner.sync()
        print(f"step {i} done at {time.perf_counter() - t0:.2f} s: {metrics()['programs_compiled'] - p0} programs "
              f"compiled in {metrics()['compile_seconds'] - c0:.2f} s")
    t1 = time.perf_counter()
    for _ in range(a.steps):
        loss = runner.step()
    runner.sync()
    print(f"{name}, {a.engine}, deferfuse at {os.path.dirname(deferfuse.__file__)}: steady "
          f"{(time.perf_counter() - t1) / a.steps * 1e3:.2f} ms/step, last loss {_number(loss)!r}")


def _number(loss):
    return float(loss.detach()) if hasattr(loss, "detach") else loss


if __name__ == "__main__":
    main()
