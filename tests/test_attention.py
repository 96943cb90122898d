"""scaled_dot_product_attention claimed at its autograd key (deferfuse/lowering/attention.py):
CPU's values and gradients, one node forward and one backward whatever the incoming gradient's
layout."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes, check_raises_like_cpu

torch.manual_seed(0)
Q, K, V = (torch.randn(2, 3, 5, 4) for _ in range(3))


@pytest.mark.tpu_tolerance(times=4, why="softmax's exp and bf16-pass matmuls on XLA:TPU: 1.8e-5 absolute "
                                        "measured, 1.8 times")
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

    # float32 gradients summed over products with weights up to 120: XLA and CPU's BLAS
    # accumulate in different orders, which moves them by a few ulps more on some CPUs
    check_all_modes(fn, rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("masks", ["none", "attn", "key_padding", "both"])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_multihead_attention_inference_fast_path_matches_cpu(masks, need_weights, average):
    """nn.MultiheadAttention in eval mode under no_grad takes PyTorch's fused path
    (_native_multi_head_attention): lowered, with CPU's results, masks and weights."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    g = torch.Generator().manual_seed(1)
    attn = (torch.rand(5, 5, generator=g) > 0.7).fill_diagonal_(False) if masks in ("attn", "both") else None
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2]) if masks in ("key_padding", "both") else None

    def run(d):
        m = copy.deepcopy(mha).to(d)
        with torch.no_grad():
            out, w = m(x.to(d), x.to(d), x.to(d), key_padding_mask=None if pad is None else pad.to(d),
                       attn_mask=None if attn is None else attn.to(d), need_weights=need_weights,
                       average_attn_weights=average)
        return [out, torch.tensor(w is None) if w is None else w]

    check_all_modes(run, rtol=1e-5, atol=1e-5)
    assert "aten._native_multi_head_attention.default" not in deferfuse.metrics()["cpu_fallbacks"]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masks", ["none", "src_mask", "key_padding"])
def test_transformer_encoder_layer_inference_fast_path_matches_cpu(norm_first, activation, masks):
    """nn.TransformerEncoderLayer in eval mode under no_grad runs as one fused ATen op
    (_transformer_encoder_layer_fwd): lowered, with CPU's results."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             activation=activation).eval()
    x = torch.randn(2, 5, 16)
    kw = {"src_mask": torch.rand(5, 5, generator=torch.Generator().manual_seed(1)) > 0.7,
          "src_key_padding_mask": torch.tensor([[False] * 5, [False] * 3 + [True] * 2])}
    kw = {k: v for k, v in kw.items() if masks != "none" and k.endswith(masks)}

    def run(d):
        m = copy.deepcopy(layer).to(d)
        with torch.no_grad():
            return m(x.to(d), **{k: v.to(d) for k, v in kw.items()})

    check_all_modes(run, rtol=1e-5, atol=1e-5)
    assert not deferfuse.metrics()["cpu_fallbacks"]


@pytest.mark.parametrize("mode", MODES)
def test_sdpa_double_backward(mode):
    """create_graph=True through attention (a gradient penalty) differentiates PyTorch's expansion
    again; it gave zero second-order gradients. CPU's own SDPA refuses double backward, so the
    reference is the same attention written out on CPU."""
    def run(d, fused):
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64).to(d).requires_grad_() for _ in range(3))
        if fused:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / 2.0
            s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool, device=d).triu(1), float("-inf"))
            o = s.softmax(-1) @ v
        gq, = torch.autograd.grad(o.pow(2).sum(), q, create_graph=True)
        gq.pow(2).sum().backward()
        return [gq.detach(), q.grad, k.grad, v.grad]

    want = run("cpu", False)
    with deferfuse.mode(mode):
        got = [t.cpu() for t in run("tpu", True)]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared", ["qqq", "qqv"])
def test_sdpa_double_backward_with_one_tensor_in_several_arguments(mode, shared):
    """Self-attention written as sdpa(q, q, q) under create_graph=True: the gradient was the
    whole one per argument slot, so q's came out three times too large."""
    def run(d, fused):
        torch.manual_seed(0)
        q, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64).to(d).requires_grad_() for _ in range(2))
        v = q if shared == "qqq" else v
        if fused:
            o = F.scaled_dot_product_attention(q, q, v)
        else:
            o = ((q @ q.transpose(-1, -2)) / math.sqrt(8)).softmax(-1) @ v
        gq, = torch.autograd.grad(o.pow(2).sum(), q, create_graph=True)
        gq.pow(2).sum().backward()
        return [gq.detach(), q.grad]

    want = run("cpu", False)
    with deferfuse.mode(mode):
        got = [t.cpu() for t in run("tpu", True)]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("inplace", [False, True])
