"""bench/: the suite still runs, and a timed run is long enough to be a steady state."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import run as bench_run  # noqa: E402
import workloads  # noqa: E402


@pytest.mark.parametrize("window_ms, step_ms, least, want", [
    (500, 3.4, 5, 148),   # a 3.4 ms step: enough steps to fill the window
    (500, 370, 5, 5),     # a step longer than the window: never fewer than asked
    (500, 0.0, 5, 500),   # a step too fast to time: capped
    (0, 3.4, 5, 5),       # no window: the fewest steps asked for
])
def test_steps_fill_the_window(window_ms, step_ms, least, want):
    assert workloads.steps_for(window_ms, step_ms, least) == want


def test_suite_runs_a_training_workload_in_every_in_process_engine():
    name = "mlp train, loss.item() every step"
    engines = ["cpu", "strict", "defer_and_fuse", "jit", "compiled"]
    res = bench_run.measure_workload(name, engines, warm=1, steps=2, reps=1, window_ms=20.0)
    for e in engines:
        assert "error" not in res[e], res[e]
        assert len(res[e]["step_ms"]) == 1 and res[e]["step_ms"][0] > 0
        # the same run length for every engine of a workload, at least what was asked for
        assert res[e]["steps_per_run"] == res["cpu"]["steps_per_run"] >= 2
        assert res[e]["compiled_steady"] == 0
    table = bench_run.render({"workloads": {name: res}}, engines)
    assert name in table and "defer vs jit" in table
    row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    assert row.count("×") == 4, row  # defer vs strict, defer vs jit, compiled vs jit, compiled vs defer


def test_thread_breakdown_measures_each_group_and_one_core_has_no_xla_pool():
    """bench/threads.py: the recording thread's CPU shows on its own line, and a process confined
    to one core before JAX starts runs its programs without XLA's thread pool (what the one-core
    rows of docs/performance.md compare against)."""
    import threads

    name = "mlp train, loss.item() every step"
    res = threads.measure(name, "defer_and_fuse", seconds=0.3, warm=2)
    assert res["wall"] > 0 and res["main"] > 0 and res["steps"] >= 2
    assert abs(res["total"] - (res["main"] + res["xla"] + res["other"])) < 1e-9
    one = threads._child(name, "jit", "1", 0.3)
    assert "error" not in one, one
    assert one["xla"] == 0 and one["other"] > 0
    assert name in threads.render([{"workload": name, "engine": "jit", "cores": "1", **one}])


def test_transposes_times_each_program_of_a_step_once_per_run():
    import transposes

    r = workloads.mlp("jit")
    for _ in range(2):
        r.step()
    r.sync()
    progs = transposes.programs_of_one_step(r)
    assert [runs for *_, runs in progs] == [1]  # a captured step: one program, run once
    t = transposes.measure(progs, reps=1)
    assert t["plain"] > 0 and t["fold"] > 0
