"""One AOTAutograd graph (forward, backward or inference) lowered for tpu, and its replays.

The first call with a new input signature runs the ATen graph through deferfuse's own recording
path (DeferAndFuse with every cut off, as `capture` records a step: `capture.record_whole`), so
its ops go through the same routes, meta, promotion and lowerings as eager, and the flush through
the same compile cache: a compiled graph and an identical DeferAndFuse flush are one entry. What
that flush read and wrote is kept as a `Replay`; later calls with the same signature run the
program on the new arguments without Python per op: the inputs' current values in, outputs into
fresh storages or written back into the arguments' storages (in-place updates of parameters and
optimizer state land where eager puts them), random ops given fresh keys.

In DeferAndFuse a replay is not run at once: it is recorded as one node of the pending graph
(`Replay.defer`), whose function is the recorded graph's own, so a training step's forward,
backward and optimizer graphs, and the eager ops around them, fuse into the program of the next
flush, as a step recorded op by op would, while each graph costs one node to record. There the
first call too is such a node: the graph is recorded without running (`dry_record.py`), so the
first training step compiles the steady step's program, not each graph and the eager work
between them apart. Strict and Debug run each replay at once.

A graph that cannot be one program (a host read or a CPU fallback inside it) runs its ops through
the recording path on every call instead, as DeferAndFuse would.
"""
from __future__ import annotations

import time
import weakref

import numpy as np
import torch

from .. import events, interrupts, modes, pending, program, rng, sources
from ..capture import record_whole
from . import dry_record
from ..causes import Cause
from ..dtypes import to_jax_dtype
from ..events import METRICS
from ..executors.base import EagerMode
from ..graph import OUT_BITS, Op, node_of, out_of
from ..meta import static_key
from ..modes import DeferfuseMode
from ..record import CALL
from ..tensor import Storage, TpuTensor, new_tensor

_RECORD = object()  # a signature seen for the first time


def signature(args) -> tuple:
    """What a replay depends on besides the arguments' values: each tpu argument's layout and
    storage shape, which arguments share a storage, and which hold nothing yet; the values of
    non-tensor arguments but floats; CPU tensors and floats, which only the recording path takes."""
    sig = []
    first: dict[int, int] = {}
    for i, a in enumerate(args):
        if type(a) is TpuTensor:
            st = a._st  # pending or concrete is all one to a replay; uninitialised is not
            sig.append((a._lid, a._lay, st.shape, first.setdefault(id(st), i), st.value is None and st.graph is None))
        elif isinstance(a, torch.Tensor):
            sig.append(("cpu", a.dtype, tuple(a.shape)))
        elif type(a) is float:
            sig.append(float)  # recorded on every call (`Replay.record`): its value keys nothing
        else:
            sig.append((type(a), a))
    return tuple(sig)


