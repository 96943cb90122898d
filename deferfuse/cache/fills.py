"""Flushes of zeros and ones alone are made on the host and copied to the device: no program.

An optimizer's first step makes its state (AdamW: `torch.zeros_like(p)` twice per parameter), and
a backward pass seeds its gradient with `ones_like(loss)`. Strict runs each fill as a program of its
own, one per shape; DeferAndFuse runs the moved fills of an optimizer's state as one program
(executors/optimizer_state.py). Each is a compile for a value the host knows: on a TPU host about
0.2 s a program, most of Strict's first optimizer step. A copy of host memory costs a transfer,
about 0.2 ms on that host for a small tensor, and compiles nothing.

Only flushes whose every output is a zeros or ones fill's, up to `MAX_BYTES` in all:
past that the transfer costs more than the compile it saves, and a program makes the values where
they live. A fill among other nodes stays a node of their program, which XLA folds.
"""
from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from ..graph import OUT_BITS, Graph
from ..target import jax_device
from .runtime import nbytes

# ops whose output is all zeros / all ones, whatever their arguments ("empty": an uninitialised
# storage read, as zeros: pending._zeros_op)
_VALUE = {
    "empty": 0, "aten.zeros.default": 0, "aten.zeros_like.default": 0, "aten.new_zeros.default": 0,
    "aten.zero.default": 0, "aten._efficientzerotensor.default": 0,
    "aten.ones.default": 1, "aten.ones_like.default": 1, "aten.new_ones.default": 1,
}
MAX_BYTES = 64 << 20


def makers(g: Graph, out_refs: tuple) -> tuple[list[Callable[[], jax.Array]], int] | None:
    """What makes each of the flush's outputs on the host, in `out_refs` order, and their bytes in
    all; None unless every output is a zeros or ones fill's, outside a capture, within `MAX_BYTES`.
    A fill reads its inputs' shapes alone, so the other nodes (a view's read that `zeros_like`
    took) are dead."""
    if g.sources is not None or not out_refs:
        return None
    out = []
    total = 0
    for r in out_refs:
        if r < 0:
            return None
        op = g.nodes[r >> OUT_BITS].op
        value = _VALUE.get(op.name)
        if value is None or op.host or len(op.out_avals) != 1:
            return None
        shape, dtype = op.out_avals[0]
        total += nbytes(shape, dtype)
        out.append(_maker(shape, dtype, value))
    return (out, total) if total <= MAX_BYTES else None


def _maker(shape: tuple, dtype, value: int) -> Callable[[], jax.Array]:
    make = np.zeros if value == 0 else np.ones

    def made() -> jax.Array:
        # a copy (may_alias=False): an array over numpy's memory could not be donated later,
        # and a training loop donates its optimizer state to the update that replaces it
        return jax.device_put(make(shape, dtype), jax_device(), may_alias=False)

    return made
