"""DeferAndFuse: record everything; flush at sync points, at loop-period boundaries, or at the cap.

Sync points (host reads, data-dependent shapes, explicit syncs, leaving the `with` block) call
`pending.flush` themselves with their cause. This executor adds the two flushes that bound the
pending graph in code that never syncs:

- the repeated-op heuristic: when the recent op stream repeats, cut at period boundaries so
  every loop iteration reuses one cached program and the cut lands in the same place each time.
  A tight loop (a period shorter than `fuse_block_ops` nodes) is cut once it alone has filled
  `period_min_ops` ops. A long period (a training step) is cut at its boundary when everything
  pending is whole repetitions of it, or once it has repeated over `step_min_ops` nodes: a
  training loop is cut between whole steps, each in the same place (so an `.item()` every N
  steps flushes the same tail every time), while the layers of one forward pass, which follow
  other pending ops, stay in one flush, where the fuser gives each its own program and
  identical layers share one (a deep model compiles about what a shallow one does);
- the size cap: `max_pending` nodes, for straight-line code with no repetition at all.

A training loop is also cut where its optimizer's `step()` returns (just before the op that
follows it): that is where one step ends, whatever ran before it (gradient accumulation,
clipping, several losses). Every step is then the same program, the first included: the state
its optimizer creates is made apart (optimizer_state.py), and the first call of a decomposed op
records what its later calls do (routes/expansion.py). Left to the period detector, a loop is
cut once the stream has repeated, at a phase set by wherever the repetition began (in the middle
of the optimizer's update, after a first step longer than the rest), so the first cut takes two
or more steps in one program of its own and leaving the loop flushes a partial step as another:
four programs to compile before steady state, each seconds to minutes on a TPU. The cut restarts
the period detector, so it never cuts the same steps at another phase.
"""
from __future__ import annotations

from ..causes import Cause
from .. import pending, sources
from ..config import CONFIG
from ..lowering.registry import LOWERINGS
from . import data_checks
from .base import EagerMode, Executor
from .optimizer_state import FreshState
from .replay import StepReplay

_PENDING = pending.PENDING


class DeferredExecutor(Executor):
    kind = EagerMode.DEFER_AND_FUSE
    checks_before = CONFIG.debug_checks  # TORCH_TPU_ENABLE_DEBUG_CHECKS=1: Debug's data checks too

    def __init__(self):
        self.fresh = FreshState()  # an optimizer's new state, run apart (optimizer_state.py)
        self.replay = StepReplay(self)  # a step fed from the trace of the step before (replay.py)

    def before_op(self, func, args, kwargs) -> None:
        stream = _PENDING
        fresh = self.fresh
        if fresh.storages and getattr(LOWERINGS.get(func), "family", None) != "creation":
            fresh.run(stream)  # the op may read them: they are made first, as every later step has them
        if stream.cut_due is not None:  # the first op after an optimizer step (see the docstring)
            pending.flush(Cause.OPTIMIZER_STEP, stream.cut_due)
        self.checks_before = CONFIG.debug_checks or fresh.in_step > 0
        if self.replay.due:  # the first op after a step: the next step begins
            self.replay.begin()
        if CONFIG.debug_checks:
            data_checks.check(func, args, kwargs)

    def after_op(self, func, out) -> None:
        """Runs after each top-level op: feed the period detector, cut or cap if due.

        The detector sees one hash per top-level op that recorded anything, so cuts always fall
        between user-visible ops, never inside one.
        """
        stream = _PENDING
        nodes = stream.graph.nodes
        n = len(nodes)
        added = n - stream.pushed
        if added:
            # the op and the shape it produced last: a loop over differently shaped tensors (an
            # optimizer creating its state) is no loop. Not the op's full id: that covers view
            # offsets, which change every iteration of a loop writing a KV cache. Not how many
            # nodes it added: the first iteration after a flush records again the view reads the
            # previous iterations shared, and must not break the period.
            self._cut(n, (func._df.fid << 32) ^ nodes[-1].op.shape_hash, added)
            if self.fresh.in_step and added == 1:
                self.fresh.note(stream, out)

    def after_graph(self, op_id: int, weight: int) -> None:
        """After a compiled graph's call recorded as one node (compiler/graphs.py): it weighs as
        the `weight` ops inside it, so a loop of compiled steps is cut between whole steps as the
        same loop recorded op by op is, not once a tight-loop run of nodes fills the graph."""
        stream = _PENDING
        n = len(stream.graph.nodes)
        self._cut(n, hash(("compiled", op_id)), n - stream.pushed - 1 + weight)

    def _cut(self, n: int, h: int, added: int) -> None:
        stream = _PENDING
        stream.pushed = n
        period = stream.period
        p = period.push(h, added)
        if p:
            c = CONFIG
            block = c.fuse_block_ops
            longest = period.longest
            per = added if p == 1 else period.nodes_in(p)  # nodes one period records
            if (p < block and per < block and period.stretch >= c.period_min_ops <= n) or (
                longest and (per if longest == p else period.nodes_in(longest)) >= block
                and period.nodes_in(period.longest_span) >= min(n, c.step_min_ops)
            ):
                pending.flush(Cause.REPEATED_OP, stream.where)
                return
        if n >= CONFIG.max_pending:
            pending.flush(Cause.SIZE_CAP, stream.where)

    def on_exit(self) -> None:
        self.fresh.in_step = 0  # a step that raised never reported its end
        self.replay.stop(arm=False)  # what follows the last step is no step
        pending.flush(Cause.MODE_EXIT, sources.user_frame(3))

    def before_optimizer_step(self) -> None:
        """The step's new state is made apart (optimizer_state.py): each op in it is looked at."""
        self.fresh.in_step += 1
        self.checks_before = True

    def after_optimizer_step(self) -> None:
        """Cut before the next op rather than now: `zero_grad()` has then dropped the gradients,
        which a cut here would make outputs of the program (written to memory every step, and a
        buffer more to hand back each call). The next op comes here first (`checks_before`), at
        no cost to the ops that follow; a sync point before it flushes the same graph anyway."""
        stream = _PENDING
        fresh = self.fresh
        fresh.in_step = max(fresh.in_step - 1, 0)
        if fresh.storages and not fresh.in_step:
            fresh.run(stream)  # made, but never read inside the step
        if not fresh.in_step:
            self.replay.end()
            self.checks_before = self.replay.due or self.checks_before
        # deferfuse.capture records a whole step as one program: no cut inside it
        if stream.graph.nodes and stream.graph.sources is None:
            stream.cut_due = stream.where
            self.checks_before = True
