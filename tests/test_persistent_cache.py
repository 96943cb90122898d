"""The persistent compile cache (deferfuse/persistent.py), on by default: a second process loads
the first one's programs instead of compiling them, gets the same results, survives a corrupt
entry, honours its size cap, and refuses a folder others may write. Each case is a process of its
own with a cache folder of its own."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, child_env, read_summary

pytestmark = pytest.mark.subprocess  # each case is a process of its own (and git's, for the checkout)

# a small training run: several programs, a result to compare and the metrics to read
_RUN = """
import json, sys, torch, deferfuse
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
x, y = torch.randn(8, 16).to("tpu"), torch.randn(8, 4).to("tpu")
with deferfuse.mode():
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item())
m = deferfuse.metrics()
print(json.dumps({"losses": losses, "compile_seconds": m["compile_seconds"], "hits": m["persistent_cache_hits"],
                  "misses": m["persistent_cache_misses"], "folder": deferfuse.persistent.configure(),
                  "report": deferfuse.report()["summary"]["persistent_cache_hits"]}))
"""


def _run(cache_dir: str, cwd: str = ROOT, code: str = _RUN, **env) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd,
                         env=child_env(DEFERFUSE_CACHE_DIR=cache_dir, **env))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1]), out.stderr


def test_a_second_process_loads_the_programs_the_first_compiled(tmp_path):
    first, _ = _run(str(tmp_path))
    second, _ = _run(str(tmp_path))
    assert first["hits"] == 0 and first["misses"] > 0
    assert second["hits"] == first["misses"] and second["misses"] == 0 and second["report"] == second["hits"]
    assert second["losses"] == first["losses"]
    assert second["compile_seconds"] < first["compile_seconds"]
    assert os.stat(first["folder"]).st_mode & 0o777 == 0o700


def test_a_corrupt_entry_is_compiled_again_with_a_warning(tmp_path):
    first, _ = _run(str(tmp_path))
    entries = glob.glob(os.path.join(first["folder"], "*-cache"))
    assert entries
    for path in entries:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    again, stderr = _run(str(tmp_path))
    assert "Error reading persistent compilation cache entry" in stderr
    assert again["losses"] == first["losses"] and again["hits"] == 0


def test_the_size_cap_evicts_the_least_recently_used(tmp_path):
    _run(str(tmp_path), DEFERFUSE_CACHE_MAX_MB="1")
    other = _RUN.replace("range(3)", "range(4)").replace("GELU", "Tanh")  # more programs, other ones
    folder = _run(str(tmp_path), code=other, DEFERFUSE_CACHE_MAX_MB="1")[0]["folder"]
    sizes = [os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*-cache"))]
    assert sizes and sum(sizes) <= 1 << 20


@pytest.mark.parametrize("setting", ["", "0", "off", "OFF", "false", "no"])
def test_it_can_be_turned_off(tmp_path, setting):
    """Every word the other switches take for "off" turns it off: none is a folder name (the
    run's working folder, where a relative one would go, stays empty too)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    result, _ = _run(setting, cwd=str(work), HOME=str(home), XDG_CACHE_HOME=str(home / "xdg"))
    assert result["folder"] is None and result["hits"] == result["misses"] == 0
    assert not os.listdir(home) and not os.listdir(work)


def test_no_compile_cache_entry_is_tracked():
    """A cache folder inside the checkout (a relative DEFERFUSE_CACHE_DIR) is ignored by git, and
    none is committed: each entry is an executable for one machine, megabytes in every clone."""
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    assert files and not [f for f in files if f.endswith("-cache")]
    probe = "some-folder/jax-0.10.2-jaxlib-0.10.2-deferfuse-0.1.0/abc-cache"
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", probe], cwd=ROOT)
    assert ignored.returncode == 0


def test_the_default_folder_is_under_the_users_cache(tmp_path):
    env = child_env(XDG_CACHE_HOME=str(tmp_path))
    env.pop("DEFERFUSE_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", "import deferfuse; print(deferfuse.persistent.configure())"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.stdout.strip().startswith(str(tmp_path / "deferfuse" / "jax-")), out.stderr[-2000:]


def test_a_folder_others_may_write_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    result, stderr = _run(str(shared))
    assert result["folder"] is None and "not private" in stderr


def test_the_demo_run_twice_compiles_a_quarter_as_long_the_second_time(tmp_path):
    """`./dev demo` twice on a fresh cache: the second run loads its programs from deferfuse's own
    store (cache/stored.py), so neither XLA nor the trace and lowering JAX's cache would need to
    find them cost it time: its compile seconds, all of them, are at most a quarter of the first
    run's, and it prints the same losses. (With JAX's cache alone the trace and lowering were
    about a second a program here, a third of a cold run's compile seconds.)"""
    def demo():
        out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "gpt_train.py"), "--steps", "6",
                              "--log-every", "2"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                             env=child_env(DEFERFUSE_CACHE_DIR=str(tmp_path)))
        assert out.returncode == 0, out.stderr[-2000:]
        lines = out.stdout.splitlines()
        losses = [line.split("(")[0] for line in lines if line.startswith("step")]
        return losses, read_summary(out.stdout)

    first_losses, first = demo()
    second_losses, second = demo()
    assert len(first_losses) == 4 and second_losses == first_losses
    assert first["persistent_cache_hits"] == 0 and second["persistent_cache_misses"] == 0
    assert second["xla_compile_seconds"] == 0, (first, second)
    assert second["compile_seconds"] <= 0.25 * first["compile_seconds"], (first, second)