class CompiledGraph:
    """The callable AOTAutograd gets for one graph. Boxed (it takes the argument list), though some of
    AOTAutograd's wrappers hide `_boxed_call` and pass the arguments one by one: both are taken
    (graph arguments are tensors and numbers, never a list)."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
        # on the instance: Dynamo's `disable` wrapper copies the instance's __dict__, not the class's
        self._boxed_call = True
        self.gm = gm
        self.kind = kind
        self.replays: dict[tuple, Replay | None] = {}  # signature -> its replay (None: record each call)
        self.where = _source_of(gm)
        self.ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        METRICS.compiled_graphs += 1

    def __call__(self, *args):
        args = list(args[0]) if len(args) == 1 and type(args[0]) is list else list(args)
        METRICS.compiled_calls += 1
        sig = signature(args)
        replay = self.replays.get(sig, _RECORD)
        ex = modes.current()
        deferred = ex.kind is EagerMode.DEFER_AND_FUSE
        if deferred and pending.PENDING.graph.sources is not None:
            # inside `deferfuse.capture`: the graph's ops join the captured step, whose replays
            # must compute them anew (run apart, the capture kept their first values)
            return list(self.gm(*args))
        if deferred and replay is _RECORD:
            replay = self._record_dry(sig, args)
        if replay is not None and replay is not _RECORD:
            if deferred and replay.deferrable:
                out = replay.defer(args, sources.user_frame(2))
                ex.after_graph(replay.op.id, replay.weight)
                return out
            if replay.plan is None and replay.op is not None:
                replay = _RECORD  # recorded without a program, called outside DeferAndFuse: record with one
        if replay is None and deferred:
            # its ops join the pending graph as eager DeferAndFuse ops would: an optimizer step
            # taking a scheduled lr fuses with the step's replayed graphs into one program
            return list(self.gm(*args))
        if pending.pending_count():
            # DeferAndFuse work recorded before this call runs first, as its own flush, reported
            # at the user's line inside the compiled function (Dynamo's code keeps its file)
            pending.flush(Cause.COMPILE_MODE_EXECUTION, sources.user_frame(2))
        if replay is None:
            return self._record_each_call(args)
        if replay is _RECORD:
            replay, out = Replay.record(self.gm, args, sources.user_frame(2))
            self._recorded(sig, replay)
            return out
        return replay(args)

    def _record_dry(self, sig: tuple, args):
        """DeferAndFuse's first call with `sig`: the graph recorded without running it
        (dry_record.py), kept as the replay every call defers; None, kept too, where the graph
        never replays (an argument read by value, or views of its arguments alone), so that it
        need not flush first; `_RECORD` where recording needs a value (`Replay.record` then)."""
        if _read_by_value(args):
            replay = None
        else:
            replay = Replay.record_dry(self.gm, args)
            if replay is None:
                return _RECORD
            if replay is dry_record.NOTHING:
                replay = None
        self._recorded(sig, replay)
        return replay

    def _recorded(self, sig: tuple, replay) -> None:
        self.replays[sig] = replay
        events.emit("compiled_graph", graph=self.kind, ops=self.ops, where=self.where,
                    signatures=len(self.replays), replays=replay is not None)

    def _record_each_call(self, args):
        with DeferfuseMode("defer_and_fuse"):
            return list(self.gm(*args))


def _read_by_value(args) -> bool:
    """Whether an argument is read by value while recording (see `Replay.record`)."""
    return any(isinstance(a, torch.Tensor) and type(a) is not TpuTensor or type(a) is float for a in args)


def _source_of(gm) -> str | None:
    """The user's line the graph's first traced op came from ("file:line"), if Dynamo noted it."""
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if trace:
            for line in reversed(trace.strip().splitlines()):
                line = line.strip()
                if line.startswith("File "):
                    path, _, rest = line[len('File "'):].partition('", line ')
                    return f"{path}:{rest.split(',')[0]}"
    return None


class Replay:
    """What one recorded call read and wrote, to run its program again on new arguments."""

    @staticmethod
    def record(gm, args, where=None) -> tuple[Replay | None, list]:
        if _read_by_value(args):
            # a CPU tensor argument (a step count, a learning rate Dynamo made an input) is read by
            # value while recording, and so is a float (one saved for backward): what the graph
            # derives from it by Python arithmetic becomes the program's scalars, which a replay
            # cannot derive again, and a float changes too often to keep a replay per value
            with DeferfuseMode("defer_and_fuse"):
                return None, list(gm(*args))
        c0 = rng.marking(True)
        try:
            result, g, outputs, plan = record_whole(gm, args, Cause.COMPILED_GRAPH, where)
        finally:
            rng.marking(False)
        result = list(result)
        if g is None or plan is None or plan.single is None:  # no program, or several; None: it computes nothing
            return None, result
        return Replay(g, outputs, plan, args, result, c0), result

    @staticmethod
    def record_dry(gm, args) -> Replay | None:
        """DeferAndFuse's first call: the graph recorded without running it (dry_record.py), its
        replay to be deferred as a node; None where it must be recorded by `record`."""

        def make(g, outputs, result, c0):
            replay = Replay(g, outputs, None, args, result, c0, dry=True)
            return replay if replay.op is not None else None

        return dry_record.record(gm, args, make)

    def __init__(self, g, outputs, plan, args, result, c0, dry: bool = False):
        arg_of: dict[int, int] = {}
        for i, a in enumerate(args):
            if type(a) is TpuTensor:
                arg_of.setdefault(id(a._st), i)
        # per program input: the argument whose storage it is, else a storage read afresh each
        # call (a constant attribute of the graph), else the recorded array itself
        self.feeds = []
        for src, captured in zip(g.sources, g.inputs):
            st = src()
            if st is not None and id(st) in arg_of:
                self.feeds.append((0, arg_of[id(st)]))
            elif st is not None:
                self.feeds.append((1, src, captured))
            else:
                self.feeds.append((2, captured))
        # the program's outputs: written back into an argument's storage, into another live
        # storage, or a fresh storage of this call's results (slot)
        written = {id(st) for st, _ in outputs}
        slot_of: dict[int, int] = {}
        for t in result:
            st = t._st if type(t) is TpuTensor else None
            if st is not None and id(st) not in arg_of and (id(st) in written or st.value is None):
                slot_of.setdefault(id(st), len(slot_of))
        self.into_args = []  # (argument, output index)
        self.into_storages = []  # (storage weakref, output index)
        self.slots = [None] * len(slot_of)  # slot -> (output index, shape, dtype)
        for st, idx in outputs:
            if id(st) in arg_of:
                self.into_args.append((arg_of[id(st)], idx))
            elif id(st) in slot_of:
                self.slots[slot_of[id(st)]] = (idx, st.shape, st.dtype)
            else:
                self.into_storages.append((weakref.ref(st), idx))
        for k, s in enumerate(self.slots):
            if s is None:  # a result storage the program does not write (uninitialised memory)
                st = next(t._st for t in result if type(t) is TpuTensor and slot_of.get(id(t._st)) == k)
                self.slots[k] = (None, st.shape, st.dtype)
        # each result: a view of an argument, of a fresh storage, of a storage the graph holds, or
        # a non-tensor constant
        self.results = []
        for t in result:
            if type(t) is TpuTensor:
                meta = (tuple(t.shape), t.stride(), t.dtype, t._lid, t._lay)
                st = t._st
                if id(st) in arg_of:
                    self.results.append((0, arg_of[id(st)], meta))
                elif id(st) in slot_of:
                    self.results.append((1, slot_of[id(st)], meta))
                else:  # a storage the program only reads (a constant of the graph): the same one
                    self.results.append((3, st, meta))
            else:
                self.results.append((2, t, None))
        self.plan = plan
        self.scalars = list(g.scalars)
        # random ops: where their (seed, counter) scalars are, with each counter's place in the call's draws
        self.keys = [(p, type(s) is rng.Seed, int(s) - c0 if type(s) is rng.Counter else 0)
                     for p, s in enumerate(self.scalars) if type(s) in (rng.Seed, rng.Counter)]
        self.draws = 1 + max((d for _, seed, d in self.keys if not seed), default=-1)
        self.scalars = [int(s) if type(s) in (rng.Seed, rng.Counter) else s for s in self.scalars]
        # a number among the arguments (a dynamic size or int): the graph is recorded anew for
        # each of its values (`signature` holds them), so the deferred node keeps its scalars as
        # inputs (`_inputs_at`)
        self.numbers = any(not isinstance(a, torch.Tensor) for a in args)
        # for DeferAndFuse: the whole graph as one node (`defer`), weighing as its ops do for the
        # period detector, so a training step of three such nodes is cut as the eager step is
        self.in_avals = list(g.input_avals)
        self.weight = len(g.nodes)
        self.op = None
        n_out = 1 + max((idx for _, idx in outputs), default=-1)
        if (plan is not None or dry) and n_out < 1 << OUT_BITS:
            out_refs = [0] * n_out
            for st, idx in outputs:
                out_refs[idx] = st.ref  # a flush leaves each storage's ref in place
            self.op = _graph_op(g, out_refs, self.scalars, self._inputs_at())

    def __call__(self, args: list) -> list:
        # from before `_run` hands the old values over (storages cleared) until the new ones are
        # in place, a signal handler's exception waits (interrupts.py)
        interrupts.hold()
        try:
            values = self._run(args) if self.plan is not None else []
            for i, idx in self.into_args:
                args[i]._st.set_value(values[idx])
            for ref, idx in self.into_storages:
                st = ref()
                if st is not None:
                    st.set_value(values[idx])
        finally:
            interrupts.release()
        fresh = [Storage(None if idx is None else values[idx], shape, dtype) for idx, shape, dtype in self.slots]
        return self._results(args, fresh)

    @property
    def deferrable(self) -> bool:
        """Whether this call can be one node of the pending graph (not inside `deferfuse.capture`,
        whose graph tracks where each input came from)."""
        return self.op is not None and pending.PENDING.graph.sources is None

    def defer(self, args: list, where) -> list:
        """Record the call as one node of the pending graph: what the program reads is each
        storage's current (maybe pending) value, what it writes becomes those storages' pending values."""
        g = pending.PENDING.graph
        CALL.in_op += 1  # signal handlers wait until the node and every storage it writes are in place
        try:
            refs = []
            for feed, (shape, dtype) in zip(self.feeds, self.in_avals):
                st = args[feed[1]]._st if feed[0] == 0 else feed[1]() if feed[0] == 1 else None
                if st is not None and (feed[0] == 0 or st.graph is g or st.value is not None):
                    refs.append(pending.value_ref(g, st))
                else:  # a constant of the graph, or a storage that holds nothing now: its recorded value
                    refs.append(g.input_ref(feed[-1], shape, dtype))
            base = g.add(self.op, tuple(refs), self._call_scalars() if self.numbers else self._fresh_keys(), where)
            METRICS.ops_recorded += 1
            for i, idx in self.into_args:
                args[i]._st.set_pending(g, base | idx)
            for ref, idx in self.into_storages:
                st = ref()
                if st is not None:
                    st.set_pending(g, base | idx)
            fresh = []
            for idx, shape, dtype in self.slots:
                fresh.append(Storage(None, shape, dtype) if idx is None else Storage(None, shape, dtype, g, base | idx))
                if idx is not None:
                    g.track(fresh[-1])
            return self._results(args, fresh)
        finally:
            CALL.in_op -= 1
            if interrupts.held():
                interrupts.deliver()

    def _results(self, args: list, fresh: list) -> list:
        out = []
        for kind, where, meta in self.results:
            if kind == 2:
                out.append(where)
                continue
            st = args[where]._st if kind == 0 else fresh[where] if kind == 1 else where
            size, stride, dtype, lid, lay = meta
            out.append(new_tensor(st, size, stride, dtype, lid, lay))
        return out

    def _run(self, args: list) -> list:
        inputs = []
        # storages the call overwrites hand their old value over (st.value cleared), so the
        # program may donate its buffer to the new value when nothing else holds it
        handed = []
        written = {i for i, _ in self.into_args}
        for feed in self.feeds:
            if feed[0] == 0:
                st = args[feed[1]]._st
                inputs.append(st.value)
                if feed[1] in written:
                    handed.append((st, len(inputs) - 1, feed[1]))
            elif feed[0] == 1:
                st = feed[1]()
                inputs.append(feed[2] if st is None or st.value is None else st.value)
            else:
                inputs.append(feed[1])
        for st, _, _ in handed:
            st.value = None
        scalars = self._call_scalars()
        single = self.plan.single
        variants = single.compiled
        t0 = time.perf_counter()
        try:
            values = single.run(inputs, scalars, lambda: self._replaces(handed))
        except BaseException:
            for st, pos, _ in handed:
                st.value = inputs[pos]
            raise
        if single.compiled != variants:  # the first replay compiled the donating variant
            METRICS.cache_misses += 1
            METRICS.compile_seconds += time.perf_counter() - t0
        METRICS.execute_calls += 1
        return values

    def _call_scalars(self) -> list:
        """The graph's scalars, with fresh keys for its random ops."""
        scalars = self.scalars
        if self.keys:
            scalars = list(scalars)
            for (p, _, _), v in zip(self.keys, self._fresh_keys()):
                scalars[p] = v
        return scalars

    def _inputs_at(self) -> list:
        """Positions of the scalars the deferred node takes at run time (`_graph_op`): the random
        ops' keys, or every scalar when a number is an argument, so that each of its values
        shares the node's program rather than compiling its own."""
        return list(range(len(self.scalars))) if self.numbers else [p for p, _, _ in self.keys]

    def _fresh_keys(self) -> list:
        """Fresh keys for the graph's random ops, in `self.keys`' order."""
        if not self.keys:
            return []
        seed, base = rng.reserve(self.draws)
        return [seed if is_seed else base + d for _, is_seed, d in self.keys]

    def _replaces(self, handed) -> dict[int, int]:
        """Input position -> output position of each argument storage the call reads and overwrites."""
        out_of = dict(self.into_args)
        return {pos: out_of[i] for _, pos, i in handed}


