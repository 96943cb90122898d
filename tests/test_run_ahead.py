"""DeferAndFuse launches a replayed step's programs before the step's flush (cache/ahead.py).

The loops here read their loss with `.item()` every step, through a model whose repeated blocks
the fuser cuts into several programs. Launching early must change
no value and compile nothing: every loop matches CPU, and one that runs ahead compiles exactly
what the same loop compiles without running ahead. A step that turns out to differ from its
trace after programs were launched (another branch, a new sync point, an op that raises) drops
what was launched and still matches CPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
import gpt_train
from deferfuse.cache import ahead, runtime
from deferfuse.config import CONFIG
from deferfuse.executors.base import EagerMode
from deferfuse.modes import EXECUTORS
from deferfuse.report.text import render

pytestmark = pytest.mark.tpu_tolerance(
    times=8, why="ten AdamW steps through bf16-pass matmuls, as test_replay.py's loops")

STEPS = 10


@pytest.fixture(autouse=True)
def _run_ahead(monkeypatch):
    """Run ahead whatever the platform (by default not on JAX's CPU backend)."""
    monkeypatch.setattr(CONFIG, "run_ahead", True)
    deferfuse.cache.clear()
    EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.forget()


# six layers: the fuser cuts a step of this GPT into a program per layer (CONFIG.fuse_block_repeats)
CFG = gpt_train.GPTConfig(vocab=32, seq=8, layers=6, heads=2, dim=16)


# Attention's key bias has a gradient that is zero but for rounding, which AdamW's default eps
# (1e-8) turns into updates of +-lr whose signs no two implementations share; a larger eps keeps
# rounding at rounding's size.
EPS = 1e-4


def _model(device):
    torch.manual_seed(0)
    return gpt_train.GPT(CFG).to(device)


def _batch(g, device):
    x = torch.randint(0, CFG.vocab, (2, CFG.seq), generator=g)
    return x.to(device), x.roll(-1, 1).to(device)


def _loss(model, x, t):
    return F.cross_entropy(model(x).flatten(0, 1), t.flatten())


def _loop(device, change=None):
    """Train with AdamW, reading each step's loss with `.item()`; `change(i, model, x, loss)`
    may alter step i after its forward. Returns the logged losses and the parameters."""
    model = _model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, eps=EPS)
    g = torch.Generator().manual_seed(1)
    logged = []
    for i in range(STEPS):
        x, t = _batch(g, device)
        loss = _loss(model, x, t)
        if change is not None:
            loss = change(i, model, x, loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
        logged.append(loss.item())
    return torch.tensor(logged), [p.detach().cpu() for p in model.parameters()]


def _on_tpu(change=None):
    with deferfuse.mode():
        return _loop("tpu", change)


def test_a_loop_that_logs_its_loss_runs_ahead_and_matches_cpu():
    cpu = _loop("cpu")
    got = _on_tpu()
    torch.testing.assert_close(got, cpu)
    m = deferfuse.metrics()
    assert m["programs_ran_ahead"] > STEPS, m["programs_ran_ahead"]  # several programs a step, once confirmed
    assert m["programs_ran_ahead_wasted"] == 0
    text = render(deferfuse.report())
    assert f"{m['programs_ran_ahead']} programs of replayed steps launched before their flush" in text


def test_running_ahead_compiles_nothing_more():
    _on_tpu()
    ran = deferfuse.metrics()
    deferfuse.cache.clear()
    EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.forget()
    deferfuse.reset_metrics()
    CONFIG.run_ahead = False
    _on_tpu()
    plain = deferfuse.metrics()
    assert ran["programs_ran_ahead"] > 0 and plain["programs_ran_ahead"] == 0

    assert ran["cache_misses"] == plain["cache_misses"]
    assert ran["execute_calls"] == plain["execute_calls"]


def _late_branch(i, model, x, loss):
    # after the whole forward has been launched, step 7 adds a term: its flush runs another plan
    return loss + 0.1 * model(x).pow(2).mean() if i == 7 else loss


def _new_sync(i, model, x, loss):
    # a sync point inside step 7, after its forward: the graph flushed there is not the trace's
    if i == 7 and loss.item() > 100:
        return loss * 2
    return loss


def _raises(i, model, x, loss):
    # an op that raises inside step 7, after programs were launched; the user carries on
    if i == 7:
        with pytest.raises(RuntimeError):
            loss.new_ones(5, 8) @ loss.new_ones(3, 4)
    return loss


@pytest.mark.parametrize("change", [_late_branch, _new_sync, _raises], ids=["late_branch", "new_sync", "raises"])
def test_a_step_that_differs_after_running_ahead_matches_cpu(change):
    cpu = _loop("cpu", change)
    got = _on_tpu(change)
    torch.testing.assert_close(got, cpu)
    m = deferfuse.metrics()
    assert m["programs_ran_ahead"] > 0
    if change is not _raises:  # an op that raises changes nothing: step 7 still runs its plan
        assert m["programs_ran_ahead_wasted"] > 0, m


def test_another_shape_after_running_ahead_matches_cpu():
    def smaller(i, model, x, loss):
        return _loss(model, x[:1], x[:1]) if i >= 7 else loss

    cpu = _loop("cpu", smaller)
    got = _on_tpu(smaller)
    torch.testing.assert_close(got, cpu)


def test_a_launch_that_fails_is_left_to_the_flush(monkeypatch):
    """A program that fails as it is launched (the device out of memory, say) raises nothing at the
    op that launched it: its step's flush runs the whole plan, and reports a failure as it would."""
    calls = {"n": 0}
    real = runtime.run_compiled

    def failing(c, inputs, scalars, allowed):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory (as a launch may fail)")
        return real(c, inputs, scalars, allowed)

    monkeypatch.setattr(ahead, "run_compiled", failing)
    torch.testing.assert_close(_on_tpu(), _loop("cpu"))
    assert calls["n"] > 3


def test_an_interrupt_as_a_program_launches_gives_up_its_step(monkeypatch):
    """A KeyboardInterrupt as a program is launched raises at the op that launched it, and drops the
    step's run-ahead: the step the user abandons there changes nothing, the next steps match CPU."""
    calls = {"n": 0}
    real = runtime.run_compiled

    def interrupted(c, inputs, scalars, allowed):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(c, inputs, scalars, allowed)

    monkeypatch.setattr(ahead, "run_compiled", interrupted)
    skipped: list = []
    with deferfuse.mode():
        got = _loop_skipping("tpu", skipped)
    assert len(skipped) == 1 and calls["n"] > 3, (skipped, calls)
    torch.testing.assert_close(got, _loop_skipping("cpu", list(skipped)))


def _loop_skipping(device, skipped: list):
    """_loop, giving up a step whose forward a KeyboardInterrupt ends (on CPU: the steps listed)."""
    model = _model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, eps=EPS)
    g = torch.Generator().manual_seed(1)
    given = list(skipped)
    logged = []
    for i in range(STEPS):
        x, t = _batch(g, device)
        try:
            if i in given:
                raise KeyboardInterrupt
            out = model(x)
        except KeyboardInterrupt:
            if i not in given:
                skipped.append(i)
            continue
        loss = F.cross_entropy(out.flatten(0, 1), t.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        logged.append(loss.item())
    return torch.tensor(logged), [p.detach().cpu() for p in model.parameters()]


def test_auto_runs_ahead_only_off_the_host_cpu(monkeypatch):
    monkeypatch.setattr(CONFIG, "run_ahead", "auto")
    assert ahead._on() is (deferfuse.target.jax_device().platform != "cpu")
