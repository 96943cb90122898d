"""A compiled graph's first call in DeferAndFuse, recorded without being run.

A graph's first call used to flush what was pending, then record the graph and flush it as a
program of its own, so that later calls could replay it. In a `torch.compile`d training step that
made the forward, the backward and the optimizer's graph three programs of their own, plus the
eager ops between them flushed as more, before the step ran once; the step after compiled them all
again, as one program of three nodes. On a TPU each program is seconds of XLA.

Here the first call records the graph's ops into a graph of their own, as `capture` records a step,
and runs nothing: what the recording wrote (the storages and their refs) is what a replay needs to
read and write, and the graph becomes one node (`graphs._graph_op`). Every storage the recording
touched then gets back the state it had, and the call is recorded as that node into the pending
graph, as every later call is. The first training step is one program (its optimizer's state
fills apart), every later step another: two, as for a step recorded op by op.

The recording reads no value: an argument pending in the stream's graph stands for itself with a
placeholder that no program ever sees. Anything that would need a value (a flush, a host read, a
CPU fallback, an optimizer state fill run apart, a storage pending outside the arguments) abandons
the dry recording: every storage goes back to its state, and the caller takes the path that flushes
and records with a program (`graphs.Replay.record`), which raises what the call raises.
"""
from __future__ import annotations

from .. import pending, rng
from ..config import CONFIG
from ..events import METRICS
from ..graph import Graph, PeriodDetector
from ..modes import current
from ..tensor import TpuTensor


class _Abandon(Exception):
    """The dry recording met something that needs a value."""


NOTHING = object()  # `record`'s answer for a graph that records no node (views of its inputs alone)


class _Placeholder:
    """Stands for a pending argument's value as a graph input; never given to a program."""

    __slots__ = ()


def _no_flush() -> None:
    raise _Abandon


def record(gm, args, make_replay):
    """Record `gm(*args)` without running it: `make_replay(g, outputs, result, c0)` is handed the
    graph and what it wrote, as `capture.record_whole` would have flushed them. Returns its
    replay, with every storage as it was before the call; `NOTHING` where the graph computes
    nothing; None (and nothing changed) where the call cannot be recorded so."""
    stream = pending.PENDING
    g_old = stream.graph
    if g_old.sources is not None or stream.flushing:
        return None
    ex = current()
    fresh = ex.fresh
    if fresh.storages:  # an optimizer's new state, made apart as before any op that may read it
        fresh.run(stream)
    saved_fresh = (fresh.graph, fresh.first, list(fresh.storages))
    saved = (stream.period, stream.pushed, stream.where, stream.cut_due, ex.checks_before, CONFIG.max_pending,
             CONFIG.max_group_ops, CONFIG.fuse_block_ops)
    states = {}
    for a in args:
        if type(a) is TpuTensor:
            st = a._st
            if id(st) not in states:
                states[id(st)] = (st, st.value, st.graph, st.ref, st.error)
                if st.graph is g_old:
                    st.graph, st.value = None, _Placeholder()
    g = Graph()
    g.sources = []
    g.before = []
    stream.graph = g
    stream.period, stream.pushed = PeriodDetector(0), 0
    # what the executor owes the next op (an optimizer step's cut, a traced step's beginning) is
    # owed to the op after this call, as on every later call, which records no op: spent on the
    # dry graph, the first step cut elsewhere than the rest and compiled a program of its own
    stream.cut_due, ex.checks_before = None, False
    CONFIG.max_pending = CONFIG.max_group_ops = 1 << 30
    CONFIG.fuse_block_ops = 0
    stream.before_flush.insert(0, _no_flush)
    held = len(fresh.storages)
    fallbacks = METRICS.cpu_fallbacks.copy()  # an abandoned recording's fallback is counted where it runs
    c0 = rng.marking(True)
    replay = None
    try:
        result = list(gm(*args))  # in DeferAndFuse already (the caller's): no block, whose exit flushes
        if stream.graph is g and len(fresh.storages) == held:
            replay = make_replay(g, _outputs(g), result, c0) if g.nodes else NOTHING
    except Exception:  # noqa: BLE001 - the path that runs the call raises it again
        replay = None
    finally:
        if replay is None:
            METRICS.cpu_fallbacks.clear()
            METRICS.cpu_fallbacks.update(fallbacks)
        rng.marking(False)
        rng.rewind(c0)  # nothing ran: the call recorded next (its node, or the fallback) draws these keys
        stream.before_flush.remove(_no_flush)
        for st, value, graph, ref, error in reversed(g.before):  # storages the recording made pending
            st.value, st.graph, st.ref, st.error = value, graph, ref, error
        for st, value, graph, ref, error in states.values():
            st.value, st.graph, st.ref, st.error = value, graph, ref, error
        stream.graph = g_old
        (stream.period, stream.pushed, stream.where, stream.cut_due, ex.checks_before, CONFIG.max_pending,
         CONFIG.max_group_ops, CONFIG.fuse_block_ops) = saved
        fresh.graph, fresh.first, fresh.storages = saved_fresh
    return replay


def _outputs(g: Graph) -> list:
    """(storage, output index) of each storage a flush of g would write (Graph.live_outputs)."""
    live, refs = g.live_outputs()
    return [(st, refs[st.ref]) for st in live]
