"""The checks on values only the data can show, which CPU makes and CUDA does not: index ranges
(index_select, gather, scatter, embedding, index/index_put, take, index_add/copy/fill),
embedding_bag's offsets, multinomial's weights, class targets (nll_loss, cross_entropy),
binary_cross_entropy's probabilities, integer divisors (`//`, `%`, fmod) and one_hot's classes.

Each reads the data on the host before the op, so it costs a sync: Debug makes them, and
TORCH_TPU_ENABLE_DEBUG_CHECKS=1 (TorchTPU's name) makes Strict and DeferAndFuse make them too.
A failing check raises exactly the exception CPU PyTorch raises (obtained by running the op on
CPU), at the user's line. Without them, as on CUDA, Strict and DeferAndFuse clamp an index and
give a value for the rest.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..causes import Cause
from .. import pending
from ..config import CONFIG
from ..dtypes import is_floating
from ..probe import CLASS_TARGETS
from ..tensor import TpuTensor
from .active import current
from .base import EagerMode

aten = torch.ops.aten

# op -> (position of the indexed tensor, position of dim or None, position of index/indices)
_INDEXED = {
    aten.index_select.default: (0, 1, 2),
    aten.gather.default: (0, 1, 2),
    aten.scatter.src: (0, 1, 2),
    aten.scatter.value: (0, 1, 2),
    aten.scatter.reduce: (0, 1, 2),
    aten.scatter_.src: (0, 1, 2),
    aten.scatter_.value: (0, 1, 2),
    aten.scatter_add.default: (0, 1, 2),
    aten.scatter_add_.default: (0, 1, 2),
    aten.scatter_reduce.two: (0, 1, 2),
    aten.scatter_reduce_.two: (0, 1, 2),
    aten.embedding.default: (0, None, 1),
    aten._embedding_bag.default: (0, None, 1),
    aten._embedding_bag_forward_only.default: (0, None, 1),
    aten.take.default: (0, None, 1),
    aten.index.Tensor: (0, None, 1),
    aten.index_put.default: (0, None, 1),
    aten.index_put_.default: (0, None, 1),
    aten._unsafe_index.Tensor: (0, None, 1),
    aten._unsafe_index_put.default: (0, None, 1),
    aten.index_add.default: (0, 1, 2),
    aten.index_add_.default: (0, 1, 2),
    aten.index_copy.default: (0, 1, 2),
    aten.index_copy_.default: (0, 1, 2),
    aten.index_fill.int_Scalar: (0, 1, 2),
    aten.index_fill_.int_Scalar: (0, 1, 2),
}


_INDEX_WRITES = (aten.index_add.default, aten.index_add_.default, aten.index_copy.default, aten.index_copy_.default,
                 aten.index_fill.int_Scalar, aten.index_fill_.int_Scalar)
_EMBEDDINGS = (aten.embedding.default, aten._embedding_bag.default, aten._embedding_bag_forward_only.default)


def check(func, args, kwargs) -> None:
    """Before a top-level op: the data checks that apply to it."""
    spec = _INDEXED.get(func)
    if spec is not None:
        _check_indices(func, spec, args, kwargs)
        if func in _EMBEDDINGS[1:]:
            _check_offsets(func, args, kwargs)
    elif func is aten.multinomial.default:
        _check_weights(func, args, kwargs)
    elif func in CLASS_TARGETS:
        _check_targets(func, args, kwargs)
    elif func is aten.binary_cross_entropy.default:
        _check_probabilities(func, args, kwargs)
    elif func._overloadpacket.__name__ in _INT_DIVISIONS:
        _check_integer_divisor(func, args, kwargs)


def enabled() -> bool:
    """Whether the current mode makes the data checks (for the few made inside an op: one_hot)."""
    return CONFIG.debug_checks or current().kind is EagerMode.DEBUG


def _check_indices(func, spec, args, kwargs) -> None:
    src_pos, dim_pos, idx_pos = spec
    if len(args) <= idx_pos:
        return
    src, idx = args[src_pos], args[idx_pos]
    if not isinstance(src, torch.Tensor):
        return
    if src.numel() == 0 and func in _INDEX_WRITES:
        return  # CPU writes nothing into an empty target and checks no index (fuzzer seed 1256)
    if dim_pos is None:
        if func in _EMBEDDINGS:
            pairs = [(idx, src.shape[0])]
        elif func is aten.take.default:
            pairs = [(idx, src.numel())]
        else:
            pairs = [(ix, src.shape[d]) for d, ix in enumerate(idx) if ix is not None]
    else:
        dim = args[dim_pos]
        dim = dim + src.dim() if dim < 0 else dim
        if not 0 <= dim < max(src.dim(), 1):
            return  # a dim out of range: the op itself raises CPU's IndexError for it
        pairs = [(idx, src.shape[dim] if src.dim() else 1)]
    for ix, n in pairs:
        if not isinstance(ix, torch.Tensor) or ix.dtype == torch.bool or ix.numel() == 0:
            continue
        v = pending.concrete(ix, Cause.DEBUG_OP, None) if isinstance(ix, TpuTensor) else jnp.asarray(ix.numpy())
        lo, hi = int(jnp.min(v)), int(jnp.max(v))
        if lo < 0 or hi >= n:
            _raise_like_cpu(func, args, kwargs, f"index {hi if hi >= n else lo} is out of bounds for size {n}")


def _check_targets(func, args, kwargs) -> None:
    """nll_loss's targets (cross_entropy's): each a class in [0, C), or ignore_index."""
    x, target = args[0], args[1]
    ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
    if not isinstance(target, TpuTensor) or target.numel() == 0:
        return
    n_classes = x.shape[1] if x.dim() >= 2 else x.shape[0]
    v = pending.concrete(target, Cause.DEBUG_OP, None)
    counted = v != ignore
    if bool(((v < 0) & counted).any()) or bool(((v >= n_classes) & counted).any()):
        _raise_like_cpu(func, args, kwargs, "target out of bounds")


def _check_probabilities(func, args, kwargs) -> None:
    """binary_cross_entropy's input: probabilities, which CPU checks (a logit passed by mistake
    gives NaN or a clamped loss elsewhere)."""
    x = args[0]
    if not isinstance(x, TpuTensor) or x.numel() == 0:
        return
    v = pending.concrete(x, Cause.DEBUG_OP, None)
    if bool(((v < 0) | (v > 1)).any()):
        _raise_like_cpu(func, args, kwargs, "all elements of input should be between 0 and 1", RuntimeError)


def _check_weights(func, args, kwargs) -> None:
    """multinomial's weights: CPU rejects negative or non-finite ones and a row summing to zero."""
    w = args[0]
    if not isinstance(w, TpuTensor) or w.numel() == 0:
        return
    v = pending.concrete(w, Cause.DEBUG_OP, None).astype(jnp.float32)
    if not bool(jnp.isfinite(v).all()) or bool((v < 0).any()) or bool((v.sum(-1) <= 0).any()):
        _raise_like_cpu(func, args, kwargs, "invalid multinomial distribution", RuntimeError)


