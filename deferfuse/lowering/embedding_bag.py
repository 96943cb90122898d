"""nn.EmbeddingBag: segment reductions over the gathered rows, forward and backward.

Bags are located in-program from `offsets` (a device tensor), so a step with a new batch of
bags records and replays like any other: no flush, no host copy. An index belongs to bag
`searchsorted(offsets, position) - 1`; with `include_last_offset` the last offset ends the last
bag and indices past it belong to no bag (CPU's kernel is inconsistent there: its sum ignores
them, its max takes them and its mean counts them). `padding_idx` entries contribute nothing and
are not counted. Empty bags give zeros.

The auxiliary outputs take CPU's shapes and values (PyTorch's meta kernel disagrees with CPU on
some of them), and the backward reads only `offsets`, so it never depends on which of them CPU
leaves empty. `scale_grad_by_freq` divides by each index's true frequency, as the CUDA kernel
does; CPU's divides some rows by another index's count (pytorch/pytorch#190063, fixed after 2.13).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..dtypes import compute_dtype
from .registry import aten, bound, lowering

SUM, MEAN, MAX = 0, 1, 2


def _bags(indices, offsets, n_bags: int, ends_last: bool, padding_idx: int):
    """Per index position: its bag, the segment it adds to (`n_bags`, dropped, where it is
    padding or in no bag) and whether it counts."""
    n = indices.shape[0]
    pos = jnp.arange(n)
    bag = jnp.searchsorted(offsets[:n_bags], pos, side="right") - 1
    inside = bag >= 0
    if ends_last:
        inside = inside & (pos < offsets[n_bags])
    counts = inside & (indices != padding_idx) if padding_idx >= 0 else inside
    return bag, jnp.where(counts, bag, n_bags), counts


def _meta(args, kwargs):
    """CPU's output shapes: offset2bag is empty for a sum without padding, bag_size has one entry
    per bag, max_indices one per bag (sum, mean) or per bag and column (max)."""
    v = bound(aten._embedding_bag.default, args, kwargs)
    weight, indices, offsets = v["weight"], v["indices"], v["offsets"]
    n_bags = offsets.shape[0] - int(v["include_last_offset"])
    mode = v["mode"]
    it = indices.dtype
    empty_o2b = mode == SUM and v["padding_idx"] < 0
    return (weight.new_empty((n_bags, weight.shape[1])),
            indices.new_empty((0 if empty_o2b else indices.shape[0],), dtype=it),
            indices.new_empty((n_bags,), dtype=it),
            indices.new_empty((n_bags, weight.shape[1]) if mode == MAX else (n_bags,), dtype=it))


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default, family="index", meta=_meta)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=SUM, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    n, d = indices.shape[0], weight.shape[1]
    n_bags = offsets.shape[0] - int(include_last_offset)
    it = indices.dtype
    o2b_shape = (0,) if mode == SUM and padding_idx < 0 else (n,)
    if n == 0 or n_bags == 0:
        zeros = jnp.zeros((n_bags,), it)
        return (jnp.zeros((n_bags, d), weight.dtype), jnp.zeros(o2b_shape, it), zeros,
                jnp.zeros((n_bags, d), it) if mode == MAX else zeros)
    bag, seg, counts = _bags(indices, offsets, n_bags, include_last_offset, padding_idx)
    rows = jnp.take(weight, indices, axis=0).astype(compute_dtype(weight.dtype))
    size = jax.ops.segment_sum(counts.astype(it), seg, n_bags)
    o2b = jnp.zeros(o2b_shape, it) if o2b_shape == (0,) else jnp.clip(bag, 0, n_bags - 1).astype(it)
    if mode == MAX:
        top = jax.ops.segment_max(jnp.where(counts[:, None], rows, -jnp.inf), seg, n_bags)
        empty = (size == 0)[:, None]
        # the first position holding each column's maximum, as CPU's strict comparison keeps
        at_top = counts[:, None] & (rows == top[jnp.minimum(seg, n_bags - 1)])
        first = jax.ops.segment_min(jnp.where(at_top, jnp.arange(n)[:, None], n), seg, n_bags)
        arg = jnp.where(empty, 0, indices[jnp.minimum(first, n - 1)]).astype(it)
        return jnp.where(empty, 0, top).astype(weight.dtype), o2b, size, arg
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(rows.dtype)[:, None]
    total = jax.ops.segment_sum(jnp.where(counts[:, None], rows, 0), seg, n_bags)
    if mode == MEAN:
        total = total / jnp.maximum(size, 1).astype(total.dtype)[:, None]
        return total.astype(weight.dtype), o2b, size, size
    return total.astype(weight.dtype), o2b, jnp.zeros((n_bags,), it), jnp.zeros((n_bags,), it)


def _dense(args, kwargs):
    return not bound(aten._embedding_bag_backward.default, args, kwargs)["sparse"]


@lowering(aten._embedding_bag_backward.default, family="index", supports=_dense)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    """The weight's gradient. `offsets` may still hold include_last_offset's final entry (the
    backward is not told): it ends the last bag, which is where the forward ended it."""
    n_bags, d = grad.shape
    cd = compute_dtype(grad.dtype)
    g = grad.astype(cd)
    if mode == MAX:
        live = (bag_size > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(d), (n_bags, d))
        gw = jnp.zeros((num_weights, d), cd).at[maximum_indices, cols].add(jnp.where(live, g, 0))
        return gw.astype(grad.dtype)
    _, seg, counts = _bags(indices, offsets, n_bags, offsets.shape[0] > n_bags, padding_idx)
    contrib = g[jnp.minimum(seg, n_bags - 1)]
    if per_sample_weights is not None:
        contrib = contrib * per_sample_weights.astype(cd)[:, None]
    if mode == MEAN:
        contrib = contrib / jnp.maximum(bag_size, 1).astype(cd)[jnp.minimum(seg, n_bags - 1)][:, None]
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), cd).at[indices].add(1)
        contrib = contrib / freq[indices][:, None]
    contrib = jnp.where(counts[:, None], contrib, 0)
    return jnp.zeros((num_weights, d), cd).at[indices].add(contrib).astype(grad.dtype)


@lowering(aten._embedding_bag_per_sample_weights_backward.default, family="index")
def per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """d(output)/d(per_sample_weights): each index's row dotted with its bag's gradient."""
    n_bags = grad.shape[0]
    _, seg, counts = _bags(indices, offsets, n_bags, offsets.shape[0] > n_bags, padding_idx)
    cd = compute_dtype(grad.dtype)
    rows = jnp.take(weight, indices, axis=0).astype(cd)
    dots = jnp.sum(rows * grad.astype(cd)[jnp.minimum(seg, n_bags - 1)], axis=1)
    return jnp.where(counts, dots, 0).astype(grad.dtype)
