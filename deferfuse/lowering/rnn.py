"""The fused LSTM and GRU cells that `nn.LSTM`, `nn.GRU` and their Cell modules use off CPU.

For any device but CPU, ATen's RNN loop computes each step's gate matmuls itself and hands the
pointwise rest to `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` (CUDA kernels that CPU lacks,
so there is no CPU fallback either), whose backward reads a `workspace` the forward saved. The
workspace layout is private to these lowerings: LSTM keeps its four activated gates (i, f, g, o),
GRU its r, z, n gates, the previous hidden state and the hidden part of the new gate.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import aten, lowering


def _lstm_meta(args, kwargs):
    # PyTorch's own fails on a cell without biases (nn.LSTM(bias=False))
    input_gates, cx = args[0], args[2]
    return torch.empty_like(cx), torch.empty_like(cx), torch.empty_like(input_gates)


# PyTorch has no meta kernels for the GRU cell
def _gru_meta(args, kwargs):
    input_gates, hx = args[0], args[2]
    b, h = hx.shape
    return torch.empty_like(hx), input_gates.new_empty((b, 5 * h))


def _gru_backward_meta(args, kwargs):
    grad_hy, has_bias = args[0], args[2] if len(args) > 2 else kwargs["has_bias"]
    b, h = grad_hy.shape
    gates = [grad_hy.new_empty((b, 3 * h)) for _ in range(2)]
    bias = [grad_hy.new_empty((3 * h,)) for _ in range(2)] if has_bias else [None, None]
    return gates[0], gates[1], torch.empty_like(grad_hy), *bias


@lowering(aten._thnn_fused_lstm_cell.default, family="misc", meta=_lstm_meta)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * cx + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default, family="misc")
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(workspace, 4, axis=1)
    tanh_cy = jnp.tanh(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else grad_hy
    gcy = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        gcy = gcy + grad_cy
    grad_gates = jnp.concatenate([
        gcy * g * i * (1 - i),
        gcy * cx * f * (1 - f),
        gcy * i * (1 - g * g),
        grad_hy * tanh_cy * o * (1 - o),
    ], axis=1)
    return grad_gates, gcy * f, (grad_gates.sum(0) if has_bias else None)


@lowering(aten._thnn_fused_gru_cell.default, family="misc", meta=_gru_meta)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, ii, inn = jnp.split(input_gates, 3, axis=1)
    hr, hi, hn = jnp.split(hidden_gates, 3, axis=1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(ii + hi)
    n = jnp.tanh(inn + r * hn)
    hy = n + z * (hx - n)
    return hy, jnp.concatenate([r, z, n, hx, hn], axis=1)


@lowering(aten._thnn_fused_gru_cell_backward.default, family="misc", meta=_gru_backward_meta)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = jnp.split(workspace, 5, axis=1)
    gn = grad_hy * (1 - z) * (1 - n * n)
    gz = grad_hy * (hx - n) * z * (1 - z)
    gr = gn * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([gr, gz, gn], axis=1)
    grad_hidden_gates = jnp.concatenate([gr, gz, gn * r], axis=1)
    bias = (grad_input_gates.sum(0), grad_hidden_gates.sum(0)) if has_bias else (None, None)
    return grad_input_gates, grad_hidden_gates, grad_hy * z, *bias
