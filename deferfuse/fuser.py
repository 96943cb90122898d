"""Partition a pending DAG into groups, each compiled as one XLA program.

Pure functions over plain data (no JAX, no torch): testable on their own.

A group breaks only where it must:
- at a host node (an op that runs on CPU between programs): a device group cannot both feed and
  consume the same host node, so device nodes are levelled by how many host nodes lie on a path
  before them, and each level becomes one group;
- at the size cap (`max_group`), in topological order;
- when optimisation fuel runs out: after `fuel` fused ops every further op is its own program,
  so a wrong result can be bisected to the one fusion that caused it;
- around repetitions (`block_ops`): a block of at least that many ops repeated back to back
  `block_repeats` times or more (a deep model's layers, forward and backward) gives one group
  per repetition, and independent
  identical chains that nothing else in the flush reads (an optimizer's per-layer updates, once
  the foreach ops split their lists at layer boundaries) each get a group too. Identical groups
  share one compiled program, so a deeper model compiles no more than a shallow one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from . import blocks
from .graph import OUT_BITS

# A chain smaller than this is not worth a program of its own even when it repeats.
MIN_LANE_NODES = 4


@dataclass
class Group:
    host: bool
    nodes: list[int]
    in_refs: list[int] = field(default_factory=list)  # refs produced outside the group
    out_refs: list[int] = field(default_factory=list)  # refs needed after the group
    why: str = ""  # why this group ends where it does (for the report)


def dag(sigs: list, hosts: list[bool], live: set[int]) -> nx.DiGraph:
    """The data-flow graph of the nodes in `live` (indices), edges producer -> consumer."""
    g = nx.DiGraph()
    for i in sorted(live):
        g.add_node(i, host=hosts[i])
    for i in sorted(live):
        for r in sigs[i][1]:
            if r >= 0:
                g.add_edge(r >> OUT_BITS, i)
    return g


def needed(sigs: list, out_refs) -> set[int]:
    """Nodes that contribute to an output; everything else is dead and never computed."""
    stack = [r >> OUT_BITS for r in out_refs if r >= 0]
    seen: set[int] = set()
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack.extend(r >> OUT_BITS for r in sigs[i][1] if r >= 0)
    return seen


def partition(sigs: list, hosts: list[bool], out_refs, max_group: int, fuel: int | None = None,
              block_ops: int = 0, block_repeats: int = 2, lane_ops: list[bool] | None = None) -> list[Group]:
    live = needed(sigs, out_refs)
    g = dag(sigs, hosts, live)
    order = list(nx.lexicographical_topological_sort(g))
    level: dict[int, int] = {}
    for i in order:
        lv = 0
        for p in g.predecessors(i):
            lv = max(lv, level[p] + (1 if hosts[p] else 0))
        level[i] = lv
    groups: list[Group] = []
    by_level: dict[int, list[int]] = {}
    hosts_at: dict[int, list[int]] = {}
    for i in order:
        (hosts_at if hosts[i] else by_level).setdefault(level[i], []).append(i)
    budget = fuel
    for lv in sorted(set(by_level) | set(hosts_at)):
        members = by_level.get(lv, [])
        end_why = "host op" if lv in hosts_at else "end of flush"
        if budget is not None:
            budget = _fuelled(groups, members, budget, max_group, end_why)
        else:
            if block_ops and len(members) >= block_repeats * block_ops:
                pieces = _around_repeats(members, sigs, g, block_ops, block_repeats, lane_ops)
            else:
                pieces = [(members, None)]
            for k, (piece, why) in enumerate(pieces):
                last = k == len(pieces) - 1
                for lo in range(0, len(piece), max_group):
                    chunk = piece[lo : lo + max_group]
                    capped = lo + max_group < len(piece)
                    groups.append(Group(False, chunk, why="size cap" if capped else why or (end_why if last else "repeated block")))
        for h in hosts_at.get(lv, []):
            groups.append(Group(True, [h], why="host op"))
    _connect(groups, sigs, out_refs)
    return groups


def _fuelled(groups: list[Group], members: list[int], budget: int, max_group: int, end_why: str) -> int:
    chunk: list[int] = []
    for i in members:
        if budget <= 0:
            if chunk:
                groups.append(Group(False, chunk, why="fusion fuel"))
                chunk = []
            groups.append(Group(False, [i], why="fusion fuel"))
            continue
        budget -= 1
        chunk.append(i)
        if len(chunk) >= max_group:
            groups.append(Group(False, chunk, why="size cap"))
            chunk = []
    if chunk:
        groups.append(Group(False, chunk, why=end_why))
    return budget


def _around_repeats(members: list[int], sigs: list, g: nx.DiGraph, block_ops: int, block_repeats: int,
                    lane_ops: list[bool] | None) -> list[tuple[list[int], str | None]]:
    """Cut one level (nodes in recording order) into pieces, each a group, around repetitions.

    Recording order is topological, so contiguous pieces run in order. Lane chains (of the
    nodes `lane_ops` marks: the foreach ops, split per layer by lanes.py) come out of the
    non-repeated pieces and run last: nothing in the flush reads them, and their inputs come
    from earlier nodes or the flush's inputs.
    """
    runs = blocks.repeats([sigs[i][0] for i in members], block_ops, block_repeats)
    segs = blocks.segments(len(members), runs)
    rest = [i for lo, hi, rep in segs if not rep for i in members[lo:hi]]
    lanes = _repeated_lanes([i for i in rest if lane_ops[i]], sigs, g, block_repeats) if lane_ops else []
    if not runs and not lanes:
        return [(members, None)]
    taken = {i for lane in lanes for i in lane}
    pieces: list[tuple[list[int], str | None]] = []
    for lo, hi, rep in segs:
        piece = [i for i in members[lo:hi] if i not in taken]
        if piece:
            pieces.append((piece, "repeated block" if rep else None))
    pieces.extend((lane, "repeated lanes") for lane in lanes)
    return pieces


def _repeated_lanes(nodes: list[int], sigs: list, g: nx.DiGraph, repeats: int) -> list[list[int]]:
    """Independent chains among `nodes` that nothing outside them reads, and whose structure
    occurs at least `repeats` times (the per-layer parameter updates of an optimizer step)."""
    inside = set(nodes)
    parent = {i: i for i in nodes}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in nodes:
        for r in sigs[i][1]:
            j = r >> OUT_BITS
            if r >= 0 and j in inside:
                parent[find(i)] = find(j)
    comps: dict[int, list[int]] = {}
    for i in nodes:
        comps.setdefault(find(i), []).append(i)
    by_shape: dict[tuple, list[list[int]]] = {}
    for comp in comps.values():
        if len(comp) < MIN_LANE_NODES:
            continue
        members = set(comp)
        if any(s not in members for i in comp for s in g.successors(i)):
            continue
        by_shape.setdefault(relative(comp, sigs)[0], []).append(comp)
    return [c for same in by_shape.values() if len(same) >= repeats for c in same]


def relative(ids: list[int], sigs: list, in_refs: list[int] | None = None) -> tuple[tuple, dict[int, int]]:
    """The structure of nodes `ids` with positions made relative to themselves: per node its op
    and operands, an operand inside as (position << OUT_BITS | output), one outside as -(k + 1),
    k its index in `in_refs` (by default, in order of first use). Also returns node -> position.
    Equal structures trace to the same program (cache.group_key) or repeat a chain (lanes)."""
    local = {i: k for k, i in enumerate(ids)}
    ext: dict[int, int] = {} if in_refs is None else {r: k for k, r in enumerate(in_refs)}
    mask = (1 << OUT_BITS) - 1
    out = []
    for i in ids:
        refs = []
        for r in sigs[i][1]:
            j = r >> OUT_BITS
            if r >= 0 and j in local:
                refs.append((local[j] << OUT_BITS) | (r & mask))
            else:
                refs.append(-1 - ext.setdefault(r, len(ext)))
        out.append((sigs[i][0], tuple(refs)))
    return tuple(out), local


def _connect(groups: list[Group], sigs: list, out_refs) -> None:
    """Fill each group's external inputs and the outputs others need from it."""
    owner: dict[int, int] = {}
    for gi, grp in enumerate(groups):
        for i in grp.nodes:
            owner[i] = gi
    needed_out: dict[int, set[int]] = {gi: set() for gi in range(len(groups))}
    for r in out_refs:
        if r >= 0:
            needed_out[owner[r >> OUT_BITS]].add(r)
    for gi, grp in enumerate(groups):
        ins: dict[int, None] = {}
        for i in grp.nodes:
            for r in sigs[i][1]:
                if r < 0 or owner[r >> OUT_BITS] != gi:
                    ins[r] = None
                    if r >= 0:
                        needed_out[owner[r >> OUT_BITS]].add(r)
        grp.in_refs = list(ins)
    for gi, grp in enumerate(groups):
        grp.out_refs = sorted(needed_out[gi])