# Ops that divide, by overload packet. On integers CPU raises RuntimeError("ZeroDivisionError")
# for a zero divisor; XLA, like CUDA, returns a value.
_INT_DIVISIONS = {"floor_divide", "floor_divide_", "div", "div_", "remainder", "remainder_", "fmod", "fmod_"}


def _check_integer_divisor(func, args, kwargs) -> None:
    """An integer division (`//`, `%`, fmod, div with a rounding mode) by a zero."""
    if len(args) < 2:
        return
    name = func._overloadpacket.__name__
    if name.startswith("div") and kwargs.get("rounding_mode") is None:  # keyword-only in every div
        return  # true division: a float result, inf or nan as on CPU
    for x in (args[0], args[1]):
        if type(x) in (float, complex) or (isinstance(x, torch.Tensor) and is_floating(x.dtype)):
            return  # a floating result: no error on CPU either
        if isinstance(x, torch.Tensor) and x.numel() == 0:
            return  # nothing to divide: CPU's loop never runs (`torch.arange(0) // 0`)
    d = args[1]
    if isinstance(d, TpuTensor):
        zero = d.numel() > 0 and bool((pending.concrete(d, Cause.DEBUG_OP, None) == 0).any())
    elif isinstance(d, torch.Tensor):
        zero = bool((d == 0).any())
    else:
        zero = d == 0
    if zero:
        _raise_like_cpu(func, args, kwargs, "ZeroDivisionError", RuntimeError)


def _check_offsets(func, args, kwargs) -> None:
    """embedding_bag's offsets: CPU requires them to start at 0, not decrease and not pass the
    end of the indices."""
    idx, offsets = args[1], args[2]
    if not isinstance(offsets, TpuTensor) or offsets.numel() == 0:
        return
    v = pending.concrete(offsets, Cause.DEBUG_OP, None)
    if int(v[0]) != 0 or bool((v[1:] < v[:-1]).any()) or int(v[-1]) > idx.numel():
        _raise_like_cpu(func, args, kwargs, "invalid embedding_bag offsets", RuntimeError)


def _one_hot(self, num_classes=-1):
    """F.one_hot. PyTorch's composite checks the classes only on CPU (CUDA relies on a device
    assert in its scatter), so on tpu out-of-range classes gave garbage: Debug checks them and
    raises CPU's error. Computed as the composite does, a comparison with arange."""
    if self.dtype != torch.int64 or self.numel() == 0:  # CPU's own checks, or an empty result
        return aten.one_hot.default(torch.empty(self.shape, dtype=self.dtype), num_classes).to(self.device)
    if num_classes == -1:
        num_classes = int(self.max().item()) + 1  # a sync, on every device
    if enabled():
        v = pending.concrete(self, Cause.DEBUG_OP, None)
        if int(v.min()) < 0 or int(v.max()) >= num_classes:
            _raise_like_cpu(aten.one_hot.default, (self, num_classes), {}, "one_hot: class out of range", RuntimeError)
    # contiguous, as CPU's result is (a transposed input made a transposed result)
    return (self.unsqueeze(-1) == torch.arange(num_classes, device=self.device)).to(torch.int64).contiguous()


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("one_hot", _one_hot, "AutogradPrivateUse1")


def _raise_like_cpu(func, args, kwargs, fallback_msg: str, exc: type = IndexError) -> None:
    """Raise what CPU PyTorch raises for this call (same type, same message)."""

    def cpu(x):
        if isinstance(x, TpuTensor):
            return x.detach().cpu()
        if isinstance(x, (list, tuple)):
            return type(x)(cpu(y) for y in x)
        return x

    try:
        func(*cpu(args), **{k: cpu(v) for k, v in kwargs.items()})
    except (IndexError, RuntimeError, ValueError) as e:
        raise type(e)(str(e)) from None
    if func in (aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten.index_put_.default,
                aten.take.default, aten.index_fill.int_Scalar, aten.index_fill_.int_Scalar):
        # negative indices wrap on CPU for advanced indexing, take and index_fill; nothing to report
        return
    raise exc(fallback_msg)
