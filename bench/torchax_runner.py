"""Run one workload under torchax in this process and print its timings as JSON.

torchax needs a lenient import on torch 2.13 (see torchax_shim.py) and installs its own dispatch
machinery, so bench/run.py runs it here, in a process of its own, never beside deferfuse.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    name, warm, steps, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    window_ms = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    from workloads import WORKLOADS, _ctx, steps_for

    out = {"engine": "torchax", "workload": name}
    try:
        t0 = time.perf_counter()
        with _ctx("torchax"):  # torchax moves tensors to "jax" only inside its environment
            runner = WORKLOADS[name]("torchax")
        runner.step()
        runner.sync()
        out["first_ms"] = (time.perf_counter() - t0) * 1e3
        out["flops"] = runner.flops
        for _ in range(warm):
            runner.step()
        runner.sync()
        t0 = time.perf_counter()
        runner.step()
        runner.sync()
        steps = steps_for(window_ms, (time.perf_counter() - t0) * 1e3, steps)
        out["steps_per_run"] = steps
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(steps):
                runner.step()
            runner.sync()
            times.append((time.perf_counter() - t0) / steps * 1e3)
        out["step_ms"] = times
    except Exception as e:  # noqa: BLE001 - reported in the table, not hidden
        out["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out["trace"] = traceback.format_exc()[-2000:]
    print("TORCHAX_RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
