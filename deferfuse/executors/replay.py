"""Step replay: a training step that was recorded once is fed again from its trace.

Recording costs, per op, the signature walk, the recipe lookup, the graph's node and refs and the
period detector. This keeps, per training step (the ops between two optimizer `step()`s), a trace
of what each top-level op did to the pending graph; the next step checks each op against it and
applies what it did, without routing or recording it:

- the check: the same overload from the same source line; the same arguments, the non-tensor
  ones equal (a float by its sign too), every tpu tensor with the layout it had and the same
  storage in the same state (the one a traced op made, or a concrete one first seen there, at
  the same graph input position); the graph at the same length; the float32 matmul precision a
  contraction was recorded at;
- the effect, copied: the nodes, their refs and scalars, the graph inputs, the view reads, the
  writes into the arguments' storages, new storages, and output tensors of the recorded metadata.

The graph that results is the one recording builds, node for node, so the flush's key, plan,
liveness and error recovery are unchanged: replay changes how fast the graph is made, never what
it is. An op whose arguments differ only in values that do not shape the graph (an optimizer's
bias corrections change every step) is recorded as usual and checked to have done what the trace
says; the replay goes on after it. At the first real difference (another shape, another branch, a
new sync point) the step is recorded from there on, as before, and its trace replaces the old one.

A sync point inside a step (`loss.item()` before `optimizer.step()`, a model's `if mask.all():`)
flushes the graph: the trace goes on past it, in the new graph, a segment with its own slots. The
op that flushed runs again, as it is, at every replay (its value may change the step's branch,
which the ops after it are checked for). Hugging Face models make one to three such reads per
step, near its start. A replayed segment launches its programs as it goes (cache/ahead.py).

What is traced is judged by its effects, not by a list of routes: an op is left out (and the
trace ends there) if it flushed and recorded into the new graph, ran a program, fell back to the
CPU, read the host, changed a tensor's metadata, returned anything but tpu tensors, or left a
value the trace cannot name (an input not among its arguments, a storage no output holds). A random
op (dropout) is traced with the places of its keys among its scalars: a replay writes the stream's
next keys there, so it draws the numbers recording would have drawn (replay_entry.unmark).
"""
from __future__ import annotations

from .. import dtypes, events, rng
from ..cache import ahead
from ..config import CONFIG
from ..events import METRICS
from ..graph import OUT_BITS
from ..meta import flatten_outputs
from ..pending import PENDING
from ..precision import current as matmul_precision
from ..record import CALL
from ..tensor import TpuTensor
from .replay_code import MISS, compile_entry
from .replay_entry import (_N, _S, _U, Entry, _end, _leaves, _tensors_only, item_of, learnable, outputs, plain_entry,
                           unmark, untouched)

_MAX_TRACES = 4  # steps of different shapes a loop alternates between (two optimizers, eval steps)


