"""deferfuse.check: the per-layer comparison against CPU, its CLI, and its fallback table.

A broken layer is made by adding noise to one op's lowering (`check_models.break_lowering`), so
the tests see what a user would see when a lowering is wrong.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import deferfuse
from check_models import MLP, Spectral, break_lowering, healthy
from conftest import MODES, ROOT, child_env

aten = torch.ops.aten


@pytest.fixture
def broken():
    """Break a lowering for one test; put it back (and forget what was built with it) after."""
    restores = []
    yield lambda op: restores.append(break_lowering(op))
    for restore in restores:
        restore()


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("mode", MODES)
def test_healthy_models_pass_every_layer(mode, backward):
    for model, inputs in healthy():
        before = {k: v.clone() for k, v in model.state_dict().items()}
        result = deferfuse.check(model, *inputs, mode=mode, backward=backward, threshold=1e-6)
        assert result.ok, str(result)
        names = {r.name for r in result.rows}
        assert "(model)" in names or "(model).logits" in names
        assert len(names) > 5  # every submodule was hooked
        assert any(r.kind == "grad" for r in result.rows) == backward
        # the user's model is neither moved, trained, hooked nor changed
        assert model.training
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert next(model.parameters()).device.type == "cpu"


@pytest.mark.parametrize("mode", MODES)
def test_broken_lowering_names_its_layer_first(mode, broken):
    model, x = MLP(), torch.randn(4, 16)
    assert deferfuse.check(model, x, mode=mode).ok
    broken(aten.gelu.default)
    result = deferfuse.check(model, x, mode=mode)
    assert not result.ok
    assert result.first_failure.name == "mlp.act", str(result)
    order = [r.name for r in result.rows]
    assert all(r.ok for r in result.rows[:order.index("mlp.act")])
    assert ">>" in next(line for line in str(result).splitlines() if " mlp.act " in line)


def test_broken_backward_lowering_names_the_layer_backward_reaches_next(broken):
    model, x = MLP(), torch.randn(4, 16)
    broken(aten.gelu_backward.default)
    result = deferfuse.check(model, x, backward=True)
    assert all(r.ok for r in result.rows if r.kind == "output")
    # backward's order: head, norm, mlp.fc2 come before gelu's backward and are right
    assert result.first_failure.name == "mlp.fc1.weight", str(result)
    assert [r.name for r in result.rows if r.kind == "grad"][0] == "head.weight"


class LosesGrad(MLP):
    """On tpu `gate` is used detached, so its gradient exists on CPU only (like issue 26's T5 bias)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.ones(32))

    def forward(self, x):
        gate = self.gate.detach() if x.device.type == "tpu" else self.gate
        h = torch.relu(self.stem(x)) * gate
        return self.head(self.norm(h + self.mlp(h)))


def test_gradient_on_one_side_only_fails():
    result = deferfuse.check(LosesGrad(), torch.randn(4, 16), backward=True)
    failing = [r for r in result.rows if not r.ok]
    assert [(r.name, r.note) for r in failing] == [("gate", "only on cpu")], str(result)
    assert all(r.ok for r in result.rows if r.kind == "output")


def test_fallback_table_names_the_layer():
    result = deferfuse.check(Spectral(), torch.randn(3, 4, 6), mode="strict")
    assert result.ok, str(result)
    assert result.fallbacks == {"aten._linalg_eigh.default": ["spectrum"]}
    assert "aten._linalg_eigh.default: spectrum" in str(result)
    assert deferfuse.check(MLP(), torch.randn(4, 16)).fallbacks == {}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deferfuse.check", *args], cwd=ROOT,
                          env=child_env(os.path.join(ROOT, "tests")),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
def test_cli_exit_status_follows_the_check():
    good = _cli("tests/check_models.py", "--mode", "strict", "--backward")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "all 18 rows pass" in good.stdout
    bad = _cli("check_models:build_broken", "--mode", "strict")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "first: mlp.act (output)" in bad.stdout
