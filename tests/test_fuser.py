"""The fuser on plain data: partitions around host nodes, size caps, fuel, dead code."""
from __future__ import annotations

from deferfuse import fuser
from deferfuse.graph import OUT_BITS


def r(i, k=0):
    return (i << OUT_BITS) | k


def chain(n):
    sigs = [(0, (-1,))]
    for i in range(1, n):
        sigs.append((0, (r(i - 1),)))
    return sigs


def test_one_group_without_barriers():
    sigs = chain(5)
    groups = fuser.partition(sigs, [False] * 5, [r(4)], max_group=100)
    assert len(groups) == 1 and groups[0].nodes == [0, 1, 2, 3, 4]
    assert groups[0].in_refs == [-1] and groups[0].out_refs == [r(4)]


def test_dead_nodes_are_dropped():
    sigs = chain(3) + [(0, (-1,))]  # node 3 is dead
    groups = fuser.partition(sigs, [False] * 4, [r(2)], max_group=100)
    assert sum(len(g.nodes) for g in groups) == 3


def test_host_node_splits_and_stays_acyclic():
    # 0 -> 1(host) -> 2, and 3 independent of the host node
    sigs = [(0, (-1,)), (0, (r(0),)), (0, (r(1),)), (0, (-1,))]
    hosts = [False, True, False, False]
    groups = fuser.partition(sigs, hosts, [r(2), r(3)], max_group=100)
    kinds = [(g.host, g.nodes) for g in groups]
    assert kinds == [(False, [0, 3]), (True, [1]), (False, [2])]
    assert groups[0].out_refs == [r(0), r(3)]
    assert groups[2].in_refs == [r(1)]


def test_size_cap_and_fuel():
    sigs = chain(10)
    groups = fuser.partition(sigs, [False] * 10, [r(9)], max_group=4)
    assert [len(g.nodes) for g in groups] == [4, 4, 2]
    groups = fuser.partition(sigs, [False] * 10, [r(9)], max_group=100, fuel=3)
    assert [len(g.nodes) for g in groups] == [3, 1, 1, 1, 1, 1, 1, 1]
