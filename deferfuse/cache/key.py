"""The key of a flush: its structure, not its values.

Per node the op's interned id (op + argument signature) and its operand refs, the refs that must
come out, and the (shape, dtype) of each input by position. It is built incrementally while
recording, so a hit costs a dict lookup and one comparison. `group_key` is the same for one group
of a partitioned flush; `explain_miss` says what changed when a site compiles again.
"""
from __future__ import annotations

from .. import fuser, sources
from ..graph import OUT_BITS, Graph, Op


class Key:
    __slots__ = ("sig", "outs", "avals", "_h")

    def __init__(self, g: Graph | None, outs: tuple):
        if g is not None:
            self.sig = g.sig
            self.outs = outs
            self.avals = tuple(g.input_avals)
            self._h = hash((tuple(g.sig), outs, self.avals))

    @classmethod
    def of(cls, sig: list, outs: tuple, avals: tuple) -> "Key":
        k = cls(None, outs)
        k.sig, k.outs, k.avals = sig, outs, avals
        k._h = hash((tuple(sig), outs, avals))
        return k

    def __hash__(self):
        return self._h

    def __eq__(self, other):
        return self._h == other._h and self.outs == other.outs and self.avals == other.avals and self.sig == other.sig


def group_key(g: Graph, grp) -> tuple:
    """A group's nodes, operands and outputs relative to the group, and its inputs' avals.

    Two groups with equal keys trace to the same program: inputs arrive by position, scalars in
    node order, outputs in the order of `out_refs` (ascending refs, so also in node order)."""
    nodes = g.nodes
    mask = (1 << OUT_BITS) - 1
    sig, local = fuser.relative(grp.nodes, g.sig, grp.in_refs)
    outs = tuple((local[r >> OUT_BITS] << OUT_BITS) | (r & mask) for r in grp.out_refs)
    avals = tuple(g.input_avals[-r - 1] if r < 0 else nodes[r >> OUT_BITS].op.out_avals[r & mask] for r in grp.in_refs)
    return sig, outs, avals


def explain_miss(prev: Key | None, key: Key, g: Graph) -> dict | None:
    """What changed against the previous key compiled at the same site."""
    if prev is None:
        return None
    if prev.avals != key.avals:
        # the same inputs, taken in another order: something read one of them first this time
        what = "input_order" if sorted(map(repr, prev.avals)) == sorted(map(repr, key.avals)) else "input"
        for i, (a, b) in enumerate(zip(prev.avals, key.avals)):
            if a != b:
                return {"what": what, "input": i, "before": _aval_str(a), "now": _aval_str(b)}
        return {"what": "inputs", "before": len(prev.avals), "now": len(key.avals)}
    for i, (a, b) in enumerate(zip(prev.sig, key.sig)):
        if a != b:
            oa, ob = Op.of_id(a[0]), Op.of_id(b[0])
            where = g.nodes[i].where if i < len(g.nodes) else None
            if oa is not None and ob is not None and oa.name == ob.name and oa.precision != ob.precision:
                return {"what": "precision", "op": ob.name, "node": i, "where": sources.fmt(where),
                        "before": oa.precision, "now": ob.precision}
            if oa is not None and ob is not None and oa.name == ob.name:
                return {"what": "op_args", "op": ob.name, "node": i, "where": sources.fmt(where),
                        "before": _key_str(oa.key), "now": _key_str(ob.key)}
            return {"what": "structure", "node": i, "where": sources.fmt(where),
                    "before": oa.name if oa else "?", "now": ob.name if ob else "?"}
    if len(prev.sig) != len(key.sig):
        return {"what": "length", "before": len(prev.sig), "now": len(key.sig)}
    if prev.outs != key.outs:
        return {"what": "outputs", "before": len(prev.outs), "now": len(key.outs)}
    return {"what": "unknown"}


def _aval_str(a) -> str:
    shape, dt = a
    return f"{dt}{list(shape)}"


def _key_str(k) -> str:
    if isinstance(k, tuple) and k and hasattr(k[0], "_schema"):
        return ", ".join(repr(p) for p in k[2:])
    return repr(k)
