"""A traced op (executors/replay.py): what one top-level op of a step did to the pending graph,
the pattern its arguments had, and what changes between steps without changing that effect.

A pattern has one item per leaf of the call's arguments, flattened with lists and tuples marked
by their type and length: a value (`_V`), a float with the sign of its zero (`_F`), a tpu tensor
whose storage the step saw before (`_S`: its slot and the ref it had, or None where it was
concrete) or sees first (`_N`: its shape, dtype and graph input position; `_U` where it is
uninitialised, `torch.empty`'s, with its shape and dtype), or None for an
argument no trace can hold.
"""
from __future__ import annotations

import math

import torch

from ..meta import flatten_outputs
from ..rng import Counter, Seed
from ..tensor import LAYOUTS, TpuTensor

# pattern item kinds: a value, a float, a storage seen before, one seen first, one seen first
# uninitialised, a CPU scalar tensor (a program scalar, by its value and dtype)
_V, _F, _S, _N, _U, _C = range(6)
_PLAIN = frozenset({int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format,
                    torch.Size})
_BAD = object()  # stands for an argument no trace can match (a type object)
_copysign = math.copysign


def _walk(seq, out: list) -> None:
    for a in seq:
        t = type(a)
        if t is list or t is tuple:
            out.append(t)
            out.append(len(a))
            _walk(a, out)
        elif t is type:
            out.append(_BAD)
        else:
            out.append(a)


def _leaves(args, kwargs) -> list:
    """The arguments flattened, lists and tuples marked by their type and length (a type object
    among the arguments is `_BAD`, so the markers cannot be confused with one)."""
    out: list = []
    _walk(args, out)
    if kwargs:
        out.append(dict)
        out.append(tuple(kwargs))
        _walk(kwargs.values(), out)
    return out


class Entry:
    """What one top-level op did to the pending graph, in refs and slots (a slot is a storage
    the step has seen, numbered in the order it was first seen)."""

    __slots__ = ("func", "where", "n0", "s0", "i0", "k0", "n_args", "kw_names", "serve", "run", "sync", "pat",
                 "nodes", "sig", "scalars", "inputs", "reads", "events", "writes", "outs", "spec", "n_new", "push",
                 "n_rec", "decomposed", "precision", "fill", "shape", "cands", "free", "keys", "draws")

    def same_effect(self, other: "Entry") -> bool:
        """Whether `other`, the same op recorded again, left the graph and the step's slots as
        this one did (its scalars may differ: they are values, not structure)."""
        return self.shape == other.shape

    def learn(self, leaves: list, scalars: list) -> bool:
        """The op was recorded again with other argument values and other scalars, to the same
        effect: learn which arguments each changed scalar is (an optimizer's bias corrections,
        a scheduled learning rate), so that later calls replay with them.

        A scalar's sources are the number arguments equal to it in every call seen; where several
        are (one bias correction per parameter, all equal), the compiled check requires them equal
        still. Returns whether the entry learned anything to compile."""
        if self.cands is False:
            return False
        old = self.scalars
        cands = dict(self.cands or {})
        keys = {j for j, _ in self.keys}  # a random op's key: fresh at every replay (`unmark`)
        for j, (a, b) in enumerate(zip(old, scalars)):
            if j in keys or (j not in cands and _same(a, b)):
                continue
            prev = cands.get(j)
            if prev is None:
                prev = [p for p, q in enumerate(self.pat) if q is not None and q[0] in (_V, _F) and _same(q[1], a)]
            keep = tuple(p for p in prev if _same(leaves[p], b))
            if not keep:
                self.cands = False  # a scalar no argument gives: every call is recorded and checked
                return False
            cands[j] = keep
        if cands == (self.cands or {}):
            return False  # only keys differed
        self.cands = cands
        self.free = frozenset(p for ps in cands.values() for p in ps)
        self.scalars = list(scalars)
        self.pat = [q if q is None or q[0] not in (_V, _F) else _value_item(leaves[p]) for p, q in enumerate(self.pat)]
        return True


def plain_entry(func, where, n0: int, s0: int, i0: int, shape: str) -> Entry:
    """The entry of an op a replay runs again as it is: one that left the graph alone ("run") or
    flushed it and left the new one empty ("sync")."""
    e = Entry()
    e.func, e.where, e.n0, e.s0, e.i0, e.shape = func, where, n0, s0, i0, shape
    e.run, e.sync, e.nodes, e.precision, e.push, e.fill = shape == "run", shape == "sync", (), None, None, False
    return e


