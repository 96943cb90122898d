"""scaled_dot_product_attention as one node forward and one node backward.

`F.scaled_dot_product_attention` is CompositeImplicitAutograd: on a device without a fused kernel
PyTorch expands it above the dispatcher into ~15 ops, and autograd records ~20 more for the
backward, per layer per step. Here it is claimed at its autograd key for "tpu" tensors: a custom
`torch.autograd.Function` calls two ops of our own, `deferfuse::sdpa` and `deferfuse::sdpa_backward`,
each lowered to JAX (the backward is the VJP of the forward, so they cannot drift apart).

The math is PyTorch's math path: softmax(q kᵀ · scale + mask) v, with `is_causal` as a
lower-triangular mask aligned top-left, boolean masks as -inf, float masks added (and
differentiated when they require grad), `enable_gqa` repeating each key/value head for its group
of query heads, and PyTorch's safe softmax: a fully masked row gives zeros. Calls with dropout go to PyTorch's own decomposition (their mask
must be shared between forward and backward), as do nested or non-"tpu" calls. The autograd
side, the claim of `aten::scaled_dot_product_attention` and the CPU kernel of `deferfuse::sdpa`
are in `claims/attention.py`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from ..dtypes import compute_dtype
from .registry import bound, lowering

LIBRARY = torch.library.Library("deferfuse", "DEF")  # deferfuse::sdpa and its backward
LIBRARY.define(
    "sdpa(Tensor q, Tensor k, Tensor v, Tensor? mask, bool causal, float? scale, bool gqa) -> Tensor"
)
LIBRARY.define(
    "sdpa_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? mask, bool causal, float? scale, bool gqa,"
    " bool mask_grad) -> (Tensor, Tensor, Tensor, Tensor)"
)
SDPA = torch.ops.deferfuse.sdpa.default
SDPA_BACKWARD = torch.ops.deferfuse.sdpa_backward.default


def _keys_like_queries(q, k):
    """k's shape with its heads (dim -3) repeated as `enable_gqa` repeats them for q's."""
    if k.dim() < 3 or k.shape[-3] == q.shape[-3]:
        return tuple(k.shape)
    if q.dim() < 3 or q.shape[-3] % k.shape[-3]:
        raise RuntimeError("Number of heads in key and value must divide the number of heads in query")
    return tuple(k.shape[:-3]) + (q.shape[-3],) + tuple(k.shape[-2:])


@torch.library.register_fake("deferfuse::sdpa")
def _sdpa_fake(q, k, v, mask, causal, scale, gqa):
    ks, vs = (_keys_like_queries(q, t) if gqa else tuple(t.shape) for t in (k, v))
    if q.shape[-1] != ks[-1] or ks[-2] != vs[-2]:
        raise RuntimeError("scaled_dot_product_attention: query, key and value do not fit together")
    batch = torch.broadcast_shapes(q.shape[:-2], ks[:-2], vs[:-2])
    return q.new_empty(tuple(batch) + (q.shape[-2], v.shape[-1]))


@torch.library.register_fake("deferfuse::sdpa_backward")
def _sdpa_backward_fake(grad, q, k, v, mask, causal, scale, gqa, mask_grad):
    gmask = mask.new_empty(mask.shape) if mask_grad else q.new_empty((0,))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gmask



def _attend(q, k, v, mask, causal, scale, gqa):
    dt = q.dtype
    up = compute_dtype(dt)
    q, k, v = q.astype(up), k.astype(up), v.astype(up)
    if gqa and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = jnp.repeat(k, rep, axis=-3)
        v = jnp.repeat(v, rep, axis=-3)
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * s
    L, S = q.shape[-2], k.shape[-2]
    if causal:
        keep = jnp.tril(jnp.ones((L, S), jnp.bool_))
        scores = jnp.where(keep, scores, -jnp.inf)
    if mask is not None:
        if mask.dtype == jnp.bool_:
            scores = jnp.where(mask, scores, -jnp.inf)
        else:
            scores = scores + mask.astype(up)
    # PyTorch's safe softmax: a query whose every key is masked (a left-padded row) attends to
    # nothing and gives zeros, not NaN. The scores of such a row are replaced before the softmax
    # too, so that its gradient is zero rather than 0 * NaN.
    dead = jnp.all(scores == -jnp.inf, axis=-1, keepdims=True)
    probs = jax.nn.softmax(jnp.where(dead, 0.0, scores), axis=-1)
    probs = jnp.where(dead, 0.0, probs)
    return jnp.matmul(probs, v).astype(dt)


@lowering(SDPA, family="matmul")
def sdpa(q, k, v, mask, causal, scale, gqa):
    return _attend(q, k, v, mask, causal, scale, gqa)


@lowering(SDPA_BACKWARD, family="matmul")
def sdpa_backward(grad, q, k, v, mask, causal, scale, gqa, mask_grad):
    if not mask_grad:
        _, vjp = jax.vjp(lambda a, b, c: _attend(a, b, c, mask, causal, scale, gqa), q, k, v)
        return (*vjp(grad.astype(q.dtype)), jnp.zeros((0,), q.dtype))
    # a float mask that requires grad (T5's learned position bias): its gradient is that of
    # the scores, summed over the dims it was broadcast along, which the VJP of the addition does
    _, vjp = jax.vjp(lambda a, b, c, m: _attend(a, b, c, m, causal, scale, gqa), q, k, v, mask)
    return vjp(grad.astype(q.dtype))


# --- the inference fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer ------------


_MHA = torch.ops.aten._native_multi_head_attention.default
_ENCODER_LAYER = torch.ops.aten._transformer_encoder_layer_fwd.default


def _mha_supported(args, kwargs):
    """Query/key/value of one shape and a mask with its type given, as CPU's kernel requires;
    anything else runs there and raises as CPU does."""
    a = bound(_MHA, args, kwargs)
    same = a["query"].shape == a["key"].shape == a["value"].shape
    return same and (a["mask"] is None or a["mask_type"] in (0, 1, 2))


def _mha_meta(args, kwargs):
    # PyTorch's meta gives an empty tensor for unrequested weights; CPU's kernel returns None
    out, weights = _MHA(*args, **kwargs)
    return out, (weights if bound(_MHA, args, kwargs)["need_weights"] else None)


def _mha(query, key, value, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type, up):
    """(output, attention probabilities per head), computed in `up`."""
    b, n, e = query.shape
    dh = e // num_head
    wq, wk, wv = jnp.split(qkv_weight.astype(up), 3)
    bq, bk, bv = jnp.split(qkv_bias.astype(up), 3)

    def heads(x, w, bias):
        return (x.astype(up) @ w.T + bias).reshape(b, -1, num_head, dh).transpose(0, 2, 1, 3)

    q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
    scores = (q / jnp.sqrt(jnp.asarray(dh, up))) @ k.transpose(0, 1, 3, 2)
    if mask is not None:
        # CPU's kernel masks out where the mask is true or, for the float masks MultiheadAttention
        # passes (0 and -inf), nonzero; a fully masked row is NaN there too
        m = mask != 0
        m = m[:, None, None, :] if mask_type == 1 else m
        scores = jnp.where(m, -jnp.inf, scores)
    attn = jax.nn.softmax(scores, axis=-1)
    out = (attn @ v).transpose(0, 2, 1, 3).reshape(b, n, e) @ proj_weight.astype(up).T + proj_bias.astype(up)
    return out, attn


@lowering(_MHA, family="matmul", supports=_mha_supported, meta=_mha_meta)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    out, attn = _mha(query, key, value, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type,
                     compute_dtype(query.dtype))
    if not need_weights:
        return out, None
    return out, attn.mean(axis=1) if average_attn_weights else attn


def _encoder_layer_supported(args, kwargs):
    a = bound(_ENCODER_LAYER, args, kwargs)
    return a["mask"] is None or a["mask_type"] in (0, 1, 2)


@lowering(_ENCODER_LAYER, family="matmul", supports=_encoder_layer_supported, static=("eps",))
def transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                              norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                              ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's inference fast path, in the order of CPU's kernel."""
    up = compute_dtype(src.dtype)

    def norm(x, w, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + eps) * w.astype(up) + b.astype(up)

    src = src.astype(up)
    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _mha(x, x, x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type, up)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    y = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    y = y @ ffn_weight_1.astype(up).T + ffn_bias_1.astype(up)
    y = jax.nn.gelu(y, approximate=False) if use_gelu else jax.nn.relu(y)
    x = x + y @ ffn_weight_2.astype(up).T + ffn_bias_2.astype(up)
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)
