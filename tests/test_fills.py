"""Flushes of zeros and ones alone are made on the host (cache/fills.py): no program compiles.

CPU eager is the oracle for the values and dtypes; the metrics say that nothing compiled and nothing
ran as a program, and that a fill among other ops is still a node of their program.
"""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import deferfuse
from deferfuse.cache import fills

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool,
          torch.complex64]

def _values(dt, *shape):
    return torch.arange(1, 1 + torch.Size(shape).numel()).reshape(shape).to(dt)


FILLS = {
    "zeros": lambda dev, dt: torch.zeros(3, 5, dtype=dt, device=dev),
    "ones": lambda dev, dt: torch.ones(2, 4, dtype=dt, device=dev),
    "zeros_like": lambda dev, dt: torch.zeros_like(_values(dt, 4, 3).to(dev)),
    "zeros_like(transposed)": lambda dev, dt: torch.zeros_like(_values(dt, 4, 3).to(dev).t()),
    "ones_like": lambda dev, dt: torch.ones_like(_values(dt, 2, 3, 2).to(dev)),
    "new_zeros": lambda dev, dt: _values(dt, 1).to(dev).new_zeros((6,)),
    "zero_": lambda dev, dt: _values(dt, 2, 2).to(dev).zero_(),
    # an uninitialised tensor reads as zeros on a tpu: only its shape is compared
    "ones_like(empty)": lambda dev, dt: torch.ones_like(torch.empty(3, 2, dtype=dt, device=dev)),
}


def _delta(before: dict) -> dict:
    now = deferfuse.metrics()
    return {k: now[k] - before[k] for k in ("programs_compiled", "execute_calls", "fills_on_host")}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
@pytest.mark.parametrize("fill", sorted(FILLS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_fill_alone_matches_cpu_and_compiles_nothing(mode, fill, dtype):
    deferfuse.sync()
    before = deferfuse.metrics()
    with deferfuse.mode(mode):
        out = FILLS[fill]("tpu", dtype)
        deferfuse.sync()
    d = _delta(before)  # (reading a transposed result to the host is a program of its own)
    got = out.cpu()
    want = FILLS[fill]("cpu", dtype)
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert d["fills_on_host"] >= 1, d
    if mode != "debug" or "transposed" not in fill:  # Debug checks a view's values with a program
        assert d["programs_compiled"] == 0 and d["execute_calls"] == 0, d


def test_a_fill_among_other_ops_stays_in_their_program():
    deferfuse.sync()
    x = torch.randn(4, 4)
    xt = x.to("tpu")
    before = deferfuse.metrics()
    with deferfuse.mode("defer_and_fuse"):
        out = (torch.ones(4, 4, device="tpu") + xt * 2).cpu()
    torch.testing.assert_close(out, torch.ones(4, 4) + x * 2)
    d = _delta(before)
    assert d["fills_on_host"] == 0 and d["execute_calls"] == 1, d


def test_fills_past_the_size_limit_are_a_program(monkeypatch):
    monkeypatch.setattr(fills, "MAX_BYTES", 1024)
    deferfuse.sync()
    before = deferfuse.metrics()
    with deferfuse.mode("strict"):
        small = torch.zeros(16, device="tpu")  # 64 bytes: on the host
        big = torch.ones(1024, device="tpu")  # 4 KiB: a program
        got = (small.cpu(), big.cpu())
    torch.testing.assert_close(got[0], torch.zeros(16), rtol=0, atol=0)
    torch.testing.assert_close(got[1], torch.ones(1024), rtol=0, atol=0)
    d = _delta(before)
    assert d["fills_on_host"] == 1 and d["execute_calls"] == 1, d


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_an_optimizer_state_made_on_the_host_trains_like_cpu_and_is_donated(mode):
    """AdamW's state, zeros made on the host, is then updated in place: its buffers must be the
    program's own (a copy, not numpy's memory), or PJRT declines the donation and warns."""
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    tpu_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    tpu_model.load_state_dict(cpu_model.state_dict())
    tpu_model.to("tpu")
    x = torch.randn(5, 6)
    xt = x.to("tpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in (cpu_model, tpu_model)]
    deferfuse.sync()
    before = deferfuse.metrics()
    losses = {"cpu": [], "tpu": []}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Some donated buffers were not usable" among them
        for _ in range(4):
            for name, model, opt, inp in (("cpu", cpu_model, opts[0], x), ("tpu", tpu_model, opts[1], xt)):
                with deferfuse.mode(mode) if name == "tpu" else contextlib.nullcontext():
                    loss = model(inp).square().mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                losses[name].append(loss.item())
    torch.testing.assert_close(losses["tpu"], losses["cpu"])
    for p, q in zip(tpu_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach())
    now = deferfuse.metrics()
    assert now["fills_on_host"] > before["fills_on_host"]
    assert now["buffers_donated"] > before["buffers_donated"]


def test_a_captured_fill_stays_a_program():
    """A capture replays its programs: a fill it makes alone must be one of them."""
    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    cap = deferfuse.capture(torch.ones_like, x)
    for _ in range(3):
        torch.testing.assert_close(cap(x).cpu(), torch.ones(2, 3), rtol=0, atol=0)


def test_the_report_counts_fills_on_the_host_as_no_compile():
    def fills():
        with deferfuse.mode("strict"):
            return [torch.zeros(k, 7, device="tpu") for k in range(1, 4)]

    rep = deferfuse.explain(fills)
    assert rep["summary"]["fills_on_host"] == 3 and rep["summary"]["programs_compiled"] == 0, rep["summary"]
    sites = rep["flushes"]["by_source"]
    assert sum(s["count"] for s in sites) == 3 and all(s["compiles"] == 0 for s in sites), sites
