"""An optimizer's new state is made by a program of its own, so the first step compiles nothing
that the later steps do not share.

A training loop's first `optimizer.step()` creates the optimizer's state: AdamW's
`torch.zeros_like(p)` twice per parameter, inside `step()`, before the update reads them. Recorded
into the step's graph, those fills make the first step a program of its own: on a TPU every
whole-step program costs seconds to compile (the GPT demo's: 7 to 9 s), and the first step's
differed from every later step's only by those nodes. Run apart, at the first op that follows
them, they leave the step's graph exactly as every later step records it: the state tensors are
concrete inputs, read first where the update reads them, written where it writes them. One
whole-step program, and one small program of fills (one per set of shapes, cached as any other).

Only fills recorded inside an optimizer's `step()`, on concrete inputs (a shape to copy), as the
last nodes of the graph: what a later op has read is not moved. Anything else (a sync point in
between, a fill read before the next op) leaves them where they are, recorded as before.
"""
from __future__ import annotations

import time

from .. import cache, pending
from ..causes import Cause
from ..graph import OUT_BITS, Graph
from ..pending import Pending


class FreshState:
    """The fills recorded since the step began and not yet run: their storages and nodes."""

    __slots__ = ("in_step", "graph", "first", "storages")

    def __init__(self):
        self.in_step = 0  # optimizer steps under way (one inside another: a wrapper's step)
        self.graph = None  # the graph the fills are the last nodes of
        self.first = 0  # the index of the first of them
        self.storages: list = []

    def note(self, stream: Pending, out) -> None:
        """After a top-level op inside a step: keep it if it is a fill of a new tensor, just
        recorded as the graph's last node, reading nothing pending."""
        g = stream.graph
        nodes = g.nodes
        n = len(nodes)
        if self.storages and (self.graph is not g or self.first + len(self.storages) != n - 1):
            self.storages = []  # something else was recorded after them, or the graph was flushed
        node = nodes[-1] if nodes else None
        st = getattr(out, "_st", None)
        if (node is None or node.op.family != "creation" or len(node.op.out_avals) != 1 or st is None
                or st.graph is not g or st.ref != (n - 1) << OUT_BITS or any(r >= 0 for r in node.inputs)):
            return
        if not self.storages:
            self.graph, self.first = g, n - 1
        self.storages.append(st)

    def run(self, stream: Pending) -> None:
        """Run the held fills now, as one program, and take them out of the step's graph."""
        held, self.storages = self.storages, []
        g = stream.graph
        first = self.first
        if g.sources is not None or self.graph is not g or first + len(held) != len(g.nodes) or any(
                st.graph is not g or st.ref != (first + k) << OUT_BITS for k, st in enumerate(held)):
            return  # no longer the graph's last nodes as they were recorded: they stay in it
        t0 = time.perf_counter()  # (capture records a step whole, fills included: capture.py)
        side = Graph()
        outs = []
        for node in g.nodes[first:]:
            ins = tuple(side.input_ref(g.inputs[-r - 1], *g.input_avals[-r - 1]) for r in node.inputs)
            scs = g.scalars[node.scalar_lo:node.scalar_lo + node.op.n_scalars]
            outs.append(side.add(node.op, ins, scs, node.where))
        out_refs = tuple(outs)
        try:
            results, plan, hit = cache.execute(side, out_refs, Cause.OPTIMIZER_STATE, stream.where, held,
                                               {r: k for k, r in enumerate(out_refs)})
        except Exception:  # noqa: BLE001 - the fills stay in the step's graph, whose flush names the error
            return
        # nothing was donated (the fills read their inputs' shapes only): until here the step's
        # graph is as it was, whatever was raised
        scalar_lo = g.nodes[first].scalar_lo
        del g.nodes[first:], g.sig[first:], g.scalars[scalar_lo:]
        g.ahead = None  # launched programs may have read the nodes taken out (cache/ahead.py)
        # and the inputs only they read (each fill reads a parameter for its shape): registered by
        # them, the step would take its parameters in the fills' order where later steps take them
        # in the update's (Adam's, after a sync point): another program at the second step
        g.forget_inputs(1 + max((-r - 1 for node in g.nodes for r in node.inputs if r < 0), default=-1))
        mine = {id(st) for st in held}
        g.storages[:] = [w for w in g.storages if id(w()) not in mine]
        for st, value in zip(held, results):
            st.set_value(value)
        stream.pushed = min(stream.pushed, first)
        pending.counted(Cause.OPTIMIZER_STATE, stream.where, len(held), len(held), plan, hit, t0)
