"""Partition a pending DAG into groups, each compiled as one XLA program.

Pure functions over plain data (no JAX, no torch): testable on their own.

A group breaks only where it must:
- at a host node (an op that runs on CPU between programs): a device group cannot both feed and
  consume the same host node, so device nodes are levelled by how many host nodes lie on a path
  before them, and each level becomes one group;
- at the size cap (`max_group`), in topological order;
- when optimisation fuel runs out: after `fuel` fused ops every further op is its own program,
  so a wrong result can be bisected to the one fusion that caused it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from .graph import OUT_BITS


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


def partition(sigs: list, hosts: list[bool], out_refs, max_group: int, fuel: int | None = None) -> list[Group]:
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
        chunk: list[int] = []
        for i in members:
            if budget is not None:
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
            groups.append(Group(False, chunk, why="host op" if lv in hosts_at else "end of flush"))
        for h in hosts_at.get(lv, []):
            groups.append(Group(True, [h], why="host op"))
    _connect(groups, sigs, out_refs)
    return groups


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
