"""Long runs keep memory flat: a 100,000-op recording loop, flushes of 20,000 pending ops, and
1,000 training steps. Run by tests/test_long_runs.py: `python long_runs.py WHICH` prints one JSON
line per checkpoint: ops or steps done, the process RSS in MB (after a GC) and the bytes of the
live arrays JAX holds (the device memory in use)."""
from __future__ import annotations

import gc
import json
import os
import sys

import jax
import torch
import torch.nn as nn

import deferfuse


def point(done: int) -> None:
    gc.collect()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    live = sum(a.nbytes for a in jax.live_arrays())
    print(json.dumps({"done": done, "rss_mb": rss, "device_bytes": live, "pending": deferfuse.metrics()["pending_nodes"]}),
          flush=True)


def recording_loop(n: int = 100_000) -> None:
    """A tight loop the repeated-op heuristic cuts every 64 ops."""
    x = torch.zeros(64, device="tpu")
    with deferfuse.mode():
        for i in range(1, n + 1):
            x = x + 1
            if i % 20_000 == 0:
                point(i)
    assert x[0].item() == n


def big_flushes(n: int = 20_000, times: int = 3) -> None:
    """Straight-line code with no repetition the heuristic sees (DEFERFUSE_PERIOD_LOOKBACK=4 and
    a raised cap, set by the test): each flush takes `n` pending ops at once."""
    x = torch.zeros(64, device="tpu")
    with deferfuse.mode():
        for t in range(1, times + 1):
            for i in range(n // 5):
                x = ((x * 1.0001).sin() + 1).cos() - 0.5  # a period of five ops: past the lookback
            assert deferfuse.metrics()["pending_nodes"] >= n
            x[0].item()
            point(t)


def training(steps: int = 1000) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64).to("tpu"), torch.randint(0, 10, (32,)).to("tpu")
    with deferfuse.mode():
        for step in range(1, steps + 1):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if step % 200 == 0:
                deferfuse.sync()
                point(step)


if __name__ == "__main__":
    {"loop": recording_loop, "flush": big_flushes, "train": training}[sys.argv[1]]()
