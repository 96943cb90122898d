"""Checkpoints of tpu tensors: torch.save / torch.load as with CUDA tensors."""
from __future__ import annotations

import copy
import io
import os
import subprocess
import sys

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import deferfuse
from conftest import MODES


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


@pytest.mark.subprocess
def test_a_tpu_checkpoint_loads_on_cpu_without_deferfuse(tmp_path):
    """map_location="cpu" gives CPU tensors in a process that never imports deferfuse (with
    PyTorch's backend autoloading off, as on a machine without deferfuse installed)."""
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
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                   env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})


@pytest.mark.parametrize("mode", MODES)
def test_deepcopy_of_pending_tensors_models_and_state(mode):
    """copy.deepcopy right after a step (an EMA model, a best-so-far state_dict, the optimizer's
    state) copies values that may still be pending, and the copies are independent."""
    def run(d):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2).to(d)
        opt = torch.optim.AdamW(m.parameters(), lr=0.1)
        x = torch.arange(6.0).reshape(2, 3).to(d)
        m(x).sum().backward()
        opt.step()
        ema, sd, osd = copy.deepcopy(m), copy.deepcopy(m.state_dict()), copy.deepcopy(opt.state_dict())
        t = m.weight.detach() * 2
        t_copy = copy.deepcopy(t)
        t.add_(1)
        opt.step()
        assert ema.weight is not m.weight and isinstance(ema.weight, torch.nn.Parameter)
        assert ema.weight.requires_grad and ema.weight.grad is None  # as Parameter.__deepcopy__
        g = m.weight.grad.detach().clone().requires_grad_()
        g.grad = torch.ones_like(g)
        g_copy = copy.deepcopy(g)  # a plain leaf keeps its grad
        return [ema.weight, g_copy, g_copy.grad, sd["weight"], osd["state"][0]["exp_avg"], t_copy, t, m.weight]

    want = run("cpu")
    with deferfuse.mode(mode):
        got = [v.detach().cpu() for v in run("tpu")]
    torch.testing.assert_close(got, [v.detach() for v in want])


def test_load_with_map_location_tpu_gives_cpu_tensors_that_load_state_dict_copies(tmp_path, monkeypatch):
    """PyTorch cannot rebuild storages on tpu (it crashed): the tensors stay on CPU, with a
    warning, and load_state_dict copies them onto the tpu model and optimizer."""
    from deferfuse import install

    path = tmp_path / "ckpt.pt"
    model, opt = _trained("cpu")
    opt.zero_grad()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    for loc in ("tpu", torch.device("tpu"), {"cpu": "tpu"}):
        monkeypatch.setattr(install, "_WARNED_LOAD", False)
        with pytest.warns(UserWarning, match="loads the checkpoint's tensors on CPU"):
            state = torch.load(path, map_location=loc)
        assert state["model"]["0.weight"].device.type == "cpu"
    tpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("tpu")
    tpu_model.load_state_dict(state["model"])
    tpu_opt = torch.optim.AdamW(tpu_model.parameters(), lr=0.1)
    tpu_opt.load_state_dict(state["opt"])
    for m, o, d in ((model, opt, "cpu"), (tpu_model, tpu_opt, "tpu")):
        m(torch.ones(3, 4, device=d)).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), tpu_model.parameters()):
        torch.testing.assert_close(b.cpu(), a)


@pytest.mark.parametrize("map_location", [None, "cpu"])
def test_a_pickled_model_keeps_its_parameters(map_location):
    """torch.save(model) then torch.load: the weights came back plain tensors, and the loaded
    module's .to() failed ('param must be a Parameter')."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()).to("tpu")
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location=map_location, weights_only=False)
    assert all(isinstance(p, torch.nn.Parameter) for p in loaded.parameters())
    loaded = loaded.to("cpu")
    for p, q in zip(loaded.parameters(), model.parameters()):
        torch.testing.assert_close(p.detach(), q.detach().cpu())
    buf = io.BytesIO()
    torch.save(torch.nn.Parameter(torch.ones(3).to("tpu")), buf)
    buf.seek(0)
    assert type(torch.load(buf, map_location="cpu")) is torch.nn.Parameter  # weights_only, too


def test_safetensors_saves_and_loads_a_tpu_state_dict(tmp_path):
    """safetensors (what transformers' save_pretrained writes) finds shared tensors by storage
    pointer before saving; on tpu tensors that pointer raised, so no tpu model could be saved."""
    from safetensors.torch import load_file, save_file

    with deferfuse.mode():
        model, _ = _trained("tpu")
        state = model.state_dict()
        save_file(state, tmp_path / "m.safetensors")
    back = load_file(tmp_path / "m.safetensors")
    assert set(back) == set(state)
    for k, v in state.items():
        torch.testing.assert_close(back[k], v.cpu())


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_safetensors_refuses_tensors_that_share_memory_as_on_cpu(tmp_path, device):
    from safetensors.torch import save_file

    t = torch.arange(12.0, device=device)
    with pytest.raises(RuntimeError, match="share memory"):
        save_file({"a": t, "b": t.view(3, 4)}, tmp_path / "s.safetensors")
    save_file({"a": t, "b": t.clone()}, tmp_path / "s.safetensors")  # distinct storages: fine


@pytest.mark.parametrize("mode", MODES)
def test_data_pointers_identify_storages_as_on_cpu(mode):
    """Pointers are addresses nothing dereferences, but they relate as CPU's do: views share
    their base's storage pointer and sit at their offset from it, distinct storages differ."""
    with deferfuse.mode(mode):
        cpu = torch.arange(24.0).view(4, 6)
        tpu = cpu.to("tpu")
        other = tpu.clone()
        pending = tpu * 2  # a storage whose value is still pending
        flushes = deferfuse.metrics()["flushes"]
        for x in (cpu, tpu):
            row, col = x[2], x[:, 3]
            size = x.element_size()
            assert row.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() != 0
            assert row.data_ptr() - x.data_ptr() == 12 * size
            assert col.data_ptr() - x.data_ptr() == 3 * size
            assert x.untyped_storage().nbytes() == 24 * size
            assert x.storage().data_ptr() == x.untyped_storage().data_ptr()
            assert StorageWeakRef(row.untyped_storage()) == StorageWeakRef(x.untyped_storage())
        ptrs = {t.untyped_storage().data_ptr() for t in (tpu, other, pending)}
        assert len(ptrs) == 3
        assert tpu.untyped_storage().device == tpu.device
        assert torch.empty(0, device="tpu").data_ptr() == torch.empty(0).data_ptr() == 0
        assert deferfuse.metrics()["flushes"] == flushes  # asking for pointers syncs nothing
        torch.testing.assert_close(pending.cpu(), cpu * 2)