def _graph_op(g, out_refs: list, scalars: list, inputs_at: list) -> Op:
    """The recorded graph as one Op: its nodes traced by the program builder, as a flush of them
    would trace them. Interned by structure, so identical graphs share one Op (and programs).

    A replay's scalars are the same on every call but for its random ops' keys, so all but those
    at `inputs_at` (the Op's scalars) are part of the Op: constants of the program, not inputs.
    As inputs, the forward and backward graphs' reads of one saved view (its offset is such a
    scalar) were two computations to XLA, and so was all the backward recomputed from them
    (attention's scores and softmax); as constants they are one, as in a step recorded op by op."""
    nodes = list(g.nodes)
    in_refs = [-(i + 1) for i in range(len(g.inputs))]
    avals = [nodes[node_of(r)].op.out_avals[out_of(r)] if r >= 0
             else (g.input_avals[-r - 1][0], to_jax_dtype(g.input_avals[-r - 1][1])) for r in out_refs]
    varying = frozenset(inputs_at)
    constants = tuple(_constant_key(v) for p, v in enumerate(scalars) if p not in varying)
    key = ("compiled", tuple(g.sig), tuple(g.input_avals), tuple(out_refs), tuple(inputs_at), constants)
    values = list(scalars)  # not `g` itself: its inputs are the first call's arrays

    def make():
        inner = program.build(nodes, range(len(nodes)), in_refs, out_refs, None)

        def fn(inputs, given):
            full = list(values)
            for p, v in zip(inputs_at, given):
                full[p] = v
            return inner(inputs, full)

        return Op(key, "compiled_graph", fn, avals, len(inputs_at), family="compiled")

    return Op.intern(key, make)


def _constant_key(v):
    """A scalar as a key: a number as meta keys a static argument, a numpy one (a CPU 0-dim
    tensor's value) by its dtype and bytes."""
    if isinstance(v, (np.ndarray, np.generic)):
        return (v.dtype.str, v.tobytes())
    return static_key(v)
