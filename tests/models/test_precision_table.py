"""The precision table's script (precision_table.py) on one architecture: every cell is a number,
and at "highest" (six bfloat16 passes on a TPU, float32 on XLA:CPU) the model matches CPU to
float32's tightness, forward and gradients."""
from __future__ import annotations

import math

import precision_table as P


def test_one_architecture_gives_a_full_row_of_numbers():
    by = P.measure("llama")
    assert set(by) == set(P.PRECISIONS)
    for precision, (fwd, grad) in by.items():
        assert math.isfinite(fwd) and math.isfinite(grad), (precision, fwd, grad)
    fwd, grad = by["highest"]
    assert fwd < 1e-6 and grad < 1e-6, by
    text = P.table({"llama": by})
    assert text.count("\n") == 2 and text.splitlines()[2].startswith("| llama | ")
