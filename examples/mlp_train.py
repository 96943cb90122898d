"""Train a 3-layer MLP on a synthetic regression task, on "tpu" through deferfuse or on CPU.

    python examples/mlp_train.py --mode defer_and_fuse --steps 100
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import loop


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
    device = loop.device_for(mode)
    model = make_model(width, dropout).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return loop.run(mode, steps, model, opt, batches(width, batch), F.mse_loss, log_every=log_every, quiet=quiet)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="defer_and_fuse", choices=loop.MODES)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    train(args.mode, args.steps, args.width, args.batch, args.dropout, args.log_every)
    loop.summary(args.mode, args.steps, t0)

if __name__ == "__main__":
    main()
