"""DeferAndFuse: record everything; flush at sync points, at loop-period boundaries, or at the cap.

Sync points (host reads, data-dependent shapes, explicit syncs, leaving the `with` block) call
`engine.flush` themselves with their cause. This executor adds the two flushes that bound the
pending graph in code that never syncs:

- the repeated-op heuristic: when the recent op stream repeats with period P, cut at period
  boundaries (once at least `period_min_ops` ops are pending), so every loop iteration reuses
  one cached program and the cut lands in the same place each time;
- the size cap: `max_pending` nodes, for straight-line code with no repetition at all.
"""
from __future__ import annotations

from .. import engine, sources
from ..config import CONFIG
from .base import EagerMode, Executor


class DeferredExecutor(Executor):
    kind = EagerMode.DEFER_AND_FUSE

    def after_record(self, op) -> None:
        stream = engine.STREAM
        n = len(stream.graph.nodes)
        if stream.period.push(op.id) and n >= CONFIG.period_min_ops:
            engine.flush("repeated_op_heuristic", sources.user_frame(3) if CONFIG.source_lines else None)
        elif n >= CONFIG.max_pending:
            engine.flush("size_cap", sources.user_frame(3) if CONFIG.source_lines else None)

    def on_exit(self) -> None:
        engine.flush("mode_exit", sources.user_frame(3))
