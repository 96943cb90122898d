"""The examples train to CPU eager's numbers in every mode, and settle into a fixed set of programs."""
from __future__ import annotations

import re
import time

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from deferfuse.config import CONFIG
import gpt_train
import loop
import mlp_train
from conftest import MODES, read_summary

GPT_CFG = gpt_train.GPTConfig(layers=4, dim=64, heads=4, seq=32)


@pytest.fixture(scope="module")
def gpt_cpu_losses():
    return gpt_train.train("cpu", 20, GPT_CFG, batch=4, log_every=1, quiet=True)


@pytest.fixture(scope="module")
def mlp_cpu_losses():
    return mlp_train.train("cpu", 20, width=128, batch=32, log_every=1, quiet=True)


@pytest.mark.parametrize("mode", MODES)
def test_gpt_matches_cpu(mode, gpt_cpu_losses):
    losses = gpt_train.train(mode, 20, GPT_CFG, batch=4, log_every=1, quiet=True)
    assert len(losses) == 20
    torch.testing.assert_close(losses, gpt_cpu_losses, rtol=1e-4, atol=0)
    assert deferfuse.metrics()["cpu_fallbacks_total"] == 0


def test_the_summary_is_read_at_a_glance(capsys):
    """The demo's last lines: speed, compiles, flushes by cause, fallbacks, the persistent cache,
    and where the rest is, not metrics()' forty counters (issue 40, item 7)."""
    deferfuse.reset_metrics()
    t0 = time.perf_counter()
    mlp_train.train("defer_and_fuse", 3, width=32, batch=8, log_every=2, quiet=True)
    capsys.readouterr()
    loop.summary("defer_and_fuse", 3, t0)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) <= 6 and "ops_recorded" not in out, out
    assert re.match(r"3 steps in [\d.]+s \(defer_and_fuse\): [\d.]+ steps/s", lines[0]), out
    m = deferfuse.metrics()
    assert m["flushes"] > 1 and m["programs_compiled"] > 0
    got = read_summary(out)
    assert abs(got.pop("compile_seconds") - m["compile_seconds"]) <= 0.005
    assert abs(got.pop("xla_compile_seconds") - m["xla_compile_seconds"]) <= 0.005
    assert got == {k: m[k] for k in got}, out
    assert "deferfuse-report " in lines[-1] and "deferfuse.metrics()" in lines[-1], out


@pytest.mark.parametrize("mode", MODES)
def test_mlp_matches_cpu(mode, mlp_cpu_losses):
    losses = mlp_train.train(mode, 20, width=128, batch=32, log_every=1, quiet=True)
    torch.testing.assert_close(losses, mlp_cpu_losses, rtol=1e-4, atol=0)
    assert deferfuse.metrics()["cpu_fallbacks_total"] == 0


def _gpt_loop(steps: int, item_every: int | None, cfg=GPT_CFG, optimizer: bool = True):
    """Per step: (programs compiled since the loop began, nodes pending, flushes by cause since
    the loop began). Without `optimizer`, the update is plain SGD written out, as some loops do."""
    torch.manual_seed(0)
    model = gpt_train.GPT(cfg).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 1000)
    data = gpt_train.batches(cfg, 4)
    per_step = []
    m0 = deferfuse.metrics()
    with deferfuse.mode():
        for step in range(steps):
            x, y = next(data)
            x, y = x.to("tpu"), y.to("tpu")
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if optimizer:
                opt.step()
                opt.zero_grad()
                sched.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 1e-3 * p.grad
                        p.grad = None
            if item_every and step % item_every == 0:
                loss.item()
            m = deferfuse.metrics()
            causes = {c: n - m0["flushes_by_cause"].get(c, 0) for c, n in m["flushes_by_cause"].items()}
            per_step.append((m["cache_misses"] - m0["cache_misses"], m["pending_nodes"],
                             {c: n for c, n in causes.items() if n}))
    return per_step


def test_no_recompiles_after_step_3_with_item_every_5_steps():
    per_step = _gpt_loop(16, item_every=5)
    misses = [m for m, _, _ in per_step]
    assert misses[3:] == [misses[3]] * (len(misses) - 3), misses


def test_a_training_loop_is_cut_at_each_optimizer_step():
    """Each step is one flush, cut where the optimizer's step() ended (before the next step's
    first op), and every step is the same program, the first included: its new optimizer state
    is made apart inside the first step (zeros, made on the host: no program), and its first calls
    of decomposed ops record what the later calls do. Nothing compiles after that, no partial step
    is left to flush on its own, and the period detector never cuts a step elsewhere."""
    deferfuse.cache.clear()  # count every program this loop needs, not what earlier tests left
    hosted = deferfuse.metrics()["fills_on_host"]
    per_step = _gpt_loop(12, item_every=None)
    misses = [m for m, _, _ in per_step]
    pending = [p for _, p, _ in per_step]
    # the state inside step 0, with no program; a step's cut runs at the next step's first op:
    # step 0's program then, which every later step shares
    assert misses == [0] + [1] * (len(misses) - 1), misses
    assert deferfuse.metrics()["fills_on_host"] == hosted + 1
    # what stays pending after a step is that whole step, and the same every step
    assert pending[1:] == [pending[1]] * (len(pending) - 1) and pending[1] > 0, pending
    assert per_step[-1][2] == {"optimizer_step": len(per_step) - 1, "optimizer_state": 1}, per_step[-1][2]


def test_loop_without_item_stays_bounded_and_stops_compiling():
    """A loop with no optimizer to cut at (the update written out) relies on the period detector:
    the first cut waits until the step has repeated over step_min_ops nodes; from then on it cuts
    every step, so what stays pending is less than one step, and nothing compiles after."""
    per_step = _gpt_loop(50, item_every=None, optimizer=False)
    misses = [m for m, _, _ in per_step]
    pending = [p for _, p, _ in per_step]
    step_nodes = pending[0]
    first_cut = next(i for i in range(1, len(pending)) if pending[i] < pending[i - 1] + step_nodes)
    assert first_cut <= -(-CONFIG.step_min_ops // step_nodes) + 1, pending
    # two programs: the first cut's (several steps at once), then one step's; nothing after
    settled = first_cut + 2
    assert misses[settled:] == [misses[settled]] * (len(misses) - settled), misses
    assert max(pending[settled:]) < step_nodes and deferfuse.metrics()["max_pending"] < 2 * CONFIG.step_min_ops
    assert per_step[-1][2].get("repeated_op_heuristic", 0) > 0