def unmark(scalars: list, lo: int, c0: int, n: int):
    """Where the keys of an op's n random draws (counters c0 on, drawn marked: `rng.marking`)
    are among a graph's scalars from lo on, as (position from lo, None for a seed or the
    counter's offset from c0), the marked ints made plain again. None where not every draw's
    seed and counter is there (a key went somewhere a replay cannot write a fresh one)."""
    keys = []
    offsets = []
    for j in range(lo, len(scalars)):
        s = scalars[j]
        t = type(s)
        if t is Seed or t is Counter:
            d = None if t is Seed else int(s) - c0
            keys.append((j - lo, d))
            if d is not None:
                offsets.append(d)
            scalars[j] = int(s)
    if len(keys) != 2 * n or sorted(offsets) != list(range(n)):
        return None
    return tuple(keys)


def _same(a, b) -> bool:
    """Equal as a program's scalar: the same type and value, and the same sign of zero."""
    return type(a) is type(b) and a == b and (type(a) is not float or a != 0.0
                                              or _copysign(1.0, a) == _copysign(1.0, b))


def _value_item(a):
    return (_F, a, _copysign(1.0, a)) if type(a) is float else (_V, a, type(a))


def item_of(a):
    """The pattern item of an argument that is not a tpu tensor, None where a trace cannot hold
    it. A CPU 0-dim tensor (`x / torch.tensor(d)`, DeBERTa's log buckets, Swin's scales) is a
    scalar of the program: it matches by dtype and value, a float's sign of zero included."""
    t = type(a)
    if t is float or t in _PLAIN or t is tuple or a is list or a is tuple or a is dict:  # tuple: kwargs
        return _value_item(a)
    if t is torch.Tensor and a.device.type == "cpu" and a.dim() == 0:
        v = a.item()
        return (_C, v, a.dtype, _copysign(1.0, v) if type(v) is float else None)
    return None  # another tensor, a generator, a type object: values a trace cannot hold


def learnable(pat: list):
    """An entry's `cands` to begin with: None, or False where a CPU scalar tensor is among its
    arguments (its value is a program scalar `Entry.learn` cannot trace to an argument)."""
    return False if any(p is not None and p[0] is _C for p in pat) else None


def _tensors_only(spec) -> bool:
    """Whether an op's result, as flatten_outputs describes it, holds tensors (or None) only."""
    if spec is None or spec == "t" or spec == "tlist":
        return True
    if spec[0] == "const":
        return False
    return all(_tensors_only(s) for _, _, s in spec[1])


def untouched(g, sizes: tuple, before: list, out, same_state: bool, slot_of: dict, k0: int) -> bool:
    """Whether an op left the pending graph g as it was (but for concrete values it wrote into
    storages with nothing pending; `sizes` are g's lengths before it, `before` its tensor
    arguments with their storages' states, `same_state` whether it made no optimizer state) and
    returned only concrete values of its own or of storages it was the first to name (from slot
    k0 on): a batch copied to the device, a CPU fallback on concrete inputs, a host read of a
    concrete value, `torch.tensor(data, device="tpu")`. A replay runs such an op again, as it is."""
    if sizes != (len(g.nodes), len(g.scalars), len(g.inputs), len(g.storages), len(g.reads)) or not same_state:
        return False
    for a, st, lid, lay, graph, ref, value in before:
        if a._st is not st or a._lid != lid or a._lay != lay:
            return False
        # a value copied in from the host (copy_ into a new buffer) replaces no pending one
        if graph is not None or st.graph is not None:
            if st.graph is not graph or st.ref != ref or st.value is not value:
                return False
    flat, _ = flatten_outputs(out)
    return all(type(t) is not TpuTensor or (t._st.graph is None and slot_of.get(id(t._st), k0) >= k0) for t in flat)


def outputs(flat: list, leaves: list, slot_of: dict, made: set) -> list | str:
    """An op's output tensors as its entry names them: (None, k) for its argument leaf k, else
    (slot, slot, size, stride, dtype, lid, lay); or why a trace cannot name them. `made`: ids of
    the storages the op made, each of which an output must hold."""
    outs = []
    held = set()
    for t in flat:
        if type(t) is not TpuTensor or t.is_inference():
            return "it returned a tensor of another kind"
        k = next((j for j, a in enumerate(leaves) if a is t), None)
        if k is not None:
            outs.append((None, k))
            continue
        k = slot_of.get(id(t._st))
        if k is None:
            return "it returned a tensor the step had not seen"
        held.add(id(t._st))
        size, stride, dtype = LAYOUTS[t._lid]
        outs.append((k, k, size, stride, dtype, t._lid, t._lay))
    if made - held:
        return "it kept a value it made where no output holds it"
    return outs


def _end(last) -> int:
    """The graph's length after entry `last` (a sync point's leaves the new graph empty)."""
    return 0 if last is None or last.sync else last.n0 + len(last.nodes)
