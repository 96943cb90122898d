"""Small models for deferfuse.check's tests, and a way to break one lowering on purpose.

Also a target for `python -m deferfuse.check tests/check_models.py[:build_broken]`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import torch
from torch import nn

from deferfuse import cache, record
from deferfuse.graph import Op
from deferfuse.lowering import LOWERINGS

aten = torch.ops.aten


class MLP(nn.Module):
    """GELU appears once (`mlp.act`), so a broken gelu lowering breaks that layer alone."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.stem = nn.Linear(dim, 32)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc1", nn.Linear(32, 64))
        self.mlp.add_module("act", nn.GELU())
        self.mlp.add_module("fc2", nn.Linear(64, 32))
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return self.head(self.norm(h + self.mlp(h)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(16, 10)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class Encoder(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(50, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, 3)

    def forward(self, ids):
        return {"logits": self.head(self.layer(self.embed(ids))), "pooled": self.embed(ids).mean(1)}


class Spectral(nn.Module):
    """eigvalsh runs as a counted CPU fallback on tpu (README, known limits), in `spectrum` only."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.spectrum = Eigvals()
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.spectrum(self.proj(x)))


class Eigvals(nn.Module):
    def forward(self, x):
        return torch.linalg.eigvalsh(x.transpose(-1, -2) @ x)


def healthy() -> list[tuple[nn.Module, tuple]]:
    torch.manual_seed(0)
    return [(MLP(), (torch.randn(4, 16),)),
            (ConvNet(), (torch.randn(2, 3, 8, 8),)),
            (Encoder(), (torch.randint(0, 50, (2, 5)),))]


def _retire(op) -> None:
    """Make deferfuse build `op` again from LOWERINGS: the dispatcher's recipes and the interned
    graph Ops hold the lowering they were made with, and compiled plans are keyed by Op ids. An
    interned Op is moved under a key nothing asks for, not dropped: ids are `len(Op._interned)`,
    so dropping one would hand its id to the next new Op."""
    for key in [k for k, o in Op._interned.items() if o.name == str(op)]:
        retired = Op._interned.pop(key)
        Op._interned[("retired", retired.id)] = retired
    record.forget_recipes()
    cache.clear()


def break_lowering(op=aten.gelu.default, scale: float = 0.5) -> Callable[[], None]:
    """Add noise (`scale` times the output's std) to every result of `op`'s lowering on tpu.
    Returns the function that puts the real lowering back."""
    real = LOWERINGS[op]

    def noisy(*args, **kwargs):
        out = real.fn(*args, **kwargs)
        return out + scale * out.std() * jax.random.normal(jax.random.PRNGKey(0), out.shape, out.dtype)

    def restore() -> None:
        LOWERINGS[op] = real
        _retire(op)

    LOWERINGS[op] = dataclasses.replace(real, fn=noisy)
    _retire(op)
    return restore


def build():
    torch.manual_seed(0)
    return MLP(), torch.randn(4, 16)


def build_broken():
    break_lowering()
    return build()
