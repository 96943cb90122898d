"""Split a foreach op's tensor lists at layer boundaries (DeferAndFuse only, deep models).

An optimizer step is a dozen `_foreach_*` calls over every parameter. Recorded as one node per
call, a 12-layer model's update is one program whose size, and XLA compile time, grow with the
number of parameters. Split at the boundaries where the parameters' shapes repeat (one layer's
parameters, then the next layer's), each layer's update becomes an independent chain of nodes
with the same structure as every other layer's; the fuser gives each its own group, and all of
them share one compiled program (fuser.py, cache.group_key). As with the fuser's blocks, a
list splits only where a layer's parameters repeat `fuse_block_repeats` times.

Strict and Debug keep one program per call: they run each op at once, and splitting would only
multiply launches.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import blocks
from .config import CONFIG

# Lists shorter than this are not split (an MLP's six parameters gain nothing).
MIN_LANES = 16

_CHUNKS: dict[tuple, list[tuple[int, int]] | None] = {}


def chunks(tensors) -> list[tuple[int, int]] | None:
    """[lo, hi) pieces of a tensor list: what precedes the repetition, one per repeated block,
    what follows; None when the list does not repeat."""
    if len(tensors) < MIN_LANES or not CONFIG.fuse_block_ops:
        return None
    try:  # a layout id stands for (size, stride, dtype) and is far cheaper to read than t.shape
        key = tuple([t._lid for t in tensors])
    except AttributeError:
        key = tuple([(t.shape, t.dtype) for t in tensors])
    try:
        return _CHUNKS[key]
    except KeyError:
        pass
    runs = blocks.repeats(key, 2, max(2, CONFIG.fuse_block_repeats))
    out = None
    if runs:
        best = max(runs, key=lambda r: r[1] * r[2])
        if best[1] * best[2] >= MIN_LANES // 2:
            out = [(lo, hi) for lo, hi, _ in blocks.segments(len(key), [best])]
    _CHUNKS[key] = out
    return out


# The fused optimizers' in-place kernels (`AdamW(fused=True)`): each of their lists holds one entry
# per parameter (or none), so they split like a foreach op. Their functional forms return several
# lists and are not split.
_FUSED_OPTIMIZERS = {"aten::_fused_adam_", "aten::_fused_adamw_", "aten::_fused_sgd_", "aten::_fused_adagrad_"}


def splittable(func) -> bool:
    """Functional and in-place foreach overloads whose list-like arguments are all lists."""
    if func.name() in _FUSED_OPTIMIZERS:
        return True
    if not func.name().startswith("aten::_foreach_"):
        return False
    schema = func._schema
    if not schema.arguments or not isinstance(schema.arguments[0].type, torch.ListType):
        return False  # _foreach_pow.ScalarAndTensor: a scalar first
    if any(a.is_out for a in schema.arguments):
        return False
    # `scalars` as a tensor (addcdiv.Tensor) holds one value per list element: not a list here
    return not any(a.name == "scalars" and not isinstance(a.type, torch.ListType) for a in schema.arguments)


def split_route(func, route: Callable, call) -> Callable:
    """`route` with its lists split at layer boundaries; `call.eager_now` (record.Call) keeps an
    op that runs at once whole."""
    lists = [k for k, a in enumerate(func._schema.arguments) if isinstance(a.type, torch.ListType)]

    def route_split(func, args, kwargs):
        cuts = None if call.eager_now else chunks(args[0])
        if cuts is None:
            return route(func, args, kwargs)
        outs = []
        for lo, hi in cuts:
            part = list(args)
            for k in lists:
                if k < len(part):
                    part[k] = part[k][lo:hi]
            out = route(func, tuple(part), kwargs)
            if out is not None:
                outs.extend(out)
        return outs if outs else None

    route_split.inner = route
    return route_split
