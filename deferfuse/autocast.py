"""`torch.autocast("tpu", dtype=torch.bfloat16)`: CUDA's autocast policy for tpu tensors.

PyTorch reaches a backend's autocast rules through the AutocastPrivateUse1 dispatch key and
registers none for it, so every op inside an autocast block used to fail there. A user who
changes "cuda" to "tpu" expects what CUDA autocast does, so the op lists below are CUDA's
(aten/src/ATen/autocast_mode.cpp): matmuls and convolutions run in the autocast dtype, ops that
lose accuracy in it (exp, log, norms, softmax, losses, reductions) in float32, and ops mixing
dtypes (cat, stack, addcmul) in the widest one. Every other op falls through untouched.

Like CUDA, only floating tensors other than float64 are cast, casts are ordinary recorded ops
(autograd sees them, so gradients come back in each parameter's own dtype), and an op with an
explicit `dtype=` keeps it.
"""
from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_EXCLUDE = torch._C.DispatchKeySet(_KEY)
_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)

LOWER_PRECISION = [
    "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "_convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "scaled_dot_product_attention",
]
FLOAT32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "sum", "sum.dim_IntList", "norm.Scalar", "norm.ScalarOpt_dim",
]
PROMOTE = [
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "tensordot", "scatter_add", "stack", "cat",
]


def _is_castable(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "tpu" and x.dtype in _CASTABLE


def _cast(tree, dtype):
    return tree_map(lambda x: x.to(dtype) if _is_castable(x) and x.dtype != dtype else x, tree)


def _rule(op, policy: str):
    def kernel(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype("tpu")
        elif policy == "float32":
            # only lower-precision inputs move up; an explicit dtype= wins, as in CUDA's rule
            dtype = None if kwargs.get("dtype") is not None else torch.float32
        else:
            dts = [x.dtype for x in tree_leaves((args, kwargs)) if _is_castable(x)]
            dtype = functools.reduce(torch.promote_types, dts) if dts else None  # fp16 + bf16: fp32
        if dtype is not None:
            args, kwargs = _cast((args, kwargs), dtype)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)

    return kernel


_lib = None


def register() -> None:
    """Install the rules once, when the tpu device is registered."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("_", "IMPL")
    _lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    rules = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER_PRECISION, "lower"), (FLOAT32, "float32"), (PROMOTE, "promote")):
        for name in names:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(aten, packet, None), overload or "default", None)
            if op is not None:
                rules.impl(name, _rule(op, policy), "AutocastPrivateUse1")
    _lib.rules = rules  # keep the registrations alive
