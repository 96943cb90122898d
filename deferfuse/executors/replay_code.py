"""The Python a step trace's entry is compiled to: its check and its effect as straight-line code.

A generic loop over an entry's pattern costs about what recording the op costs, so nothing would
be saved: each entry becomes one function with its constants bound, like Dynamo's guards and
torch.fx's generated code. `serve(args, kwargs, g, S)` returns the op's outputs, having put into
the graph `g` what the traced op put there, or `MISS` (and changes nothing) where any check fails.
`S` holds the storages the step has seen (its slots). It holds no values: an array referenced
from here could not be donated to the program that replaces it.

Two storages the trace saw apart must not be one now: an op's writes would land in another order,
and two graph inputs would become one. The check counts the op's distinct storages, and each
input is registered at the position the trace gave it or not at all.
"""
from __future__ import annotations

import math
import weakref

import torch

from .. import rng
from ..events import METRICS
from ..graph import Graph
from ..meta import unflatten_outputs
from ..tensor import Storage, TpuTensor, new_tensor
from .replay_entry import _C, _F, _S, _U, _V

MISS = object()


def compile_entry(e):
    ns = {"MISS": MISS, "TT": TpuTensor, "Tensor": torch.Tensor, "copysign": math.copysign, "Storage": Storage,
          "wr": weakref.ref, "new_tensor": new_tensor, "unflatten": unflatten_outputs, "METRICS": METRICS,
          "undo": Graph.forget_inputs, "reserve": rng.reserve}  # a later input was not where the trace had it
    lines: list[str] = []
    consts: list = []

    def const(x) -> str:
        consts.append(x)
        name = f"c{len(consts) - 1}"
        ns[name] = x
        return name

    emit = lines.append
    pat = e.pat
    pos = 0
    leaf_at: dict[int, str] = {}  # the local holding each leaf, by its position in the pattern
    storage_of: dict[int, str] = {}  # slot -> local holding its storage (this op's tensor arguments)
    new_slots: list[tuple[int, str, str]] = []  # (slot, storage local, value local), in slot order
    tensor_locals: list[str] = []
    slot_next = [e.k0]

    def walk(seq_expr: str, n: int) -> None:
        nonlocal pos
        for j in range(n):
            p = pat[pos]
            x = f"x{pos}"
            emit(f"{x} = {seq_expr}[{j}]")
            if p[0] is _V and p[2] is type and p[1] in (list, tuple):
                typ, count = p[1], pat[pos + 1][1]
                pos += 2
                emit(f"if type({x}) is not {typ.__name__} or len({x}) != {count}: return MISS")
                walk(x, count)
                continue
            leaf_at[pos] = x
            pos += 1
            leaf(p, x, pos - 1 in e.free)

    def leaf(p, x: str, free: bool) -> None:
        kind = p[0]
        if free:  # a scalar's source: its value goes into the graph's scalars (below)
            emit(f"if type({x}) is not {'float' if kind is _F else const(p[2])}: return MISS")
        elif kind is _V:
            if p[1] is None:
                emit(f"if {x} is not None: return MISS")
            else:
                emit(f"if type({x}) is not {const(p[2])} or {x} != {const(p[1])}: return MISS")
        elif kind is _C:
            emit(f"if type({x}) is not Tensor or {x}.device.type != 'cpu' or {x}.dim() != 0 or {x}.dtype is not "
                 f"{const(p[2])}: return MISS")
            emit(f"v_ = {x}.item()")
            sign = "" if p[3] is None else f" or copysign(1.0, v_) != {p[3]!r}"
            emit(f"if v_ != {const(p[1])}{sign}: return MISS")
        elif kind is _F:
            emit(f"if type({x}) is not float or {x} != {const(p[1])} or ({x} == 0.0 and copysign(1.0, {x}) != "
                 f"{p[2]!r}): return MISS")
        else:
            lid, lay = (p[2], p[3]) if kind is _S else (p[1], p[2])
            lay_check = f"{x}._lay is not None" if lay is None else f"{x}._lay != {const(lay)}"
            emit(f"if type({x}) is not TT or {x}._lid != {lid} or {lay_check}: return MISS")
            s = f"s{len(tensor_locals)}"
            tensor_locals.append(s)
            emit(f"{s} = {x}._st")
            if kind is _S:
                k, ref = p[1], p[4]
                if k in storage_of:
                    emit(f"if {s} is not {storage_of[k]}: return MISS")
                    return
                storage_of[k] = s
                if k < e.k0:
                    emit(f"if {s} is not S[{k}]: return MISS")
                if ref is None:  # concrete (uninitialised or failed, recording would make other nodes)
                    emit(f"if {s}.graph is not None or {s}.value is None: return MISS")
                else:
                    emit(f"if {s}.graph is not g or {s}.ref != {ref}: return MISS")
            elif kind is _U:  # uninitialised: recording reads it as zeros, a node of the op's own
                k = slot_next[0]
                slot_next[0] += 1
                storage_of[k] = s
                new_slots.append((k, s, None))
                emit(f"if {s}.value is not None or {s}.graph is not None or {s}.error is not None or {s}.shape != "
                     f"{const(p[3])} or {s}.dtype is not {const(p[4])}: return MISS")
            else:
                k = slot_next[0]
                slot_next[0] += 1
                v = f"v{k}"
                storage_of[k] = s
                new_slots.append((k, s, v))
                emit(f"{v} = {s}.value")
                emit(f"if {v} is None or {s}.graph is not None or {s}.error is not None or {s}.shape != "
                     f"{const(p[3])} or {s}.dtype is not {const(p[4])} or g.input_pos.get(id({v})) != {p[5]!r}: "
                     "return MISS")

    def value_of(k: int) -> str:
        for slot, _, v in new_slots:
            if slot == k:
                return v
        return f"{storage_of[k]}.value"

    emit(f"if len(args) != {e.n_args} or len(S) != {e.k0}: return MISS")
    if e.kw_names is None:
        emit("if kwargs: return MISS")
    else:
        emit(f"if not kwargs or tuple(kwargs) != {const(e.kw_names)}: return MISS")
    walk("args", e.n_args)
    if e.kw_names is not None:
        pos += 2  # the dict marker and the names
        emit("kv = tuple(kwargs.values())")
        walk("kv", len(e.kw_names))
    n_storages = len(storage_of)
    if len(tensor_locals) > 1 and new_slots:
        emit(f"if len({{{', '.join(f'id({s})' for s in tensor_locals)}}}) != {n_storages}: return MISS")
    scalars = None
    if e.cands:  # scalars read from the arguments they come from (Entry.learn)
        groups: dict[tuple, list] = {}
        for j, ps in e.cands.items():
            groups.setdefault(ps, []).append(j)
        emit(f"sc = list({const(e.scalars)})")
        for ps, js in groups.items():
            first = leaf_at[ps[0]]
            for p in ps[1:]:
                other = leaf_at[p]
                emit(f"if {other} != {first} or ({first} == 0 and copysign(1.0, {other}) != copysign(1.0, {first})): "
                     "return MISS")
            for j in js:
                emit(f"sc[{j}] = {first}")
        scalars = "sc"
    elif e.keys:
        emit(f"sc = list({const(e.scalars)})")
        scalars = "sc"
    elif e.scalars:
        scalars = const(e.scalars)
    # the effect
    for j, (k, shape, dtype) in enumerate(e.inputs):
        emit(f"if g.input_ref({value_of(k)}, {const(shape)}, {const(dtype)}) != {-(e.i0 + j + 1)}:")
        emit(f"    undo(g, {e.i0}); return MISS")
    if e.keys:  # a random op draws fresh keys, as recording it would: only once nothing can MISS
        emit(f"seed_, c_ = reserve({e.draws})")
        for j, d in e.keys:
            emit(f"sc[{j}] = {'seed_' if d is None else f'c_ + {d}'}")
    for k, s, v in new_slots:
        emit(f"S.append({s})")
    emit(f"g.nodes.extend({const(e.nodes)}); g.sig.extend({const(e.sig)})")
    if scalars is not None:
        emit(f"g.scalars.extend({scalars})")
    if e.reads:
        emit(f"g.reads.update({const(e.reads)})")
    made = {}
    for k, phys, dtype, ref in e.events:
        if k is None:
            k = slot_next[0]
            slot_next[0] += 1
            s = made[k] = f"m{k}"
            emit(f"{s} = Storage(None, {const(phys)}, {const(dtype)}, g, {ref}); g.storages.append(wr({s}))")
            emit(f"S.append({s})")
        else:
            emit(f"{slot_local(k, storage_of, made)}.set_pending(g, {ref})")
    for k, ref in e.writes:
        emit(f"{slot_local(k, storage_of, made)}.set_pending(g, {ref})")
    outs = []
    for o in e.outs:
        if o[0] is None:
            outs.append(leaf_at[o[1]])
        else:
            _, k, size, stride, dtype, lid, lay = o
            outs.append(f"new_tensor({slot_local(k, storage_of, made)}, {const(size)}, {const(stride)}, "
                        f"{const(dtype)}, {lid}, {const(lay)})")
    emit(f"METRICS.ops_recorded += {e.n_rec}; METRICS.ops_replayed += 1")
    for name, n in e.decomposed:  # the report counts a kept decomposition's calls
        emit(f"METRICS.decompositions_replayed[{const(name)}] += {n}")
    if e.spec == "t":
        emit(f"return {outs[0]}")
    elif e.spec is None:
        emit("return None")
    elif e.spec == "tlist":
        emit(f"return [{', '.join(outs)}]")
    elif e.spec[0] is tuple and all(part == (j, 1, "t") for j, part in enumerate(e.spec[1])):
        emit(f"return ({', '.join(outs)},)")
    else:
        emit(f"return unflatten([{', '.join(outs)}], {const(e.spec)})")
    src = "def serve(args, kwargs, g, S):\n" + "".join(f"    {ln}\n" for ln in lines)
    exec(compile(src, f"<deferfuse replay of {e.func}>", "exec"), ns)  # noqa: S102 - code made here, from a trace
    return ns["serve"]


def slot_local(k: int, storage_of: dict, made: dict) -> str:
    if k in storage_of:
        return storage_of[k]
    if k in made:
        return made[k]
    return f"S[{k}]"
