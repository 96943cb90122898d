"""A step replay draws the random numbers recording would have drawn (executors/replay.py).

Strict, Debug and DeferAndFuse draw identical numbers by design (rng.py): each random op takes the
stream's next (seed, counter). A replayed dropout must take them too, so the oracle here is
Strict's values, exactly, with fresh masks every step; and CPU's, for what does not depend on the
numbers drawn.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from deferfuse import events
from deferfuse.executors.base import EagerMode
from deferfuse.modes import EXECUTORS

REPLAY = EXECUTORS[EagerMode.DEFER_AND_FUSE].replay


def _train(mode, steps=6, body=None, reseed=None, seed=5):
    """A small dropout model trained with AdamW in `mode`; `body(i, h)` replaces the step's
    random part. Returns (masks, losses, parameters) on the CPU, and the replay's stops (op, why)
    after the second step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    torch.tpu.manual_seed(seed)
    REPLAY.forget()
    deferfuse.reset_metrics()
    masks, losses = [], []
    with deferfuse.mode(mode):
        for i in range(steps):
            if i == 2:  # the first step makes AdamW's state, the second is traced
                events.start_collecting()
            if reseed is not None:
                torch.tpu.manual_seed(reseed)
            x = torch.linspace(-1, 1, 96, device="tpu").reshape(16, 6)
            h = model(x)
            y = F.dropout(h, p=0.5, training=True) if body is None else body(i, h)
            loss = y.square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            masks.append((y == 0).detach())
            losses.append(loss.detach())
        stops = [(e["op"], e["why"]) for e in events.stop_collecting() if e["kind"] == "replay_stop"]
        out = ([m.cpu() for m in masks], torch.stack(losses).cpu(), [p.detach().cpu() for p in model.parameters()])
    return out, stops


def _same(a, b) -> None:
    for x, y in zip(a[0], b[0]):
        assert torch.equal(x, y)
    torch.testing.assert_close(a[1], b[1])
    torch.testing.assert_close(a[2], b[2])


def test_a_dropout_step_replays_and_draws_strict_numbers():
    strict, _ = _train("strict")
    fused, stops = _train("defer_and_fuse")
    assert stops == []
    _same(strict, fused)
    masks = fused[0]
    assert all(not torch.equal(masks[i], masks[i + 1]) for i in range(len(masks) - 1))


def _several(i, h):
    """Random ops of every route: functional, in place, factory, like, and one on its input's
    values (bernoulli of probabilities)."""
    a = F.dropout(h, p=0.3, training=True)
    b = torch.empty_like(h).uniform_(0.5, 1.5)
    c = torch.randn(h.shape, device="tpu")
    d = torch.bernoulli(torch.sigmoid(h.detach()))
    e = torch.rand_like(h).normal_(0.0, 0.1)
    return a * b + c * 0.01 + d * h + e


def test_random_ops_of_every_kind_replay_with_strict_numbers():
    strict, _ = _train("strict", body=_several)
    fused, stops = _train("defer_and_fuse", body=_several)
    assert stops == []
    _same(strict, fused)


def _flattened(i, h):  # MobileNetV2's classifier: a pooled map, flattened, dropped in place
    v = F.adaptive_avg_pool2d((h * 1.0).reshape(16, 3, 1, 1), 1).flatten(1)
    F.dropout(v, p=0.5, training=True, inplace=True)
    return v


def _transposed(i, h):
    v = (h * 1.0).t()
    F.dropout(v, p=0.5, training=True, inplace=True)
    return v.t()


@pytest.mark.parametrize("body", [_flattened, _transposed], ids=["flattened", "transposed"])
def test_in_place_dropout_of_a_view_replays(body):
    """`dropout(inplace=True)` draws through `empty_like(x).bernoulli_()` (ATen's _dropout_impl)
    and multiplies in place: of a strided view, `empty_like` must record nothing; and the backward
    of an in-place op on a view (autograd's CopySlices) copies a gradient whole into a new buffer,
    which then holds an earlier node's value."""
    strict, _ = _train("strict", body=body)
    fused, stops = _train("defer_and_fuse", body=body)
    assert stops == []
    _same(strict, fused)


def test_reseeding_each_step_repeats_the_masks_in_a_replay_too():
    strict, _ = _train("strict", reseed=11)
    fused, stops = _train("defer_and_fuse", reseed=11)
    assert stops == []
    _same(strict, fused)
    assert all(torch.equal(fused[0][0], m) for m in fused[0])


def test_a_random_op_recorded_again_does_not_take_its_new_keys_for_changed_arguments():
    """A replay that misses records the op again and, if it did the same, learns which arguments
    its changed scalars come from (Entry.learn). A random op's keys change every call and come
    from no argument: learning them would record the op at every later step."""
    _train("defer_and_fuse")
    drawn = [e for t in REPLAY.traces.values() for e in t if not (e.run or e.sync) and e.keys]
    assert drawn
    for e in drawn:
        fresh = list(e.scalars)
        for j, d in e.keys:
            fresh[j] += 1000
        assert not e.learn([None] * len(e.pat), fresh)
        assert e.cands is not False


def test_a_generator_given_to_a_random_op_ends_the_trace():
    """Its seed comes from the generator (rng.key_from), not the stream: a replay could not draw it."""
    def with_generator(i, h):
        g = torch.Generator(device="tpu").manual_seed(i)
        return h * torch.rand(h.shape, device="tpu", generator=g)

    strict, _ = _train("strict", body=with_generator)
    fused, stops = _train("defer_and_fuse", body=with_generator)
    assert {op for op, _ in stops} == {"aten.uniform_.default"}, stops
    assert any(why.startswith("an argument a trace cannot hold") for _, why in stops), stops
    _same(strict, fused)


def test_the_stream_advances_as_in_recording():
    """After a replayed loop the global stream is where Strict, which runs each op, leaves it."""
    states = []
    for mode in ("strict", "defer_and_fuse"):
        _, stops = _train(mode, body=_several, steps=4)
        states.append(torch.tpu.get_rng_state())
    assert stops == []
    assert torch.equal(states[0], states[1])
