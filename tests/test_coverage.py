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
