"""`deferfuse.distributed.spmd_safe()`: collectives recorded into the step's program.

Outside it, each collective reads its inputs (a flush, cause `distributed_op`) and runs as a
program of its own, as TorchTPU's tpu_dist does: DDP's buckets cut a DeferAndFuse step into one
program per bucket. Inside it, in DeferAndFuse, the user promises that every rank records the same
ops in the same order (the same model, the same step, the same shapes), and a collective on tpu
tensors becomes a node of the pending graph like any op: the fuser places it in the program of the
computation around it, and the program runs on every process of the group at once
(spmd.SpmdProgram), so XLA can schedule the communication among the compute. A broken promise
is a hang or an XLA error, not a wrong answer: no rendezvous checks it (the meeting would cost a
host round trip per collective, which is what the region removes).

Strict and Debug run collectives one by one inside it too.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch

from .. import modes, pending, spmd
from ..causes import Cause
from ..dtypes import to_jax_dtype
from ..events import METRICS
from ..executors.base import EagerMode
from ..graph import Op
from ..target import NAME

_DEPTH = 0
# (the pending graph, weakly: holding it would keep a flushed graph's inputs alive; the ranks of
# the collectives recorded in it)
_LAST: tuple = (lambda: None, None)


@contextlib.contextmanager
def spmd_safe() -> Iterator[None]:
    """A block (or, as a decorator, a function) whose collectives fuse with its computation."""
    global _DEPTH
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1


def active() -> bool:
    return _DEPTH > 0 and modes.current().kind is EagerMode.DEFER_AND_FUSE


def record(kind: str, ranks: tuple, flat: torch.Tensor, attrs: dict) -> torch.Tensor:
    """Record collective `kind` over `ranks` on a flat tpu tensor; its (pending) flat result."""
    global _LAST
    g = pending.PENDING.graph
    if _LAST[0]() is g and _LAST[1] != ranks:
        # one program runs on one group's processes: another group's collective starts a new one
        pending.flush(Cause.DISTRIBUTED_OP)
    n, m, dtype = len(ranks), flat.numel(), flat.dtype
    out_m = spmd.out_length(kind, n, m)
    key = ("collective", kind, ranks, m, dtype, tuple(sorted(attrs.items())))

    def make() -> Op:
        if kind == "all_reduce":  # program.py combines the all-reduces of a program
            fn = spmd.AllReduce(attrs["op"], n)
        else:
            block = spmd.body(kind, n, attrs)

            def fn(ins, scs):
                return [block(ins[0])]
        return Op(key, f"tpu_dist.{kind}", fn, [((out_m,), to_jax_dtype(dtype))], 0, family="collective")

    g, ref = pending.record(Op.intern(key, make), [flat], None)
    _LAST = (weakref.ref(g), ranks)
    out = torch.empty(out_m, dtype=dtype, device=NAME)
    pending.write(out, ref, g)
    METRICS.collectives[kind] += 1
    return out
