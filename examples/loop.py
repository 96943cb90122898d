"""The training loop both examples share: the mode block, the steps, the logged losses.

Everything deferfuse-specific in the examples is here, in two lines: tpu work runs inside
`with deferfuse.mode(mode)`, and the tpu generator is seeded like the CPU one. The rest is the
loop any PyTorch script has.
"""
from __future__ import annotations

import contextlib
import shlex
import sys
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
    """What a user reads at a glance after a run: speed, compiles, why the host flushed, CPU
    fallbacks, the persistent cache. Every counter is in `deferfuse.metrics()`, and
    `deferfuse-report` says why each flush and compile happened: printed whole, the forty
    counters hid the few that say whether a run went well."""
    elapsed = time.perf_counter() - t0
    head = f"{steps} steps in {elapsed:.1f}s ({mode}): {steps / elapsed:.2f} steps/s"
    if mode == "cpu":
        print(head)
        return
    m = deferfuse.metrics()
    compiling = m["compile_seconds"]
    print(f"{head}, {steps / max(elapsed - compiling, 1e-9):.2f} without compile time")
    print(f"compile: {m['programs_compiled']} programs, {compiling:.2f}s, {m['xla_compile_seconds']:.2f}s of it in XLA "
          f"(persistent cache: {m['persistent_cache_hits']} hits, {m['persistent_cache_misses']} misses)")
    causes = sorted(m["flushes_by_cause"].items(), key=lambda kv: -kv[1])
    print(f"flushes: {m['flushes']}" + (f" ({', '.join(f'{n} {c}' for c, n in causes)})" if causes else ""))
    ops = sorted(m["cpu_fallbacks"].items(), key=lambda kv: -kv[1])
    print(f"CPU fallbacks: {m['cpu_fallbacks_total']}" + (f" ({', '.join(f'{op} {n}' for op, n in ops)})" if ops else ""))
    print(f"why each flush and compile: deferfuse-report {shlex.join(sys.argv)}; every counter: deferfuse.metrics()")
