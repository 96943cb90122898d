"""Train a small GPT on synthetic tokens, on "tpu" through deferfuse or on plain CPU PyTorch.

    python examples/gpt_train.py --mode defer_and_fuse --steps 50

The model code is ordinary PyTorch; the only deferfuse-specific lines, the `with
deferfuse.mode(...)` block around the loop, are in loop.py, which mlp_train.py shares. `--mode cpu`
runs the same script on CPU eager for comparison.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import loop


@dataclass
class GPTConfig:
    vocab: int = 256
    seq: int = 64
    layers: int = 4
    heads: int = 4
    dim: int = 128
    dropout: float = 0.0


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.out = nn.Linear(4 * cfg.dim, cfg.dim)
        self.heads = cfg.heads
        self.drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.drop(self.proj(y))
        x = x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))
        return x


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def batches(cfg: GPTConfig, batch: int, seed: int = 1234):
    """Synthetic tokens with structure to learn: each sequence counts up from a random start."""
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, cfg.vocab, (batch, 1), generator=g)
        seq = (start + torch.arange(cfg.seq + 1)) % cfg.vocab
        noise = torch.randint(0, cfg.vocab, seq.shape, generator=g)
        seq = torch.where(torch.rand(seq.shape, generator=g) < 0.1, noise, seq)
        yield seq[:, :-1], seq[:, 1:]


def train(mode: str, steps: int, cfg: GPTConfig, batch: int = 8, log_every: int = 5, quiet: bool = False,
          clip: float = 1.0) -> list[float]:
    """Run `steps` training steps; returns the loss of every step where it was read."""
    device = loop.device_for(mode)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))

    def loss_of(logits, y):
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    return loop.run(mode, steps, model, opt, batches(cfg, batch), loss_of, clip=clip, sched=sched,
                    log_every=log_every, quiet=quiet, fmt=".4f")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="defer_and_fuse", choices=loop.MODES)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args(argv)
    cfg = GPTConfig(layers=args.layers, dim=args.dim, dropout=args.dropout)
    t0 = time.perf_counter()
    train(args.mode, args.steps, cfg, batch=args.batch, log_every=args.log_every)
    loop.summary(args.mode, args.steps, t0)

if __name__ == "__main__":
    main()
