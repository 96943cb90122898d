"""Checkpoints of tpu tensors: torch.save / torch.load as with CUDA tensors."""
from __future__ import annotations

import subprocess
import sys

import torch

import deferfuse


def _trained(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(3, 4, device=device)).sum().backward()
    opt.step()
    return model, opt


def test_state_dicts_round_trip_with_the_default_weights_only_load(tmp_path):
    """torch.load's default (weights_only=True) accepts a tpu checkpoint, and training resumes
    exactly where it stopped."""
    path = tmp_path / "ckpt.pt"
    with deferfuse.mode():
        model, opt = _trained("tpu")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
        state = torch.load(path)
        assert state["model"]["0.weight"].device.type == "tpu"
        model2, _ = _trained("tpu")
        model2.load_state_dict(state["model"])
        opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
        opt2.load_state_dict(state["opt"])
        for m, o in ((model, opt), (model2, opt2)):
            m(torch.ones(3, 4, device="tpu")).sum().backward()
            o.step()
        for a, b in zip(model.parameters(), model2.parameters()):
            torch.testing.assert_close(b.cpu(), a.cpu())


def test_a_tpu_checkpoint_loads_on_cpu_without_deferfuse(tmp_path):
    """map_location="cpu" gives CPU tensors in a process that never imports deferfuse."""
    path = tmp_path / "ckpt.pt"
    model, _ = _trained("tpu")
    torch.save(model.state_dict(), path)
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    torch.save(expected, tmp_path / "expected.pt")
    code = (
        "import sys, torch\n"
        f"got = torch.load({str(path)!r}, map_location='cpu')\n"
        f"want = torch.load({str(tmp_path / 'expected.pt')!r})\n"
        "assert 'deferfuse' not in sys.modules\n"
        "assert all(t.device.type == 'cpu' for t in got.values())\n"
        "torch.testing.assert_close(got, want)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
