"""Debug (TORCH_TPU_LAUNCH_BLOCKING=1): each op runs and is waited for, then checked.

- The data checks CPU makes and CUDA does not (index ranges, class targets, integer divisors,
  ...: data_checks.py) run before each op, at the user's line.
- Floating outputs are checked for NaN/Inf (nonfinite.py): an op that *introduces* a non-finite
  value raises where CPU PyTorch's result for the same values is finite, and warns once per
  line where CPU's is not finite either.

Strict and DeferAndFuse pay for none of this (the data checks, with
TORCH_TPU_ENABLE_DEBUG_CHECKS=1, are their opt-in).
"""
from __future__ import annotations

from ..causes import Cause
from .. import pending, sources
from ..config import CONFIG
from . import data_checks, nonfinite
from .base import EagerMode, Executor


class DebugExecutor(Executor):
    kind = EagerMode.DEBUG
    checks_before = True
    _call: tuple = ((), {}, None)

    def before_op(self, func, args, kwargs) -> None:
        data_checks.check(func, args, kwargs)
        # the call and its inputs' values, for the NaN/Inf check after it (nonfinite.py)
        self._call = (args, kwargs, nonfinite.finite_inputs(func, args, kwargs) if CONFIG.debug_nan_check else None)

    def after_op(self, func, out) -> None:
        args, kwargs, inputs = self._call
        self._call = ((), {}, None)
        if not pending.PENDING.graph.nodes:
            return
        where = pending.PENDING.where or sources.user_frame(2)
        done = pending.flush(Cause.DEBUG_OP, where)
        pending.block(done)
        if inputs is not None:
            nonfinite.check(func, args, kwargs, out, done, inputs, where)
