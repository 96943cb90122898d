"""`torch.compile(backend="tpu")` on Hugging Face models, against CPU eager.

A decoder's `DynamicCache` makes `torch.tensor([], device=...)` inside the forward, and PyTorch
makes such a tensor on its device below the dispatch modes: Dynamo once met a real tpu tensor
among its fake ones and failed on every HF decoder (compiler/dynamo.py).
"""
from __future__ import annotations

import pytest
import torch

import zoo_harness as H
from test_zoo import SPECS


def _with_constant(x):
    k = torch.tensor([5.0], dtype=x.dtype, device=x.device)
    return x * k


def _grown_from_empty(x):
    k = torch.tensor([], dtype=x.dtype, device=x.device)  # as DynamicCache begins
    return torch.cat([k, x.flatten()], dim=0) * 2


@pytest.mark.parametrize("fn", [_with_constant, _grown_from_empty])
def test_a_tensor_made_from_data_inside_a_compiled_function(fn):
    x = torch.arange(6.0).reshape(2, 3)
    got = torch.compile(fn, backend="tpu")(x.to("tpu")).cpu()
    torch.testing.assert_close(got, fn(x))


@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral"])  # mixtral: `_grouped_mm` in float32 (dynamo.py)
def test_a_compiled_hugging_face_decoder_trains_to_cpus_losses(name):
    spec = SPECS[name]
    want, _ = H.run_loop(spec, "cpu", steps=3)
    got, _ = H.run_loop(spec, "tpu", steps=3, compiled=True)  # forward compiled; backward, AdamW eager
    H.assert_matches(got, want, f"{name}: the losses of three compiled steps")
