"""Strict: every top-level op runs at once as its own cached program, asynchronously.

The host does not wait: JAX dispatch is asynchronous, so the op's outputs are futures and the
host only blocks at a sync point (`.item()`, `.cpu()`, print).
"""
from __future__ import annotations

from ..causes import Cause
from .. import pending
from ..config import CONFIG
from . import data_checks
from .base import EagerMode, Executor


class StrictExecutor(Executor):
    kind = EagerMode.STRICT
    runs_eagerly = True
    checks_before = CONFIG.debug_checks  # TORCH_TPU_ENABLE_DEBUG_CHECKS=1: Debug's data checks too

    def before_op(self, func, args, kwargs) -> None:
        data_checks.check(func, args, kwargs)

    def after_op(self, func, out) -> None:
        if pending.PENDING.graph.nodes:
            pending.flush(Cause.STRICT_OP, pending.PENDING.where)
