"""deferfuse.capture: one step recorded once, replayed as one program (the bench's jit engine)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse


def _models():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ref.load_state_dict(m.state_dict())
    return m.to("tpu"), ref


def test_replay_trains_like_cpu():
    m, ref = _models()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(5)]

    def step(x, y):
        loss = F.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    # the first step creates the momentum buffers (a different program): capture a later one
    with deferfuse.mode():
        got = [step(x.to("tpu"), y.to("tpu")).item() for x, y in batches[:2]]
    x2, y2 = batches[2]
    cap = deferfuse.capture(step, x2.to("tpu"), y2.to("tpu"))
    assert cap.programs == 1
    got.append(cap.result.item())
    misses = deferfuse.metrics()["cache_misses"]
    for x, y in batches[3:]:
        got.append(cap(x.to("tpu"), y.to("tpu")).item())
    assert deferfuse.metrics()["cache_misses"] == misses  # replays compile nothing
    want = []
    for x, y in batches:
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        want.append(loss.item())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_capture_refuses_a_step_that_syncs():
    x = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError, match="flushed before its end"):
        deferfuse.capture(lambda t: (t * 2).sum().item() + 1, x)
