"""Strict: every top-level op runs at once as its own cached program, asynchronously.

The host does not wait: JAX dispatch is asynchronous, so the op's outputs are futures and the
host only blocks at a sync point (`.item()`, `.cpu()`, print).
"""
from __future__ import annotations

from .. import engine
from .base import EagerMode, Executor


class StrictExecutor(Executor):
    kind = EagerMode.STRICT
    runs_eagerly = True

    def after_op(self, func, out) -> None:
        if engine.STREAM.graph.nodes:
            engine.flush("strict_op", engine.STREAM.where)
