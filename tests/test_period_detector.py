"""The period detector's tight-loop fast path must decide exactly what its general walk decides."""
from __future__ import annotations

import random

import pytest

from deferfuse.graph import PeriodDetector


def _stream(rng: random.Random, length: int) -> list[int]:
    """Tight loops of distinct ops, loops with a repeated op inside, and noise, interleaved."""
    out: list[int] = []
    while len(out) < length:
        kind = rng.random()
        if kind < 0.5:
            period = rng.sample(range(1, 40), rng.randint(1, 9))  # distinct: the fast path locks
        elif kind < 0.75:
            period = [rng.randint(1, 4) for _ in range(rng.randint(2, 7))]  # repeats inside
        else:
            out.extend(rng.randint(1, 60) for _ in range(rng.randint(1, 20)))
            continue
        reps = rng.randint(1, 40)
        body = period * reps
        if rng.random() < 0.3:  # broken in the middle of a period
            body = body[: rng.randint(1, len(body))]
        out.extend(body)
    return out[:length]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("lookback", [16, 64, 2048])
def test_fast_path_matches_general_walk(seed, lookback):
    rng = random.Random(seed)
    fast, slow = PeriodDetector(lookback), PeriodDetector(lookback, can_lock=False)
    locked = 0
    for i, h in enumerate(_stream(rng, 3000)):
        size = 1 + (h % 3 == 0)
        got, want = fast.push(h, size), slow.push(h, size)
        state = (got, fast.stretch, fast.longest, fast.longest_span)
        assert state == (want, slow.stretch, slow.longest, slow.longest_span), f"op {i}"
        locked += fast.locked > 0
        for k in (1, 3, 9):
            assert fast.nodes_in(k) == slow.nodes_in(k)
        if rng.random() < 0.002:  # a flush that starts the stream afresh
            fast.reset()
            slow.reset()
    assert locked > 300  # the fast path was exercised, not just the walk
