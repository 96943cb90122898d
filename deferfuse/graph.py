"""The pending DAG: what DeferAndFuse has recorded but not yet run.

Values are SSA: every recorded op output is a new value, named by a ref, and a storage written in
place simply points at a newer ref. A node refers to its operands by *position*, never identity:
external inputs by the order they were first used, pending values by (producer index, output
index). The structural key of a flush is therefore built incrementally while recording, and two
flushes of the same computation on different data give the same key.

Liveness is tracked through weak references to storages. At a flush the pending values still held
by a live storage become program outputs; the rest are intermediates nobody can observe any more
and are never computed.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, NamedTuple

from .interned import OpId

OUT_BITS = 12  # outputs per node; a ref is (node << OUT_BITS) | output, inputs are negative


class Op:
    """A recordable operation: everything needed to trace it, and an interned id for keys.

    `fn(inputs, scalars) -> list[jax.Array]` runs at trace time only. `out_avals` are the
    (physical shape, jax dtype) of each output. `host=True` ops run on CPU between programs.
    `precision`: the float32 matmul precision a contraction was traced at (precision.py), which
    its interned key holds; None for an op that contracts nothing.
    """

    __slots__ = ("id", "name", "fn", "out_avals", "n_scalars", "host", "family", "key", "shape_hash", "precision",
                 "portable", "__weakref__")
    _interned: dict[Any, "Op"] = {}
    _by_id: dict[OpId, "Op"] = {}

    def __init__(self, key, name, fn, out_avals, n_scalars, host=False, family="other", precision=None,
                 portable=True):
        self.key = key
        self.precision = precision
        # whether its key and deferfuse's source decide fn (not so for a user's jax_op): programs
        # holding it may be stored on disk (cache/stored.py)
        self.portable = portable
        self.name = name
        self.fn = fn
        self.out_avals = out_avals
        self.n_scalars = n_scalars
        self.host = host
        self.family = family
        self.id = OpId(len(Op._interned))
        # the period detector's view of an op's result: its first output's shape (worked out
        # once here rather than hashed per recorded op)
        self.shape_hash = hash(out_avals[0][0]) if out_avals else 0

    @classmethod
    def intern(cls, key, make: Callable[[], "Op"]) -> "Op":
        op = cls._interned.get(key)
        if op is None:
            op = make()
            cls._interned[key] = op
        return op

    @classmethod
    def of_id(cls, op_id) -> "Op | None":
        """The interned op with this id (a key holds ids, not ops), or None."""
        op = cls._by_id.get(op_id)
        if op is None:  # ops interned since the last lookup
            cls._by_id.update((o.id, o) for o in cls._interned.values())
            op = cls._by_id.get(op_id)
        return op

    def __repr__(self):
        return f"Op({self.name})"


class Node(NamedTuple):
    """One recorded call: the op, its operand refs, where its runtime scalars start, and the
    user's (code object, offset) that recorded it. A tuple, because creating one is on the
    recording hot path."""

    op: Op
    inputs: tuple
    scalar_lo: int
    where: Any


_new_node = tuple.__new__


class PeriodDetector:
    """Spots the period of a repeating op stream (TorchTPU's repeated-op heuristic).

    For every candidate period P (the distance to the previous occurrence of the same op) it
    counts how many consecutive ops matched the op P positions earlier. Once that run covers a
    whole period the stream is periodic, and cuts are allowed only at positions that are a
    multiple of P from where the repetition started, so each iteration is cut in the same place.
    """

    __slots__ = ("lookback", "hist", "sizes", "n", "last", "runs", "stretch", "longest", "longest_span", "locked",
                 "lock_run", "can_lock")

    # the longest period `push` may lock onto (checking that a period's ops are distinct is a set
    # of that many hashes, paid once per lock)
    LOCK_MAX = 64

    def __init__(self, lookback: int, can_lock: bool = True):
        self.lookback = lookback
        self.can_lock = can_lock
        self.reset()

    def reset(self) -> None:
        self.hist: list[int] = []
        self.sizes: list[int] = []  # nodes each op recorded
        self.n = 0
        self.last: dict[int, int] = {}
        self.runs: dict[int, int] = {}
        self.stretch = 0
        self.longest = 0
        self.longest_span = 0
        self.locked = 0  # the period a tight loop has locked onto, or 0 (see `push`)
        self.lock_run = 0

    def push(self, h: int, size: int = 1) -> int:
        """Record op hash h; return the smallest established period whose boundary this is, or 0.

        Also sets `stretch`, how many ops that period has repeated over (a tight loop that has
        filled the graph by itself, not two equal ops in a row inside a layer), and `longest`
        and `longest_span`: the longest period whose boundary this is, and how many ops it has
        repeated over (a cut there is between whole training steps only if that span covers
        everything pending, not just the layers of one forward pass).

        A tight loop is the case where this runs once per op of a stream that costs little else
        to record, so it gets a fast path: once the only live candidate is an established period
        p whose p ops are all different, the general walk below can only ever extend that one
        run (each op's previous occurrence is exactly p back, so no new candidate starts).
        While locked, an op that matches the op p earlier only extends the run, and `last`,
        which the walk would update, is rebuilt from the last p ops when the stream breaks."""
        lp = self.locked
        if lp:
            n = self.n
            hist = self.hist
            if hist[n - lp] == h:
                hist.append(h)
                self.sizes.append(size)
                self.n = n + 1
                r = self.lock_run = self.lock_run + 1
                if n >= 2 * self.lookback:
                    self._trim(n)
                if r % lp:
                    self.stretch = self.longest = self.longest_span = 0
                    return 0
                self.stretch = self.longest_span = r + lp
                self.longest = lp
                return lp
            self._unlock()
        n = self.n
        hist = self.hist
        hist.append(h)
        self.sizes.append(size)
        runs = self.runs
        best = 0
        stretch = 0
        top = 0
        span = 0
        if runs:
            dead = None
            for p, r in runs.items():
                if hist[n - p] == h:
                    r += 1
                    runs[p] = r
                    # r ops matched the op p earlier, so the last r + p ops repeat with period
                    # p; a boundary is where a whole number of periods passed since it began
                    if r >= p and r % p == 0:
                        if p > top:
                            top, span = p, r + p
                        if not best or p < best:
                            best, stretch = p, r + p
                elif dead is None:
                    dead = [p]
                else:
                    dead.append(p)
            if dead:
                for p in dead:
                    del runs[p]
        last = self.last
        prev = last.get(h)
        if prev is not None:
            p = n - prev
            if p not in runs and p <= self.lookback // 2:
                runs[p] = 1
                if p == 1:
                    if not best:
                        best, stretch = 1, 2
                    if not top:
                        top, span = 1, 2
        last[h] = n
        self.n = n + 1
        self.stretch = stretch
        self.longest = top
        self.longest_span = span
        if n >= 2 * self.lookback:
            self._trim(n)
        if len(runs) == 1 and self.can_lock:
            for p, r in runs.items():
                if r >= p and not r % p and p <= self.LOCK_MAX and len(set(hist[-p:])) == p:
                    self.locked = p
                    self.lock_run = r
        return best

    def _trim(self, n: int) -> None:
        drop = n + 1 - self.lookback
        del self.hist[:drop]
        del self.sizes[:drop]
        self.n -= drop
        self.last = {k: v - drop for k, v in self.last.items() if v >= drop}

    def _unlock(self) -> None:
        """Leave the fast path: give the general walk the state it would have kept itself."""
        lp = self.locked
        self.locked = 0
        self.runs = {lp: self.lock_run}
        hist = self.hist
        last = self.last
        for i in range(self.n - lp, self.n):
            last[hist[i]] = i

    def nodes_in(self, k: int) -> int:
        """Nodes recorded by the last k ops (one period of the stream, or a whole run of them)."""
        return sum(self.sizes[-k:])


class Graph:
    """One pending stream between two flushes."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.inputs: list = []  # concrete jax arrays, by position
        self.input_avals: list = []  # (shape, jax dtype) per input, part of the key
        self.input_pos: dict[int, int] = {}
        self.scalars: list = []
        self.storages: list = []  # weakrefs to storages whose value is pending in this graph
        self.sig: list = []  # per node (op id, inputs), the structural key
        self.reads: dict = {}  # (ref, plan, offset) -> ref, so repeated view reads share a node
        self.sources: list | None = None  # while capturing: the storage each input came from
        # id(storage) -> position of the input that was its value before it became pending here:
        # which output replaces which input, so a donated buffer takes its own new value
        self.prior: dict[int, int] = {}
        # while a graph is recorded to be abandoned: (storage, value, graph, ref, error) as each
        # storage was before it first became pending here
        self.before: list | None = None
        # a replayed step's programs launched before its flush (cache/ahead.py)
        self.ahead = None

    def __len__(self):
        return len(self.nodes)

    def input_ref(self, array, shape, dtype) -> int:
        pos = self.input_pos.get(id(array))
        if pos is None:
            pos = len(self.inputs)
            self.input_pos[id(array)] = pos
            self.inputs.append(array)
            self.input_avals.append((shape, dtype))
        return -(pos + 1)

    def forget_inputs(self, i0: int) -> None:
        """Forget the inputs registered from position i0 on, which no node reads."""
        for v in self.inputs[i0:]:
            self.input_pos.pop(id(v), None)
        del self.inputs[i0:], self.input_avals[i0:]

    def add(self, op: Op, inputs: tuple, scalars, where) -> int:
        idx = len(self.nodes)
        lo = len(self.scalars)
        try:
            if scalars:
                self.scalars.extend(scalars)
            self.nodes.append(_new_node(Node, (op, inputs, lo, where)))
            self.sig.append((op.id, inputs))
        except BaseException:
            # a MemoryError between the appends (signal handlers wait while an op records) must
            # not leave a node without its key entry: the next flush's key would name another
            # program. The graph goes back to what it was; the op raises at the user's line.
            del self.scalars[lo:], self.nodes[idx:], self.sig[idx:]
            raise
        return idx << OUT_BITS

    def live_outputs(self) -> tuple[list, dict[int, int]]:
        """The storages still alive and pending here, and each distinct ref's position among a
        flush's outputs (first seen, first): what a flush of this graph writes, and where."""
        live = []
        seen: set[int] = set()  # pending here, then concrete, then pending again: listed twice
        refs: dict[int, int] = {}
        for w in self.storages:
            s = w()
            if s is not None and s.graph is self and id(s) not in seen:
                seen.add(id(s))
                live.append(s)
                refs.setdefault(s.ref, len(refs))
        return live, refs

    def track(self, storage) -> None:
        self.storages.append(weakref.ref(storage))

    def mark(self) -> tuple:
        """Where the graph stands now, for `roll_back`."""
        return len(self.nodes), len(self.scalars), len(self.storages), len(self.inputs)

    def roll_back(self, at: tuple, error: Exception) -> bool:
        """Forget what was recorded since `mark` gave `at` (an expansion, about to be recorded
        again as its one kept node): nodes no earlier value depends on. A storage made since that
        still holds one of their values raises `error` if read. False, and nothing changed, where
        an input was registered since (an earlier value may read it)."""
        n0, s0, t0, i0 = at
        if len(self.inputs) != i0:
            return False
        lo = n0 << OUT_BITS
        for w in self.storages[t0:]:
            s = w()
            if s is not None and s.graph is self and s.ref >= lo:
                s.graph = None
                s.error = error
        del self.nodes[n0:], self.sig[n0:], self.scalars[s0:], self.storages[t0:]
        for k in [k for k, r in self.reads.items() if r >= lo]:
            del self.reads[k]
        return True


def node_of(ref: int) -> int:
    return ref >> OUT_BITS


def out_of(ref: int) -> int:
    return ref & ((1 << OUT_BITS) - 1)
