"""The first use of the device opens it, and imports beside it the PyTorch modules the first op would
import (target.jax_device); a sync before then leaves it closed. Each case is a fresh Python
process: the test process has long opened the device and imported those modules."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, child_env

pytestmark = pytest.mark.subprocess


def _python(code: str, *paths: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=child_env(*paths))


def test_opening_the_device_imports_what_the_first_op_would():
    out = _python("import sys, torch\nfrom deferfuse import target\n"
                  "names = ('torch._dynamo', 'torch.distributed.tensor')\n"
                  "print([n in sys.modules for n in names])\ntarget.jax_device()\n"
                  "print([n in sys.modules for n in names])\nprint((torch.ones(2, device='tpu') + 1).tolist())")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["[False, False]", "[True, True]", "[2.0, 2.0]"], out.stdout


def test_a_device_opened_inside_an_import_imports_nothing_early(tmp_path):
    # A package opens the device as it loads, and an early import needs the package: as the
    # DTensor package would, were the device opened while it loads. The thread's import waits for
    # the package's lock, which the main thread holds while it waits for the thread.
    (tmp_path / "opens_device").mkdir()
    (tmp_path / "opens_device" / "__init__.py").write_text(
        "import torch\nfrom deferfuse import target\n"
        "target._FIRST_OP_IMPORTS = ('opens_device.needs_it', 'torch._dynamo')\n"
        "x = torch.arange(3, device='tpu')\n")
    (tmp_path / "opens_device" / "needs_it.py").write_text("import opens_device\n")
    out = _python("import sys\nimport opens_device\n"
                  "print([n in sys.modules for n in ('opens_device.needs_it', 'torch._dynamo')])\n"
                  "print((opens_device.x * 2).tolist())", str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["[False, False]", "[0, 2, 4]"], out.stdout


def test_a_sync_before_the_device_is_used_leaves_it_closed():
    # On a TPU host one process holds the chip: a parent that only syncs (this suite's cleanup
    # fixture) must leave it to the processes it starts, as tests/test_program_store.py's do.
    out = _python("import torch, deferfuse\nfrom deferfuse import target\n"
                  "deferfuse.sync()\ntorch.tpu.synchronize()\nprint(target.opened())\n"
                  "x = torch.ones(2, device='tpu') * 2\ntorch.tpu.synchronize()\nprint(target.opened(), x.cpu().tolist())")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["False", "True [2.0, 2.0]"], out.stdout
