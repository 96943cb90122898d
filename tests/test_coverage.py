"""The op-serving table: every Core ATen op is lowered, decomposed, a view, or has a reason."""
from __future__ import annotations

import torch

from deferfuse import coverage

aten = torch.ops.aten


def test_core_aten_is_covered_or_explained():
    core = coverage.core_ops()
    assert len(core) >= 190
    unexplained = [str(op) for op in core
                   if coverage.served(op)[0] == "cpu-fallback" and str(op) not in coverage.REASONS]
    assert not unexplained, f"Core ATen ops on the CPU fallback without a documented reason: {unexplained}"


def test_served_categories():
    assert coverage.served(aten.add.Tensor)[0] == "lowered"
    assert coverage.served(aten.t.default)[0] == "view"
    assert coverage.served(aten.add_.Tensor)[0] == "mutation"
    assert coverage.served(aten.nonzero.default)[0] == "data-dependent"
    assert coverage.served(aten._local_scalar_dense.default)[0] == "special"


def test_markdown_renders(tmp_path):
    out = tmp_path / "ops.md"
    assert coverage.main(["--markdown", str(out)]) == 0
    text = out.read_text()
    assert "Core ATen" in text and "`aten.add.Tensor`" in text


def test_device_results_get_a_section_naming_what_passes_only_on_cpu(tmp_path):
    import json

    cpu = {"add|function|float32|strict": "pass", "exp|function|float32|strict": "pass",
           "exp|function|bfloat16|defer_and_fuse": "pass"}
    tpu = {"add|function|float32|strict": "pass", "exp|function|float32|strict": "fail: mismatch",
           "exp|function|bfloat16|defer_and_fuse": "pass"}
    (tmp_path / "cpu.main.json").write_text(json.dumps(cpu))
    (tmp_path / "tpu.main.json").write_text(json.dumps(tpu))
    out = tmp_path / "ops.md"
    assert coverage.main(["--markdown", str(out), "--results", str(tmp_path / "cpu.*.json"),
                          "--device-results", str(tmp_path / "tpu.*.json"),
                          "--device-label", "TPU v5e, commit abc1234"]) == 0
    text = out.read_text()
    section = text[text.index("## OpInfo on TPU v5e, commit abc1234"):]
    assert "| strict | 1/2 (50.0 %) |" in section
    assert "Results that pass on CPU and not on the device: 1." in section
    assert "| `exp` | function/float32/strict | fail: mismatch |" in section
