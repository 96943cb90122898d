"""Neural-network ops: softmax, normalisations, convolution, pooling.

Normalisation statistics are computed in float32 for half inputs, as CPU PyTorch does. Backward
ops without a PyTorch decomposition are lowered as the VJP of the forward lowering, so forward and
backward cannot drift apart.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..dtypes import up_half as _up
from ..meta import flatten_outputs, meta_args
from ..views import contiguous_strides
from .registry import aten, bound, lowering


def _dim_in_range(args, kwargs, leaves):
    """CPU's softmax refuses a dim out of range with an IndexError; the meta kernels wrap it
    (`softmax(vector, 2)`: fuzzer seed 1812). Raises PyTorch's own error."""
    torch._prims_common.canonicalize_dim(args[0].dim(), args[1])
    return leaves


@lowering(aten._softmax.default, family="norm", meta_fix=_dim_in_range)
def softmax(x, dim, half_to_float):
    if x.ndim == 0:  # a single element: 1, or NaN for a non-finite one, as CPU (seed 7227)
        return jax.nn.softmax(_up(x).reshape(1), axis=0).reshape(())
    return jax.nn.softmax(_up(x), axis=dim % x.ndim)


@lowering(aten._log_softmax.default, family="norm", meta_fix=_dim_in_range)
def log_softmax(x, dim, half_to_float):
    if x.ndim == 0:
        return jax.nn.log_softmax(_up(x).reshape(1), axis=0).reshape(())
    return jax.nn.log_softmax(_up(x), axis=dim % x.ndim)


def _stats_in_input_dtype(args, kwargs, leaves):
    """CPU PyTorch returns half-precision mean/rstd for half inputs; the meta kernel says float32."""
    dtype = args[0].dtype
    return [leaves[0]] + [m.to(dtype) if m.dtype != dtype and m.dtype.is_floating_point else m for m in leaves[1:3]] \
        + list(leaves[3:])


