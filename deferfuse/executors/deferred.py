"""DeferAndFuse: record everything; flush at sync points, at loop-period boundaries, or at the cap.

Sync points (host reads, data-dependent shapes, explicit syncs, leaving the `with` block) call
`engine.flush` themselves with their cause. This executor adds the two flushes that bound the
pending graph in code that never syncs:

- the repeated-op heuristic: when the recent op stream repeats with period P, cut at period
  boundaries (once at least `period_min_ops` ops are pending), so every loop iteration reuses
  one cached program and the cut lands in the same place each time;
- optional block cuts (`DEFERFUSE_BLOCK_PERIOD_OPS`): also cut at every boundary of a long
  period (a repeated layer), so a deeper model reuses one program per layer;
- the size cap: `max_pending` nodes, for straight-line code with no repetition at all.
"""
from __future__ import annotations

from .. import engine, sources
from ..config import CONFIG
from .base import EagerMode, Executor


class DeferredExecutor(Executor):
    kind = EagerMode.DEFER_AND_FUSE

    def after_op(self, func) -> None:
        """Runs after each top-level op: feed the period detector, cut or cap if due.

        The detector sees one hash per top-level op that recorded anything (the op and how many
        nodes it added), so cuts always fall between user-visible ops, never inside one.
        """
        stream = engine.STREAM
        n = len(stream.graph.nodes)
        added = n - stream.pushed
        if not added:
            return
        stream.pushed = n
        period = stream.period
        if period.push(hash((func._df.fid, added))) and (
            n >= CONFIG.period_min_ops
            or (CONFIG.block_period_ops and period.largest >= CONFIG.block_period_ops and n >= CONFIG.block_min_ops)
        ):
            engine.flush("repeated_op_heuristic", stream.where)
        elif n >= CONFIG.max_pending:
            engine.flush("size_cap", stream.where)

    def on_exit(self) -> None:
        engine.flush("mode_exit", sources.user_frame(3))
