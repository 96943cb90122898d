"""Float32 matmul precision: PyTorch's setting, carried into every contraction XLA compiles.

`torch.set_float32_matmul_precision` has three levels and XLA's dot and convolution ops have the
same three: "highest" -> HIGHEST (float32 products; six bfloat16 passes on a TPU), "high" -> HIGH
(three passes on a TPU), "medium" -> DEFAULT (one bfloat16 pass on a TPU, TF32 on a GPU). XLA
leaves an unmarked op at DEFAULT, so without this a TPU user asking PyTorch for "highest" (its
default) got bfloat16 products.

The setting is read when an op is recorded, as CUDA reads it when a kernel launches: a program
flushed later still computes each contraction at the precision its call was made under. A
contraction's Op is interned per precision (dispatch.route_contracting), and every cache key is
built from Op ids, so programs for two settings never share an entry: a change compiles new
programs, and going back finds the old ones.

`precision(...)` (also `torch.tpu.precision`) overrides the setting for tpu ops recorded inside
its block and leaves PyTorch's global setting alone, so CPU code in the block is unaffected.
"""
from __future__ import annotations

import contextlib

import torch

# PyTorch's names -> the names jax.default_matmul_precision takes
XLA_NAMES = {"highest": "highest", "high": "high", "medium": "default"}

_overrides: list[str] = []  # innermost last
_torch_setting = torch.get_float32_matmul_precision


def current() -> str:
    """The precision a float32 contraction recorded now runs at, by PyTorch's name."""
    return _overrides[-1] if _overrides else _torch_setting()


def _checked(kind: str) -> str:
    if kind not in XLA_NAMES:
        raise ValueError(f"float32 matmul precision must be one of {', '.join(map(repr, XLA_NAMES))}, not {kind!r}")
    return kind


class Precision(contextlib.ContextDecorator):
    """The scope `precision(kind)` returns; a bad name fails at the call, before the block."""

    def __init__(self, kind: str):
        self.kind = _checked(kind)

    def __enter__(self) -> "Precision":
        _overrides.append(self.kind)
        return self

    def __exit__(self, *exc) -> bool:
        _overrides.pop()
        return False


def precision(kind: str) -> Precision:
    """Record tpu contractions inside the block at `kind` ("highest", "high" or "medium"), as
    `torch.set_float32_matmul_precision(kind)` would, and restore the previous setting on exit,
    an exception included. Also a decorator."""
    return Precision(kind)
