"""scaled_dot_product_attention claimed at its autograd key (deferfuse/lowering/attention.py):
CPU's values and gradients, one node forward and one backward whatever the incoming gradient's
layout."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import check_all_modes

torch.manual_seed(0)
Q, K, V = (torch.randn(2, 3, 5, 4) for _ in range(3))


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_through_a_transposed_output_match_cpu(causal):
    # a transformer transposes attention's output back to (batch, seq, heads, dim), so the
    # gradient reaching attention's backward is a non-contiguous view
    def fn(dev):
        q, k, v = (t.detach().to(dev).requires_grad_() for t in (Q, K, V))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        weights = torch.arange(y.numel(), dtype=y.dtype, device=dev).reshape(2, 5, 3, 4)
        (y.transpose(1, 2).contiguous() * weights).sum().backward()
        return [y, q.grad, k.grad, v.grad]

    check_all_modes(fn)


def test_backward_is_one_node_for_a_non_contiguous_gradient():
    q, k, v = (t.detach().to("tpu").requires_grad_() for t in (Q, K, V))
    with deferfuse.mode():
        y = F.scaled_dot_product_attention(q, k, v)
        grad = torch.ones(2, 5, 3, 4, device="tpu").transpose(1, 2)  # y's shape, not contiguous
        assert not grad.is_contiguous()
        before = deferfuse.metrics()["ops_recorded"]
        y.backward(grad)
        recorded = deferfuse.metrics()["ops_recorded"] - before
    assert recorded == 1  # sdpa_backward reads the view itself: no copy to make it contiguous
    assert q.grad is not None and k.grad is not None and v.grad is not None
