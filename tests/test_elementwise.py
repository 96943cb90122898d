"""Elementwise ops reached through Python operators, against CPU in every mode."""
import warnings

import torch

from conftest import check_all_modes


def test_shift_operators_are_lowered():
    """`a << 2` and `a >> b` reach aten.__lshift__/__rshift__, not bitwise_*_shift: they fell back
    to CPU with a flush each."""
    def run(d):
        b = torch.tensor([5, -8, 7], dtype=torch.int32).to(d)
        u = torch.tensor([1, 200, 3], dtype=torch.uint8).to(d)
        return [b << 2, b >> 1, b << torch.tensor([1, 40, 3]).to(d), b >> torch.tensor([1, 40, 0]).to(d),
                u << 9, u >> 1, u << 1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU fallback warns
        check_all_modes(run)
