"""The package's layering (pyproject.toml's import-linter contracts, docs/architecture.md) is
enforced here: an import that points up a layer, or torch in the fuser, fails the suite."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

_LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(root: str) -> subprocess.CompletedProcess:
    return subprocess.run([_LINT, "--config", os.path.join(root, "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": root})


@pytest.mark.subprocess  # lint-imports, a Python tool
def test_every_import_points_down():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "2 kept, 0 broken" in out.stdout


def _copy(tmp_path) -> str:
    root = str(tmp_path / "tree")
    shutil.copytree(os.path.join(ROOT, "deferfuse"), os.path.join(root, "deferfuse"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), root)
    return root


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write("\n" + line + "\n")


@pytest.mark.subprocess  # lint-imports, a Python tool
def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    root = _copy(tmp_path)
    _append(os.path.join(root, "deferfuse", "graph.py"), "from . import dispatch  # noqa")
    out = _lint(root)
    assert out.returncode != 0
    assert "deferfuse.graph -> deferfuse.dispatch" in out.stdout, out.stdout[-3000:]


@pytest.mark.subprocess  # lint-imports, a Python tool
def test_an_executor_importing_modes_breaks_the_layers_contract(tmp_path):
    """modes builds the executors, so an executor that asks modes which mode is in force closes
    a circle (data_checks did): it asks executors/active.py, below both."""
    root = _copy(tmp_path)
    _append(os.path.join(root, "deferfuse", "executors", "data_checks.py"), "from .. import modes  # noqa")
    out = _lint(root)
    assert out.returncode != 0
    assert "deferfuse.executors.data_checks -> deferfuse.modes" in out.stdout, out.stdout[-3000:]


@pytest.mark.subprocess  # lint-imports, a Python tool
def test_torch_in_the_fuser_breaks_the_forbidden_contract(tmp_path):
    root = _copy(tmp_path)
    _append(os.path.join(root, "deferfuse", "fuser.py"), "import torch  # noqa")
    out = _lint(root)
    assert out.returncode != 0
    assert "deferfuse.fuser -> torch" in out.stdout, out.stdout[-3000:]


def test_no_source_file_is_over_450_lines_outside_the_lowering_families():
    long = []
    for folder, _, files in os.walk(os.path.join(ROOT, "deferfuse")):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or os.sep + "lowering" + os.sep in path:
                continue
            with open(path) as f:
                n = sum(1 for _ in f)
            if n > 450:
                long.append((os.path.relpath(path, ROOT), n))
    assert not long, long