@lowering(aten.native_layer_norm.default, family="norm", meta_fix=_stats_in_input_dtype)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axis = x.ndim - len(normalized_shape)
    axes = tuple(range(axis, x.ndim))
    xf = _up(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    centered = xf - mean
    var = jnp.mean(centered * centered, axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lowering(aten.native_group_norm.default, family="norm")
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    """The group size is spelled out: reshape's -1 cannot be inferred for an empty batch."""
    xf = _up(x).reshape(N, group, (C // group) * HxW)
    mean = jnp.mean(xf, axis=-1)
    centered = xf - mean[..., None]
    var = jnp.mean(centered * centered, axis=-1)
    rstd = lax.rsqrt(var + eps)
    out = (centered * rstd[..., None]).reshape(x.shape)
    bshape = (1, C) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(bshape)
    if bias is not None:
        out = out + bias.reshape(bshape)
    return out, mean, rstd


def _bn_stats(xf):
    axes = (0,) + tuple(range(2, xf.ndim))
    mean = jnp.mean(xf, axis=axes)
    bshape = (1, -1) + (1,) * (xf.ndim - 2)
    var = jnp.mean(jnp.square(xf - mean.reshape(bshape)), axis=axes)
    return mean, var, axes, bshape


@lowering(aten._native_batch_norm_legit_functional.default, family="norm")
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    xf = _up(x)
    n = x.size // x.shape[1] if x.ndim > 1 else x.size
    if training:
        mean, var, axes, bshape = _bn_stats(xf)
        rstd = lax.rsqrt(var + eps)
        new_mean = running_mean * (1 - momentum) + mean * momentum
        new_var = running_var * (1 - momentum) + var * (n / max(n - 1, 1)) * momentum
    else:
        bshape = (1, -1) + (1,) * (xf.ndim - 2)
        mean, rstd = running_mean, lax.rsqrt(running_var + eps)
        new_mean, new_var = running_mean, running_var
    out = (xf - mean.reshape(bshape)) * rstd.reshape(bshape)
    if weight is not None:
        out = out * weight.reshape(bshape)
    if bias is not None:
        out = out + bias.reshape(bshape)
    save_mean = mean if training else jnp.zeros((0,), xf.dtype)
    save_rstd = rstd if training else jnp.zeros((0,), xf.dtype)
    return out, save_mean, save_rstd, new_mean, new_var


def _no_saved_stats(args, kwargs, leaves):
    """Outside training CPU saves no statistics for backward: its save_mean and save_invstd are
    empty, in the parameters' dtype. PyTorch's meta kernels say [C]."""
    empty = torch.empty((0,), dtype=args[3].dtype, device="meta")  # running_mean's
    return [leaves[0], empty, empty]


@lowering(aten._native_batch_norm_legit_no_training.default, family="norm", meta_fix=_no_saved_stats)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    out, _, _, _, _ = batch_norm_functional(x, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, jnp.zeros((0,), out.dtype), jnp.zeros((0,), out.dtype)


def _eval_with_running_stats(args, kwargs):
    """Training updates the running statistics in place, which PyTorch's decomposition does
    (routes/lowered.py takes it for calls outside `supports`)."""
    a = bound(aten.native_batch_norm.default, args, kwargs)
    return not a["training"] and a["running_mean"] is not None and a["running_var"] is not None


@lowering(aten.native_batch_norm.default, family="norm", supports=_eval_with_running_stats, meta_fix=_no_saved_stats)
def native_batch_norm_eval(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps)


# --- convolution -----------------------------------------------------------------------------------

_DN = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"), 3: ("NCDHW", "OIDHW", "NCDHW")}


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nd = x.ndim - 2
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    if len(stride) == 1 and nd > 1:
        stride = stride * nd
    if len(padding) == 1 and nd > 1:
        padding = padding * nd
    if len(dilation) == 1 and nd > 1:
        dilation = dilation * nd
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=_DN[nd], feature_group_count=groups,
        )
    # transposed conv = the gradient of a conv: dilate the input by the stride, flip the kernel,
    # swap its in/out channels within each group
    cin, cout_g = w.shape[0], w.shape[1]
    k = w.shape[2:]
    wg = w.reshape((groups, cin // groups, cout_g) + k)
    wg = jnp.swapaxes(wg, 1, 2).reshape((groups * cout_g, cin // groups) + k)
    wg = jnp.flip(wg, axis=tuple(range(2, 2 + nd)))
    op = list(output_padding) if output_padding else [0] * nd
    if len(op) == 1 and nd > 1:
        op = op * nd
    pads = [(dilation[i] * (k[i] - 1) - padding[i], dilation[i] * (k[i] - 1) - padding[i] + op[i]) for i in range(nd)]
    return lax.conv_general_dilated(
        x, wg, window_strides=[1] * nd, padding=pads, lhs_dilation=stride, rhs_dilation=dilation,
        dimension_numbers=_DN[nd], feature_group_count=groups,
    )


def _cpu_conv_layout(func):
    """The meta kernel leaves convolution outputs contiguous (a meta tensor cannot say which
    backend would run), while CPU's backend writes channels_last outputs for a channels_last
    input, weight or gradient, which the next batch_norm and relu keep. The call is rehearsed
    on fake CPU tensors, which make that choice as CPU does, allocating nothing. Contiguous
    arguments always give contiguous outputs, so they skip it (by their exact strides: a weight
    with one input channel per group is contiguous and channels_last at once, and CPU reads
    which one from the stride of that size-1 dim)."""
    def fix(args, kwargs, leaves):
        margs, mkwargs = meta_args(args, kwargs)
        tensors = [a for a in (*margs, *mkwargs.values()) if isinstance(a, torch.Tensor)]
        if all(tuple(t.stride()) == contiguous_strides(t.shape) for t in tensors):
            return leaves
        from torch._subclasses.fake_tensor import FakeTensorMode

        def fake(x):
            if isinstance(x, torch.Tensor):
                return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")
            return x

        try:
            with FakeTensorMode():
                out = func(*[fake(a) for a in margs], **{k: fake(v) for k, v in mkwargs.items()})
                cpu, _ = flatten_outputs(out)
                strides = [c.stride() for c in cpu]
        except Exception:  # noqa: BLE001 - a call CPU refuses keeps the meta kernel's layout
            return leaves
        return [torch.empty_strided(m.shape, s, dtype=m.dtype, device="meta") for m, s in zip(leaves, strides)]

    return fix


@lowering(aten.convolution.default, family="conv", promote="default", promote_args=("input", "weight", "bias"),
          meta_fix=_cpu_conv_layout(aten.convolution.default))
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


@lowering(aten.convolution_backward.default, family="conv", meta_fix=_cpu_conv_layout(aten.convolution_backward.default))
def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    def fwd(xx, ww):
        return _conv(xx, ww, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(fwd, x, w)
    gx, gw = vjp(grad.astype(x.dtype))
    gb = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim))) if output_mask[2] else None
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


# --- backward ops lowered as one node each ------------------------------------------------------------
# PyTorch's decompositions of these expand into 10-30 small ops per call; a training step calls
# them for every layer, so one node each keeps recording cheap. The maths is the same formula.


@lowering(aten.native_layer_norm_backward.default, family="norm")
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axis = x.ndim - len(normalized_shape)
    axes = tuple(range(axis, x.ndim))
    xf, gf = _up(x), _up(grad)
    xhat = (xf - mean) * rstd
    g = gf * weight if weight is not None else gf
    n = 1
    for d in normalized_shape:
        n *= d
    gi = None
    if output_mask[0]:
        gi = rstd * (g - jnp.mean(g, axis=axes, keepdims=True) - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))
        if n == 0:
            gi = jnp.zeros_like(xf)
    lead = tuple(range(axis))
    gw = jnp.sum(gf * xhat, axis=lead) if (output_mask[1] and weight is not None) else None
    gb = jnp.sum(gf, axis=lead) if (output_mask[2] and bias is not None) else None
    return gi, gw, gb


@lowering(aten._softmax_backward_data.default, family="norm")
def softmax_backward(grad, out, dim, input_dtype):
    g, o = _up(grad), _up(out)
    if o.ndim == 0:
        return jnp.zeros_like(g)
    return o * (g - jnp.sum(g * o, axis=dim % o.ndim, keepdims=True))


@lowering(aten._log_softmax_backward_data.default, family="norm")
def log_softmax_backward(grad, out, dim, input_dtype):
    g, o = _up(grad), _up(out)
    if o.ndim == 0:
        return jnp.zeros_like(g)
    return g - jnp.exp(o) * jnp.sum(g, axis=dim % o.ndim, keepdims=True)


def _nll_pick(x, target, weight, ignore_index):
    """Per-element -w[t] * x[n, t, ...] and w[t], zero where target == ignore_index."""
    cls_axis = 1 if x.ndim >= 2 else 0
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    if x.ndim == 1:
        picked = x[safe]
    else:
        picked = jnp.take_along_axis(x, jnp.expand_dims(safe, cls_axis), axis=cls_axis).squeeze(cls_axis)
    w = weight[safe] if weight is not None else jnp.ones(safe.shape, x.dtype)
    w = jnp.where(valid, w, 0).astype(x.dtype)
    return -picked * w, w


@lowering(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, family="loss")
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    losses, w = _nll_pick(x, target, weight, ignore_index)
    total = jnp.sum(w)
    if reduction == 0:  # none
        return losses, jnp.zeros((), x.dtype)
    if reduction == 1:  # mean
        return jnp.sum(losses) / total, total
    return jnp.sum(losses), total


@lowering(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default, family="loss")
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    """The vjp of the forward, except that an ignored target's row gets exactly zero, as on CPU:
    when every target is ignored, the mean's 1/total is infinite and would make it NaN (a row
    that counts with weight zero does get CPU's NaN, -0/0)."""
    def loss(v):
        losses, w = _nll_pick(v, target, weight, ignore_index)
        if reduction == 0:
            return losses
        if reduction == 1:
            scale = jnp.where(target != ignore_index, 1 / jnp.sum(w), 0).astype(losses.dtype)
            return jnp.sum(losses * lax.stop_gradient(scale))
        return jnp.sum(losses)

    _, vjp = jax.vjp(loss, x)
    return vjp(grad.astype(x.dtype))[0]


@lowering(aten.embedding_dense_backward.default, family="index")
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat_idx = indices.reshape(-1)
    g = grad.reshape(flat_idx.shape[0], -1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat_idx].add(1)
        g = g / counts[flat_idx][:, None]
    if padding_idx >= 0:
        g = jnp.where((flat_idx == padding_idx)[:, None], 0, g)
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[flat_idx].add(g)


@lowering(aten._weight_norm_interface_backward.default, family="norm")
def weight_norm_backward(grad_w, v, g, norms, dim):
    """Gradients of w = v * g / ||v|| (the norm over every dim but `dim`; over all of v for -1)
    through JAX's vjp of that formula, in float32 for half types as CPU's kernel computes. The
    saved norms are recomputed inside the program rather than read."""
    keep = () if dim == -1 else (dim % v.ndim,)
    axes = tuple(a for a in range(v.ndim) if a not in keep)

    def w(v32, g32):
        return v32 * (g32 / jnp.sqrt(jnp.sum(v32 * v32, axis=axes, keepdims=True)))

    _, vjp = jax.vjp(w, _up(v), _up(g))
    gv, gg = vjp(_up(grad_w))
    return gv.astype(v.dtype), gg.astype(g.dtype)


def _multilabel_margin_meta(args, kwargs):
    # PyTorch's meta kernel gives a 1-d input's unreduced loss shape (1,); CPU gives ()
    x, reduction = args[0], args[2] if len(args) > 2 else kwargs["reduction"]
    out = x.shape[:-1] if reduction == 0 and x.ndim > 1 else ()
    return x.new_empty(out), x.new_empty(x.shape)


@lowering(aten.multilabel_margin_loss_forward.default, family="loss", meta=_multilabel_margin_meta)
def multilabel_margin_loss_forward(x, target, reduction):
    """Each sample's targets are its target entries up to the first -1. PyTorch 2.13's
    decomposition also counts entries after that -1 (pytorch/pytorch#185464), so it is not used."""
    x2 = x.reshape(1, -1) if x.ndim <= 1 else x
    t2 = target.reshape(x2.shape)
    c = x2.shape[1]
    valid = jnp.cumprod(t2 != -1, axis=1).astype(bool)  # entries before the first -1
    safe = jnp.where(valid, t2, 0)
    is_target = jnp.zeros(x2.shape, bool).at[jnp.arange(x2.shape[0])[:, None], safe].max(valid)
    picked = jnp.take_along_axis(x2, safe, axis=1)  # x[t_j]
    margins = jnp.maximum(0, 1 - picked[:, :, None] + x2[:, None, :])  # [n, j, i]
    keep = valid[:, :, None] & ~is_target[:, None, :]
    loss = jnp.sum(jnp.where(keep, margins, 0), axis=(1, 2)) / c
    is_target = is_target.astype(x.dtype).reshape(x.shape)
    if reduction == 0:
        return loss.reshape(x.shape[:-1]) if x.ndim > 1 else loss.reshape(()), is_target
    total = jnp.sum(loss)
    return (total / loss.shape[0] if reduction == 1 else total).astype(x.dtype), is_target


# F.ctc_loss with the lengths as CPU tensors, as CUDA code passes them (cuDNN wants them there):
# PyTorch's composite divides the tpu loss by the CPU target lengths for reduction="mean", which
# no device allows. CPU lengths are host data already, so they go to the int-list overload.
_ctc_composite = aten.ctc_loss.Tensor


def _ctc_loss_tensor_lengths(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1,
                             zero_infinity=False):
    lengths = (input_lengths, target_lengths)
    if all(t.device.type == "cpu" and not t.is_floating_point() and not t.is_complex() for t in lengths):
        return aten.ctc_loss.IntList(log_probs, targets, input_lengths.tolist(), target_lengths.tolist(), blank,
                                     reduction, zero_infinity)
    return _ctc_composite.decompose(log_probs, targets, input_lengths, target_lengths, blank, reduction,
                                    zero_infinity)


_impl = torch.library.Library("aten", "IMPL")
_impl.impl("ctc_loss.Tensor", _ctc_loss_tensor_lengths, "AutogradPrivateUse1")
