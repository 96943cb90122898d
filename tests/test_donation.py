"""Buffer donation: a flush reuses the buffers of inputs nothing else holds for its outputs.

In-place updates (an optimizer's parameters and state) then happen in place on the device, with
no second copy of the state. What must never happen is donating an array something still reads.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from deferfuse.config import CONFIG


def _ptr(t: torch.Tensor) -> int:
    return t._st.value.unsafe_buffer_pointer()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_in_place_update_reuses_the_buffer(mode):
    p = torch.arange(1000.0).to("tpu")
    g = torch.full((1000,), 0.5).to("tpu")
    ref = torch.arange(1000.0)
    for i in range(4):
        before = _ptr(p)
        with deferfuse.mode(mode):
            p.add_(g)
            p.mul_(2)
        deferfuse.sync()
        ref.add_(0.5).mul_(2)
        # (the array .to() made may alias host memory, which PJRT will not donate)
        assert i == 0 or _ptr(p) == before
    torch.testing.assert_close(p.cpu(), ref)


def test_no_donation_when_switched_off(monkeypatch):
    monkeypatch.setattr(CONFIG, "donate", False)
    p = torch.arange(1000.0).to("tpu")
    before = _ptr(p)
    old = p._st.value
    with deferfuse.mode():
        p.add_(1)
    deferfuse.sync()
    assert not old.is_deleted() and _ptr(p) != before


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_an_array_another_tensor_holds_is_not_donated(mode):
    # copy_ between same-shaped tensors shares the (immutable) array: updating a must leave b
    a = torch.randn(1000).to("tpu")
    b = torch.zeros(1000).to("tpu")
    b.copy_(a)
    expected = b.cpu().clone()
    with deferfuse.mode(mode):
        a.add_(1)
        a.mul_(3)
    torch.testing.assert_close(b.cpu(), expected)
    torch.testing.assert_close(a.cpu(), (expected + 1) * 3)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_an_input_that_stays_live_is_not_donated(mode):
    x = torch.randn(1000).to("tpu")
    expected = x.cpu()
    with deferfuse.mode(mode):
        y = x * 2 + 1
    torch.testing.assert_close(y.cpu(), expected * 2 + 1)
    torch.testing.assert_close(x.cpu(), expected)


def test_chained_donations_across_flushes():
    # the first flush's output is still in flight when the second donates it
    p = torch.ones(4096).to("tpu")
    with deferfuse.mode():
        p.mul_(2)
    with deferfuse.mode():
        p.add_(1)
    deferfuse.sync()
    torch.testing.assert_close(p.cpu(), torch.full((4096,), 3.0))


def test_training_keeps_parameters_in_place_and_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ref.load_state_dict(model.state_dict())
    model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
    xt, yt = x.to("tpu"), y.to("tpu")
    ptrs = None
    misses = []
    for step in range(6):
        donated = deferfuse.metrics()["bytes_donated"]
        with deferfuse.mode():
            loss = F.mse_loss(model(xt), yt)
            loss.backward()
            opt.step()
            opt.zero_grad()
        ref_loss = F.mse_loss(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
        misses.append(deferfuse.metrics()["cache_misses"])
        # each parameter and moment estimate keeps its own buffer: handed to another output of
        # its shape (JAX pairs donated inputs with outputs by shape alone), the buffer would make
        # XLA copy the old value first, since other ops still read it
        state = [t for st in opt.state.values() for t in st.values() if t.device.type == "tpu" and t.dim()]
        now = [_ptr(t) for t in [*model.parameters(), *state]]
        if step >= 3:
            assert now == ptrs
            assert deferfuse.metrics()["bytes_donated"] - donated >= _state_bytes(model, opt)
        ptrs = now
    assert misses[-1] == misses[2]  # and the donating program compiled once, in warm-up
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), r.detach(), rtol=1e-5, atol=1e-6)


def test_capture_replay_updates_in_place():
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(2, 8).to("tpu")

    def step():
        m(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        with deferfuse.mode():
            step()
    cap = deferfuse.capture(step)
    cap()

    def buffers():  # each tensor in its own buffer, as in test_training_keeps_parameters_in_place
        state = [t for st in opt.state.values() for t in st.values()]
        return [_ptr(t) for t in [*m.parameters(), *state]]

    before = buffers()
    misses = deferfuse.metrics()["cache_misses"]
    cap()
    cap()
    deferfuse.sync()
    assert buffers() == before
    assert deferfuse.metrics()["cache_misses"] == misses


def test_a_changing_donation_pattern_stops_compiling():
    # three updated tensors, each sometimes also held elsewhere: 8 donation patterns. Past a few
    # variants a flush donates a subset already compiled instead of compiling again
    ts = [torch.full((64,), float(i)).to("tpu") for i in range(3)]
    refs = [torch.full((64,), float(i)) for i in range(3)]
    holders = [torch.zeros(64).to("tpu") for _ in range(3)]
    compiles = 0
    for rnd in range(2):
        for pattern in range(8):
            for k in range(3):
                if pattern >> k & 1:
                    holders[k].copy_(ts[k])  # shares the array: not donatable this time
            held = [ts[k].cpu() for k in range(3)]
            m0 = deferfuse.metrics()["cache_misses"]
            with deferfuse.mode():
                for t in ts:
                    t.mul_(0.5).add_(1)
            compiles += deferfuse.metrics()["cache_misses"] - m0
            for k in range(3):
                refs[k].mul_(0.5).add_(1)
                torch.testing.assert_close(ts[k].cpu(), refs[k])
                if pattern >> k & 1:
                    torch.testing.assert_close(holders[k].cpu(), held[k])
    assert compiles <= 4


def _state_bytes(model, opt) -> int:
    state = [t for st in opt.state.values() for t in st.values() if t.device.type == "tpu"]
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *state])


def test_a_plan_cut_into_several_programs_donates_too(monkeypatch):
    # a deep stack of identical blocks: the fuser gives each block its own program
    monkeypatch.setattr(CONFIG, "fuse_block_ops", 4)
    monkeypatch.setattr(CONFIG, "fuse_block_repeats", 3)
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                                         torch.nn.LayerNorm(16)) for _ in range(6)])

    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    x, target = torch.randn(4, 16), torch.randn(4, 16)
    xt, tt = x.to("tpu"), target.to("tpu")
    ptrs = None
    for step in range(5):
        deferfuse.reset_metrics()
        with deferfuse.mode():
            loss = (model(xt) - tt).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        ref_loss = (ref(x) - target).square().mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-5)
        m = deferfuse.metrics()
        if step >= 2:
            assert m["cache_misses"] == 0
            # every parameter and moment estimate updated into a buffer an old value gave up
            assert m["bytes_donated"] >= _state_bytes(model, opt)
        # each in its own buffer (see test_training_keeps_parameters_in_place)
        now = [_ptr(t) for t in [*model.parameters(), *(st["momentum_buffer"] for st in opt.state.values())]]
        if step >= 3:
            assert now == ptrs
        ptrs = now
    plans = [p for p in deferfuse.cache._PLANS.values() if len(p.steps) > 1]
    assert plans, "the flush was not cut into several programs"
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), r.detach(), rtol=1e-5, atol=1e-5)
