"""`import torch` loads deferfuse through PyTorch's `torch.backends` entry points (pyproject.toml),
so a CUDA script with "cuda" changed to "tpu" runs without `import deferfuse`, in the mode the
environment picks; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from conftest import ROOT, child_env

pytestmark = pytest.mark.subprocess  # each test is a fresh `python -c`

_TRAIN = """
import sys, torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8).to("tpu"), torch.randn(32, 1).to("tpu")
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    losses.append(loss.item())
assert losses[-1] < losses[0], losses
deferfuse = sys.modules["deferfuse"]
print(deferfuse.get_default_mode().value, sorted(deferfuse.metrics()["flushes_by_cause"]))
"""


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=child_env(**env))


# PyTorch finds a backend by its installed entry point: a checkout that is only on PYTHONPATH (a TPU
# host's bundle) has none. `./dev test` installs deferfuse, and installs it again if the entry point is missing.
@pytest.mark.skipif(not entry_points(group="torch.backends", name="deferfuse"),
                    reason="deferfuse is importable but not installed, so PyTorch has no entry point to load")
def test_a_script_without_import_deferfuse_trains_in_the_mode_the_environment_picks():
    out = _python(_TRAIN, TORCH_TPU_DEFER_AND_FUSE="1")
    assert out.returncode == 0, out.stderr[-2000:]
    mode, causes = out.stdout.split(" ", 1)
    assert mode == "defer_and_fuse"
    # recorded and cut where each step's optimizer step ended (the .item() then finds its value),
    # not flushed op by op
    assert causes.strip() == "['optimizer_step']", causes
    out = _python(_TRAIN)
    assert out.returncode == 0 and out.stdout.startswith("strict ['strict_op'"), out.stdout + out.stderr[-2000:]


def test_import_deferfuse_before_torch_still_works():
    out = _python("import deferfuse, torch\nprint((torch.ones(2, device='tpu') * 3).tolist())")
    assert out.returncode == 0 and out.stdout.strip() == "[3.0, 3.0]", out.stderr[-2000:]


def test_autoloading_can_be_turned_off():
    out = _python("import sys, torch\nprint('deferfuse' in sys.modules)\ntorch.ones(1, device='tpu')",
                  TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert out.stdout.strip() == "False"
    assert out.returncode != 0 and "tpu" in out.stderr.splitlines()[-1]
