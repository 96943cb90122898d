"""The fuser on plain data: partitions around host nodes, size caps, fuel, dead code, repetitions."""
from __future__ import annotations

from deferfuse import blocks, fuser
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


def test_repeats_finds_the_layers_and_prefers_the_short_period():
    seq = ["emb", "pos"] + list("abcdefgh") * 6 + ["a", "z"]
    assert blocks.repeats(seq, 4) == [(2, 8, 6)]  # period 16 covers the same items in 3 blocks
    segs = blocks.segments(len(seq), blocks.repeats(seq, 4))
    assert segs[0] == (0, 2, False) and segs[-1] == (50, 52, False)
    assert [hi - lo for lo, hi, rep in segs if rep] == [8] * 6
    assert blocks.repeats(seq, 4, min_count=7) == []
    assert blocks.repeats(list(range(40)), 2) == []


def test_repeated_blocks_become_groups_and_lanes_run_last():
    # 6 identical 3-node layers (each reads the previous), then 6 independent 4-node chains that
    # nothing reads, recorded stage by stage as foreach ops are: one group per layer, one per
    # chain, the chains after everything else
    sigs = []
    prev = -1
    for _ in range(6):
        base = len(sigs)
        sigs += [(1, (prev,)), (2, (r(base),)), (3, (r(base + 1), prev))]
        prev = r(base + 2)
    layer_out = prev
    for stage in range(4):
        for k in range(6):
            src = (layer_out, -(k + 2)) if stage == 0 else (r(18 + 6 * (stage - 1) + k),)
            sigs.append((4 + stage, src))
    lane = [False] * 18 + [True] * 24
    outs = [layer_out] + [r(36 + k) for k in range(6)]
    groups = fuser.partition(sigs, [False] * len(sigs), outs, max_group=100, block_ops=3, block_repeats=6,
                             lane_ops=lane)
    assert [len(gr.nodes) for gr in groups] == [3] * 6 + [4] * 6
    assert [gr.why for gr in groups[6:]] == ["repeated lanes"] * 6
    assert groups[5].out_refs == [layer_out] and all(gr.in_refs[0] == layer_out for gr in groups[6:])
    # fewer repeats than block_repeats: fused whole
    assert len(fuser.partition(sigs, [False] * len(sigs), outs, max_group=100, block_ops=3, block_repeats=7,
                               lane_ops=lane)) == 1
