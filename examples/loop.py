"""The training loop both examples share: the mode block, the steps, the logged losses.

Everything deferfuse-specific in the examples is here, in two lines: tpu work runs inside
`with deferfuse.mode(mode)`, and the tpu generator is seeded like the CPU one. The rest is the
loop any PyTorch script has.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch

import deferfuse

MODES = ["defer_and_fuse", "strict", "debug", "cpu"]


def device_for(mode: str) -> str:
    """"cpu" runs the example on CPU eager, for comparison; every other mode on tpu."""
    torch.manual_seed(0)
    if mode == "cpu":
        return "cpu"
    torch.tpu.manual_seed(0)
    return "tpu"


def run(mode: str, steps: int, model: torch.nn.Module, opt: torch.optim.Optimizer, data: Iterator,
        loss_of: Callable, *, clip: float = 0.0, sched=None, log_every: int = 10, quiet: bool = False,
        fmt: str = ".5f") -> list[float]:
    """Run `steps` steps; returns the loss of every step where it was read (each log_every-th and
    the last: a read is a sync point, so reading every step would cut DeferAndFuse's programs)."""
    device = next(model.parameters()).device
    ctx = contextlib.nullcontext() if mode == "cpu" else deferfuse.mode(mode)
    losses = []
    t0 = time.perf_counter()
    with ctx:
        for step in range(steps):
            x, y = next(data)
            loss = loss_of(model(x.to(device)), y.to(device))
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            if step % log_every == 0 or step == steps - 1:
                losses.append(loss.item())
                if not quiet:
                    print(f"step {step:4d}  loss {losses[-1]:{fmt}}  ({time.perf_counter() - t0:.1f}s)", flush=True)
    return losses


def summary(mode: str, steps: int, t0: float) -> None:
    print(f"{steps} steps in {time.perf_counter() - t0:.1f}s ({mode})")
    if mode != "cpu":
        m = deferfuse.metrics()
        print("metrics:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items()})