class StepReplay:
    """The traces of recent steps, and the step being traced or replayed now."""

    def __init__(self, executor):
        self.ex = executor
        self.traces: dict = {}  # (first op, its source line) -> entries of the step it began
        self.due = False  # a step ended: the next op with an empty graph begins a step
        self.why = None  # why the last trace ended before its step did
        self._clear()
        dtypes.on_default_dtype_change(self.forget)  # the same calls then make other nodes
        PENDING.before_flush.append(self._flushing)

    def _clear(self) -> None:
        self.g = None  # the graph the step records into
        self.entries: list = []
        self.i = 0  # replaying: the next entry to match
        self.replaying = False
        self.slots: list = []  # storages the step has seen
        self.slot_of: dict[int, int] = {}  # id(storage) -> slot, for the first `synced` slots
        self.synced = 0
        self.seg = 0  # the first entry of the segment being traced or replayed (after the last sync)
        self.kind = None  # the step's first op and its source line: which trace it is
        self.diverged = False  # the step left its trace where the trace says another op came
        self._in_op = False  # an op's route is running (`_record`): a flush now is that op's
        self.ex.serve = None

    def forget(self) -> None:
        """As at import: no traces, no step due (else a model built next would begin a step)."""
        self.traces.clear()
        self._clear()
        self.due = False

    # --- the step's bounds ------------------------------------------------------------------

    def begin(self) -> None:
        """At the first op after a step ended, the graph empty: trace or replay this step."""
        self.due = False
        g = PENDING.graph
        if not CONFIG.replay or g.nodes or g.sources is not None or self.ex.fresh.storages:
            return
        self._clear()
        self.g = g
        self.ex.serve = self.first

    def end(self) -> None:
        """The optimizer's step() returned: what this step did becomes the trace of its kind."""
        self._arm(whole=True)
        self._clear()
        self.due = True  # begin() asks CONFIG.replay, so that turning it on takes effect at the next step

    def _arm(self, whole: bool) -> None:
        """Keep what this step did so far as the trace of steps that begin as it did: a whole
        step's always, a part of one (cut short) unless a longer trace it followed is kept."""
        entries = self.entries[: self.i] if self.replaying else self.entries
        if self.g is not None and entries:
            if PENDING.graph is not self.g or len(self.g.nodes) != _end(entries[-1]):
                whole = False  # recorded into outside the ops traced (a compiled graph's node), or flushed
            kind = (entries[0].func, entries[0].where)
            old = self.traces.pop(kind, None)
            if not whole and old is not None and len(old) > len(entries) and not self.diverged:
                entries = old
            self.traces[kind] = entries
            while len(self.traces) > _MAX_TRACES:
                del self.traces[next(iter(self.traces))]

    def _flushing(self) -> None:
        """A flush inside a step lets go of the storages the trace holds to name them, before it
        runs: they would otherwise keep every value of the step alive, and the flush would write
        out intermediates nothing else holds. One that an op of the step makes (a sync point)
        ends the trace's segment (`_boundary`); any other (a period cut, `deferfuse.sync()`)
        ends the trace."""
        if self._in_op and rng.marking(False) != self._c0:  # keys the op drew go out plain
            unmark(PENDING.graph.scalars, 0, self._c0, rng.counter() - self._c0)
        if self.g is None:
            return
        self.slots.clear()  # in place: an op being recorded holds the list
        if not self._in_op:
            self.stop()

    def stop(self, arm: bool = True) -> None:
        """Record the rest of the step as usual, untraced; what was traced up to here is the
        trace (the step that began the same way replays that far, then records)."""
        if arm:
            self._arm(whole=False)
        self._clear()

    # --- serving ops (dispatch.torch_dispatch calls `executor.serve` instead of the route) ---

    def first(self, func, args, kwargs, route):
        """The step's first op picks the trace to replay, by the op and its source line."""
        self.kind = (func, PENDING.where)
        ahead.begin(PENDING.graph, (self.kind, 0))
        trace = self.traces.get(self.kind)
        if trace is not None:
            self.entries = trace
            self.replaying = True
            self.ex.serve = self.replay
            return self.replay(func, args, kwargs, route)
        self.ex.serve = self.trace
        return self.trace(func, args, kwargs, route)

    def replay(self, func, args, kwargs, route):
        i = self.i
        g = PENDING.graph
        e = self.entries[i] if i < len(self.entries) else None
        differs = self._differs(e, func, g)
        if differs is not None:
            self._stopped(func, differs)
            self._leave(len(g.nodes), g)
            return self.trace(func, args, kwargs, route)
        if e.run or e.sync:  # run again as it is: it must leave the graph alone again, or flush it again
            self._sync_slots()
            out, again = self._record(func, args, kwargs, route, _leaves(args, kwargs))
            if again is not None and again.shape == e.shape:
                self.i = i + 1
                if e.sync:
                    self.seg = self.i
                    ahead.begin(PENDING.graph, (self.kind, self.seg))
                return out
            why = ("it did not flush the pending graph where the trace's call did" if e.sync
                   else "it changed the pending graph where the trace's call left it alone")
            return self._diverged(func, out, again, e, g, why)
        serve = e.serve
        if serve is None:
            serve = e.serve = compile_entry(e)
        out = serve(args, kwargs, g, self.slots)
        if out is not MISS:
            self.i = i + 1
            if g.ahead is not None:
                ahead.recorded(g)
            return out
        # the values differ: record the op as usual, and go on if it did what the trace says
        self._sync_slots()
        leaves = _leaves(args, kwargs)
        out, again = self._record(func, args, kwargs, route, leaves)
        if again is not None and e.same_effect(again):
            self.i = i + 1
            if e.scalars != again.scalars and e.learn(leaves, again.scalars):
                e.serve = None  # compiled again, the scalars now read from the arguments they come from
            return out
        return self._diverged(func, out, again, e, g,
                              "its arguments made other nodes than the trace's (another shape, dtype or value)")

    def _diverged(self, func, out, again, e, g, why: str):
        """The op, recorded, did not do what entry e says: the step is traced from here on, what
        the op did (`again`) its next entry."""
        if again is not None:
            self._stopped(func, why)
        self._leave(e.n0, g)
        self.ex.after_op(func, out)
        self._traced(again)
        return out

    def _differs(self, e, func, g) -> str | None:
        """Why the call cannot be replayed from entry e, the trace's at its place (None: it can,
        if its arguments match)."""
        if e is None:
            return "the step went on past the end of its trace"
        if e.func is not func:
            return f"the trace has {e.func} here"
        if g is not self.g or len(g.nodes) != e.n0 or len(g.scalars) != e.s0 or len(g.inputs) != e.i0:
            return ("the pending graph differs from the trace's here (something flushed or recorded outside the "
                    "traced calls)")
        if (e.nodes or e.sync) and PENDING.where != e.where:
            return "it was called from another line"
        if e.precision is not None and matmul_precision() != e.precision:
            return "another float32 matmul precision"
        if e.fill and self.ex.fresh.in_step:  # a fill inside a step may be state made apart
            return "an optimizer's state is made inside the step"
        return None

    def trace(self, func, args, kwargs, route):
        g = PENDING.graph
        last = self.entries[-1] if self.entries else None
        if g is not self.g or len(g.nodes) != _end(last):
            # something recorded outside an op (a compiled graph's node): untraceable
            self._stopped(func, "the pending graph was recorded into outside the traced calls, or flushed")
            self.stop()
            return self._plain(func, args, kwargs, route)
        fresh = self.ex.fresh
        held = len(fresh.storages)
        out, e = self._record(func, args, kwargs, route, _leaves(args, kwargs))
        self.ex.after_op(func, out)
        if len(fresh.storages) != held:  # an optimizer's new state, to be made apart: not a step's op
            e = self._stopped(func, "it made an optimizer's state")
        self._traced(e)
        return out

    def _traced(self, e) -> None:
        if e is None or PENDING.graph is not self.g:
            self.stop()
        else:
            self.entries.append(e)
            if e.sync:
                self.seg = len(self.entries)
                ahead.begin(PENDING.graph, (self.kind, self.seg))

    def _plain(self, func, args, kwargs, route):
        CALL.depth = 1
        try:
            out = route(func, args, kwargs)
        finally:
            CALL.depth = 0
        self.ex.after_op(func, out)
        return out

    def _leave(self, n: int, g) -> None:
        """From replaying to tracing, at entry i, where the graph g (the one the op began in)
        has n nodes: the period detector is fed the segment's ops it did not see, as they were
        recorded. Not where the op flushed: the flush reset the detector, and its count is the
        new graph's."""
        stream = PENDING
        if stream.graph is g:
            period = stream.period
            for e in self.entries[self.seg: self.i]:
                if e.push is not None:
                    period.push(*e.push)
            stream.pushed = n
        self._sync_slots()
        self.diverged = self.diverged or self.i < len(self.entries)
        self.entries = self.entries[: self.i]
        self.replaying = False
        self.ex.serve = self.trace

    # --- recording an op and reading what it did ---------------------------------------------

    def _sync_slots(self) -> None:
        """Index the slots a replayed op appended (the generated code appends, never indexes)."""
        slots, slot_of = self.slots, self.slot_of
        for k in range(self.synced, len(slots)):
            slot_of[id(slots[k])] = k
        self.synced = len(slots)

    def _boundary(self, func, n0: int, s0: int, i0: int):
        """The op flushed the pending graph (a sync point: `.item()`, `bool()`, a data-dependent
        shape): the trace goes on in the new graph, a segment with slots of its own, where the op
        left that graph empty."""
        g = PENDING.graph
        if g.nodes or g.inputs or g.storages:
            return self._stopped(func, "it flushed the pending graph and recorded into the new one")
        e = plain_entry(func, PENDING.where, n0, s0, i0, "sync")
        self.g = g
        self.slot_of.clear()  # the hook emptied the slots
        self.synced = 0
        return e

    def _stopped(self, func, why: str) -> None:
        """What ended a trace, or a replay, before its step did: kept for tests, and the report's
        event (its step replay section says which calls stop steps from replaying, and why).
        None, the entry of an op the trace ends at."""
        self.why = f"{func}: {why}"
        events.emit("replay_stop", op=str(func), where=PENDING.where, why=why)

    def _record(self, func, args, kwargs, route, leaves):
        """Run the op's route as dispatch would (but for `after_op`, the caller's), and describe
        its effect as an Entry (None if it did something a trace cannot replay)."""
        g = PENDING.graph
        stream = PENDING
        ex = self.ex
        slots, slot_of = self.slots, self.slot_of
        n0, s0, i0, t0 = len(g.nodes), len(g.scalars), len(g.inputs), len(g.storages)
        r0 = len(g.reads)
        k0 = len(slots)
        m = METRICS
        decomposed = dict(m.decompositions_replayed)
        c0 = self._c0 = rng.marking(True)  # keys drawn now are marked: `unmark` finds their places
        probe = (m.execute_calls, sum(m.cpu_fallbacks.values()), sum(m.host_syncs.values()), len(ex.fresh.storages),
                 m.ops_recorded)
        ok = True
        pat = []
        before = []  # (tensor, its storage, lid, lay, and the storage's state) per tensor argument
        state = {}  # slot -> (graph, ref, value) before the op
        for a in leaves:
            t = type(a)
            if t is TpuTensor:
                st = a._st
                before.append((a, st, a._lid, a._lay, st.graph, st.ref, st.value))
                k = slot_of.get(id(st))
                if k is not None:
                    if st.graph is g:
                        pat.append((_S, k, a._lid, a._lay, st.ref))
                    elif st.graph is None and st.value is not None:
                        pat.append((_S, k, a._lid, a._lay, None))
                    else:
                        ok = False
                elif st.graph is None and st.error is None:
                    if st.value is not None:
                        pat.append((_N, a._lid, a._lay, st.shape, st.dtype, g.input_pos.get(id(st.value))))
                    else:  # uninitialised (`torch.empty`), read as zeros: `empty(...).fill_(v)` in masks
                        pat.append((_U, a._lid, a._lay, st.shape, st.dtype))
                    k = slot_of[id(st)] = len(slots)
                    slots.append(st)
                else:
                    ok = False
                if k is not None and k not in state:
                    state[k] = (st.graph, st.ref, st.value)
            else:
                item = item_of(a)
                pat.append(item)
                ok = ok and item is not None
        CALL.depth = 1
        self._in_op = True
        try:
            out = route(func, args, kwargs)
        finally:
            CALL.depth = 0
            self._in_op = False
            rng.marking(False)
        draws = rng.counter() - c0
        keys = unmark(g.scalars, s0, c0, draws) if draws else ()
        if stream.graph is not g:
            return out, self._boundary(func, n0, s0, i0)
        if untouched(g, (n0, s0, i0, t0, r0), before, out, len(ex.fresh.storages) == probe[3], slot_of, k0):
            # a replay runs the op without naming its arguments: the trace names none either,
            # or the slots after it would be numbered apart
            for st in slots[k0:]:
                del slot_of[id(st)]
            del slots[k0:]
            self.synced = min(self.synced, k0)
            return out, plain_entry(func, stream.where, n0, s0, i0, "run")
        if not ok:
            return out, self._stopped(func, "an argument a trace cannot hold (a CPU tensor, a generator, a value "
                                       "made elsewhere)")
        if probe[:-1] != (m.execute_calls, sum(m.cpu_fallbacks.values()), sum(m.host_syncs.values()),
                          len(ex.fresh.storages)):
            return out, self._stopped(func, "it ran a program, fell back to CPU or read the host")
        if keys is None:
            return out, self._stopped(func, "it drew random numbers whose keys are not among its scalars")
        if any(a._st is not st or a._lid != lid or a._lay != lay for a, st, lid, lay, *_ in before):
            return out, self._stopped(func, "it changed a tensor's metadata (an in-place view)")
        n1 = len(g.nodes)
        e = Entry()
        e.func, e.where, e.n0, e.s0, e.i0, e.k0, e.pat = func, stream.where, n0, s0, i0, k0, pat
        e.n_args, e.kw_names, e.serve, e.run, e.sync = len(args), tuple(kwargs) if kwargs else None, None, False, False
        e.cands, e.free, e.keys, e.draws = learnable(pat), frozenset(), keys, draws
        e.nodes, e.sig, e.scalars = g.nodes[n0:], g.sig[n0:], g.scalars[s0:]
        by_value = {id(value): k for k, (_, _, value) in state.items() if value is not None}
        e.inputs = []
        for v, aval in zip(g.inputs[i0:], g.input_avals[i0:]):
            k = by_value.get(id(v))
            if k is None:
                return out, self._stopped(func, "it made a graph input of its own (a constant)")
            e.inputs.append((k, *aval))
        e.reads = dict(list(g.reads.items())[r0:]) if len(g.reads) > r0 else None
        lo = n0 << OUT_BITS
        e.events = []
        made = set()
        for w in g.storages[t0:]:
            st = w()
            if st is None:
                continue  # a temporary the op made and dropped
            k = slot_of.get(id(st))
            if k in state:  # an argument's storage, pending here from now on
                e.events.append((k, None, None, st.ref))
            elif k is None and st.graph is g and st.ref >= lo and st.copy_of is None:  # not a copying view's
                e.events.append((None, st.shape, st.dtype, st.ref))
                slot_of[id(st)] = len(slots)
                slots.append(st)
                made.add(id(st))
            else:
                return out, self._stopped(func, "it wrote a storage it was not given")
        e.writes = []
        for k, (graph, ref, value) in state.items():
            st = slots[k]
            if st.graph is not graph or st.ref != ref or st.value is not value:
                if st.graph is not g or st.ref < 0:  # an input's position may differ; a node's cannot
                    return out, self._stopped(func, "it replaced a storage's value")
                e.writes.append((k, st.ref))
        flat, spec = flatten_outputs(out)
        if not _tensors_only(spec):
            return out, self._stopped(func, "it returned a value that is not a tensor")
        e.outs = outputs(flat, leaves, slot_of, made)
        if type(e.outs) is str:
            return out, self._stopped(func, e.outs)
        e.spec = spec
        e.n_new = len(slots) - k0
        e.push = ((func._df.fid << 32) ^ g.nodes[-1].op.shape_hash, n1 - n0) if n1 > n0 else None
        e.n_rec = m.ops_recorded - probe[-1]
        e.decomposed = [(name, n - decomposed.get(name, 0)) for name, n in m.decompositions_replayed.items()
                        if n != decomposed.get(name, 0)]
        e.precision = matmul_precision() if any(n.op.precision is not None for n in e.nodes) else None
        e.fill = any(n.op.family == "creation" for n in e.nodes)
        e.shape = (func, n0, s0, i0, tuple(e.sig), len(e.scalars), tuple(e.inputs), tuple(e.events),
                   tuple(e.writes), tuple(e.outs), e.spec, e.n_new, keys,
                   tuple(p if p is not None and p[0] in (_S, _N, _U) else None for p in pat),
                   None if e.reads is None else tuple(e.reads.items()))
        return out, e
