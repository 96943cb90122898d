"""Find blocks repeated back to back in a sequence: the layers of a deep model.

A 12-layer model records the same ops twelve times in a row, and its optimizer updates twelve
identical sets of parameters. Compiling each repetition anew is what makes compile time grow
with depth; finding them lets the fuser give each repetition its own program, so all of them
share one compiled executable (see cache's group programs), and lets the foreach ops split
their tensor lists at layer boundaries.

Pure functions over hashable items; no torch, no JAX.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


def repeats(items: Sequence[Hashable], min_period: int, min_count: int = 2) -> list[tuple[int, int, int]]:
    """Non-overlapping runs of a block repeated back to back, as (start, period, count).

    Among all periods p >= min_period, a run is a stretch where item i equals item i + p; it
    holds (run length + p) // p whole repetitions. Runs are taken greedily by how many items
    their whole repetitions cover, the shorter period first on a tie (period 2p covers what
    period p does in half as many, twice as large, blocks).
    """
    n = len(items)
    min_period = max(1, min_period)
    if n < min_period * min_count:
        return []
    codes: dict = {}
    h = np.fromiter((codes.setdefault(x, len(codes)) for x in items), dtype=np.int64, count=n)
    if len(codes) == n:  # nothing repeats at all
        return []
    cands = []
    for p in range(min_period, n // min_count + 1):
        eq = np.concatenate(([False], h[p:] == h[:-p], [False]))
        edges = np.flatnonzero(eq[1:] != eq[:-1])
        starts, ends = edges[0::2], edges[1::2]
        long = (ends - starts) >= (min_count - 1) * p
        for s, e in zip(starts[long].tolist(), ends[long].tolist()):
            count = (e - s + p) // p
            cands.append((-count * p, p, s, count))
    cands.sort()
    taken: list[tuple[int, int]] = []
    out = []
    for _, p, s, count in cands:
        end = s + count * p
        if any(s < b and a < end for a, b in taken):
            continue
        taken.append((s, end))
        out.append((s, p, count))
    out.sort()
    return out


def segments(n: int, runs: list[tuple[int, int, int]]) -> list[tuple[int, int, bool]]:
    """Cut range(n) into (lo, hi, repeated): one segment per repetition, the rest in between."""
    out = []
    pos = 0
    for s, p, count in runs:
        if s > pos:
            out.append((pos, s, False))
        for k in range(count):
            out.append((s + k * p, s + (k + 1) * p, True))
        pos = s + count * p
    if pos < n:
        out.append((pos, n, False))
    return out
