"""A/B of the mode block as a TorchDispatchMode against the same engine without it.

    python bench/mode_ab.py [--reps 7]

"default": DeferAndFuse as the process's default mode (`set_default_mode`, what
TORCH_TPU_DEFER_AND_FUSE=1 does): tpu tensors reach deferfuse through the subclass alone.
"block": the same steps inside `with deferfuse.mode():`, which is a TorchDispatchMode on PyTorch's
stack and so also sees every CPU op of the block. Interleaved repetitions, medians.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import deferfuse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import gpt_train  # noqa: E402
import mlp_train  # noqa: E402


def _ctx(how: str):
    if how == "block":
        return deferfuse.mode()
    deferfuse.set_default_mode("defer_and_fuse")
    return contextlib.nullcontext()


def _restore(how: str):
    if how == "default":
        deferfuse.set_default_mode("strict")


def record_us(how: str, n: int = 1000) -> float:
    a = torch.ones(8, device="tpu")
    with _ctx(how):
        deferfuse.sync()
        t0 = time.perf_counter()
        x = a
        for _ in range(n):
            x = x + a
        t = time.perf_counter() - t0
        deferfuse.sync()
    _restore(how)
    return t / n * 1e6


def _stepper(kind: str):
    torch.manual_seed(0)
    if kind == "mlp":
        model = mlp_train.make_model(512).to("tpu")
        data = mlp_train.batches(512, 64)
        loss_of = F.mse_loss
    else:
        cfg = gpt_train.GPTConfig(layers=4, dim=128)
        model = gpt_train.GPT(cfg).to("tpu")
        data = gpt_train.batches(cfg, 8)

        def loss_of(logits, y):
            return F.cross_entropy(logits.flatten(0, 1), y.flatten())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the default, foreach, CPU step counters
    batches = [tuple(t.to("tpu") for t in next(data)) for _ in range(4)]

    def step(i):
        x, y = batches[i % len(batches)]
        loss = loss_of(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def step_ms(how: str, step, steps: int) -> float:
    with _ctx(how):
        step(0).item()  # warm
        t0 = time.perf_counter()
        for i in range(steps):
            loss = step(i)
        loss.item()
        t = time.perf_counter() - t0
    _restore(how)
    return t / steps * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    rows = {"record µs/op": [], "mlp step ms": [], "gpt step ms": []}
    steppers = {"mlp": _stepper("mlp"), "gpt": _stepper("gpt")}
    for how in ("default", "block"):  # warm-up: compile every program once each way
        record_us(how)
        for s in steppers.values():
            step_ms(how, s, 3)
    got = {k: {"default": [], "block": []} for k in rows}
    for _ in range(args.reps):
        for how in ("default", "block"):
            got["record µs/op"][how].append(record_us(how))
            got["mlp step ms"][how].append(step_ms(how, steppers["mlp"], args.steps))
            got["gpt step ms"][how].append(step_ms(how, steppers["gpt"], max(args.steps // 2, 2)))
    print(f"{'':14s} {'default':>9s} {'block':>9s} {'block/default':>14s}")
    for k, v in got.items():
        d, b = statistics.median(v["default"]), statistics.median(v["block"])
        print(f"{k:14s} {d:9.2f} {b:9.2f} {b / d:13.3f}x")


if __name__ == "__main__":
    main()
