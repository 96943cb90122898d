"""Memory stays flat over long runs (issue 31): each run in its own process, its RSS and the
device memory JAX holds read at checkpoints. Growth past the first checkpoint (compiles, caches
warming up) would be a leak: a graph, a plan, a storage or a host copy kept per op or per step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, child_env

pytestmark = pytest.mark.subprocess  # each run is a process of its own


def _run(which: str, **env) -> list[dict]:
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "long_runs.py"), which], capture_output=True,
                         text=True, timeout=600, env=child_env(**env))
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.parametrize("which,env,slack_mb", [
    ("loop", {}, 4),
    ("flush", {"DEFERFUSE_PERIOD_LOOKBACK": "4", "DEFERFUSE_MAX_PENDING": "100000"}, 8),
    ("train", {}, 4),
])
def test_memory_stays_flat(which, env, slack_mb):
    points = _run(which, **env)
    assert len(points) >= 3, points
    first, last = points[0], points[-1]
    assert last["rss_mb"] - first["rss_mb"] < slack_mb, points
    assert {p["device_bytes"] for p in points[1:]} == {last["device_bytes"]}, points  # the same live arrays