def test_fills_with_a_cpu_scalar_tensor_value(inplace):
    """`scores.masked_fill(mask, torch.tensor(float("-inf")))` and index_fill with a CPU 0-dim
    value, as CUDA allows: PyTorch's meta kernels refused the CPU value next to meta tensors."""
    def run(d):
        x = torch.arange(6.0).reshape(2, 3).to(d)
        mask = (x > 2)
        idx = torch.tensor([0, 2]).to(d)
        if inplace:
            a, b = x.clone(), x.clone()
            a.masked_fill_(mask, torch.tensor(float("-inf")))
            b.index_fill_(1, idx, torch.tensor(7))
            return [a, b]
        return [x.masked_fill(mask, torch.tensor(float("-inf"))), x.index_fill(1, idx, torch.tensor(-1.5)),
                x.masked_fill(mask, torch.tensor(2.5).to(d))]

    check_all_modes(run)


def _attention_case(d, heads_kv, mask, causal):
    """q of 4 heads against k/v of `heads_kv`; row 1 of batch 1 sees no key at all under the
    "padded" masks (a left-padded prompt's first positions); returns outputs and all gradients."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k, v = torch.randn(2, heads_kv, 6, 8, generator=g), torch.randn(2, heads_kv, 6, 8, generator=g)
    q, k, v = (t.to(d).requires_grad_() for t in (q, k, v))
    m = None
    if mask == "padded_bool":
        keep = torch.ones(2, 1, 5, 6, dtype=torch.bool)
        keep[1, :, :, :3] = False
        keep[1, :, 3:, 1] = True
        m = keep.to(d)
    elif mask == "padded_float":  # transformers' additive masks: -inf where a key is padding
        add = torch.randn(2, 4, 5, 6, generator=g)
        add[1, :, :2, :] = float("-inf")
        m = add.to(d).requires_grad_()
    elif mask == "learned_bias":  # T5's relative position bias: broadcast over the batch
        m = torch.randn(1, 4, 5, 6, generator=g).to(d).requires_grad_()
    elif mask == "learned_2d":
        m = torch.randn(5, 6, generator=g).to(d).requires_grad_()
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, enable_gqa=heads_kv != 4)
    weights = torch.arange(o.numel(), dtype=o.dtype, device=d).reshape(o.shape).sin()
    (o * weights).sum().backward()
    grads = [q.grad, k.grad, v.grad] + ([m.grad] if m is not None and m.requires_grad else [])
    assert all(t is not None for t in grads)  # a gradient on one side only is never a tolerance question
    return [o] + grads


@pytest.mark.parametrize("heads_kv", [4, 2, 1])
@pytest.mark.parametrize("mask,causal", [(None, False), (None, True), ("padded_bool", False),
                                         ("padded_float", False), ("learned_bias", False),
                                         ("learned_2d", False)])
def test_sdpa_gqa_masks_and_mask_gradients_match_cpu(heads_kv, mask, causal):
    """Grouped-query attention (Llama, Mistral, Qwen: fewer key/value heads than query heads),
    fully masked rows (PyTorch's safe softmax gives zeros where deferfuse gave NaN) and the
    gradient of a float mask that requires grad (T5's position bias got none)."""
    check_all_modes(lambda d: _attention_case(d, heads_kv, mask, causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_sdpa_gqa_heads_that_do_not_divide_raise_cpus_error(mode):
    def run(d):
        q, k = torch.randn(1, 4, 3, 8, device=d), torch.randn(1, 3, 3, 8, device=d)
        return F.scaled_dot_product_attention(q, k, k, enable_gqa=True)

    check_raises_like_cpu(run, mode)
