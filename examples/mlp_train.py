"""Train a 3-layer MLP on a synthetic regression task, on "tpu" through deferfuse or on CPU.

    python examples/mlp_train.py --mode defer_and_fuse --steps 100
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_model(width: int = 512, dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(width, 1),
    )


def batches(width: int, batch: int, seed: int = 99):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(width, 1, generator=g) / width**0.5
    while True:
        x = torch.randn(batch, width, generator=g)
        y = torch.tanh(x @ w_true) + 0.05 * torch.randn(batch, 1, generator=g)
        yield x, y


def train(mode: str, steps: int, width: int = 512, batch: int = 64, dropout: float = 0.0, log_every: int = 10,
          quiet: bool = False) -> list[float]:
    torch.manual_seed(0)
    device = "cpu" if mode == "cpu" else "tpu"
    if device == "tpu":
        import deferfuse

        ctx = deferfuse.mode(mode)
        torch.tpu.manual_seed(0)
    else:
        ctx = contextlib.nullcontext()
    model = make_model(width, dropout).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(width, batch)
    losses = []
    t0 = time.perf_counter()
    with ctx:
        for step in range(steps):
            x, y = next(data)
            x, y = x.to(device), y.to(device)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step % log_every == 0 or step == steps - 1:
                losses.append(loss.item())
                if not quiet:
                    print(f"step {step:4d}  loss {losses[-1]:.5f}  ({time.perf_counter() - t0:.1f}s)", flush=True)
    return losses


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="defer_and_fuse", choices=["defer_and_fuse", "strict", "debug", "cpu"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    train(args.mode, args.steps, args.width, args.batch, args.dropout, args.log_every)
    print(f"{args.steps} steps in {time.perf_counter() - t0:.1f}s ({args.mode})")
    if args.mode != "cpu":
        import deferfuse

        m = deferfuse.metrics()
        print("metrics:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items()})


if __name__ == "__main__":
    main()
