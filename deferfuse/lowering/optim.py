"""PyTorch's fused optimizer kernels: `Adam`, `AdamW`, `SGD` and `Adagrad` with `fused=True`.

A fused step is one ATen call over every parameter, where the default (foreach) step is a dozen
calls and the Python between them, and its step counters stay on the device, where the foreach
step reads each one on the host. The in-place kernels (`_fused_adamw_`) reach these functional
forms through dispatch's mutation route, which writes each returned list into the argument it
replaces; lanes.py splits them per layer like the foreach ops.

The math follows PyTorch's CPU kernels: bias corrections and the learning rate in float64, the
update in the parameter's dtype (float32 for half types). A `found_inf` of 1 (a skipped AMP step)
leaves every tensor as it was; `grad_scale` unscales the gradients and writes them back. The
learning rate and the betas are runtime inputs, so a scheduler never recompiles; weight decay and
momentum decide the kernel's structure and are part of its key, as are the flags.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..dtypes import compute_dtype
from .registry import aten, lowering

_F64 = jnp.float64


def _lists_meta(n_out):
    """A meta kernel (PyTorch lacks some for these functional forms): fresh copies of the leading
    list arguments, one per list returned."""
    def meta(args, kwargs):
        return tuple([torch.empty_like(t) for t in ts] for ts in args[:n_out])

    return meta


def _skip(found_inf, old, new):
    """The value to write: `new`, unless the step is skipped (found_inf == 1)."""
    if found_inf is None:
        return new
    return jnp.where(found_inf.reshape(()) == 1, old, new.astype(old.dtype))


def _grad(g, ct, grad_scale, maximize):
    """(gradient the update uses, gradient written back)."""
    g32 = g.astype(ct)
    if grad_scale is not None:
        g32 = g32 / grad_scale.reshape(()).astype(ct)
        back = g32.astype(g.dtype)
    else:
        back = g
    return (-g32 if maximize else g32), back


def _adam(adamw, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf):
    lr = jnp.asarray(lr).astype(_F64)
    out = ([], [], [], [], [])
    for i, (p, g, m, v, s) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
        ct = compute_dtype(p.dtype)
        g32, g_back = _grad(g, ct, grad_scale, maximize)
        p32 = p.astype(ct)
        if weight_decay != 0:
            if adamw:
                p32 = p32 - (lr * weight_decay).astype(ct) * p32
            else:
                g32 = g32 + p32 * weight_decay
        m32 = m.astype(ct) * beta1 + g32 * (1 - beta1)
        v32 = v.astype(ct) * beta2 + g32 * g32 * (1 - beta2)
        step = s.reshape(()).astype(_F64)
        step_size = (lr / (1 - beta1**step)).astype(ct)
        bc2_sqrt = jnp.sqrt(1 - beta2**step).astype(ct)
        if amsgrad:
            mx = jnp.maximum(max_exp_avg_sqs[i].astype(ct), v32)
            out[4].append(_skip(found_inf, max_exp_avg_sqs[i], mx))
            denom = jnp.sqrt(mx) / bc2_sqrt + eps
        else:
            denom = jnp.sqrt(v32) / bc2_sqrt + eps
        p32 = p32 - step_size * m32 / denom
        for k, (old, new) in enumerate(((p, p32), (g, g_back), (m, m32), (v, v32))):
            out[k].append(_skip(found_inf, old, new))
    return out


def _adam_kernel(adamw: bool):
    def fused(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
              weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        return _adam(adamw, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1,
                     beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)

    return fused


for _packet, _adamw in ((aten._fused_adam, False), (aten._fused_adamw, True)):
    lowering(_packet.default, _packet.tensor_lr, family="foreach", static=("weight_decay",),
             runtime=("lr", "beta1", "beta2", "eps"), meta=_lists_meta(5))(_adam_kernel(_adamw))


@lowering(aten._fused_sgd.default, aten._fused_sgd.tensor_lr, family="foreach",
          static=("weight_decay", "momentum"), runtime=("lr", "dampening"), meta=_lists_meta(3))
def fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
              is_first_step, grad_scale=None, found_inf=None):
    lr = jnp.asarray(lr).astype(_F64)
    out = ([], [], [])
    for i, (p, g) in enumerate(zip(params, grads)):
        ct = compute_dtype(p.dtype)
        g32, g_back = _grad(g, ct, grad_scale, maximize)
        p32 = p.astype(ct)
        if weight_decay != 0:
            g32 = g32 + p32 * weight_decay
        if momentum != 0:
            buf = momentum_buffer_list[i]
            b = g32 if is_first_step else buf.astype(ct) * momentum + g32 * (1 - dampening)
            out[2].append(_skip(found_inf, buf, b))
            g32 = g32 + b * momentum if nesterov else b
        p32 = p32 - lr.astype(ct) * g32
        out[0].append(_skip(found_inf, p, p32))
        out[1].append(_skip(found_inf, g, g_back))
    return out


def _adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale,
             found_inf):
    lr = jnp.asarray(lr).astype(_F64)
    out = ([], [], [])
    for p, g, ss, s in zip(params, grads, state_sums, state_steps):
        ct = compute_dtype(p.dtype)
        g32, g_back = _grad(g, ct, grad_scale, maximize)
        p32 = p.astype(ct)
        if weight_decay != 0:
            g32 = g32 + p32 * weight_decay
        clr = (lr / (1 + (s.reshape(()).astype(_F64) - 1) * lr_decay)).astype(ct)
        ss32 = ss.astype(ct) + g32 * g32
        p32 = p32 - clr * g32 / (jnp.sqrt(ss32) + eps)
        for k, (old, new) in enumerate(((p, p32), (g, g_back), (ss, ss32))):
            out[k].append(_skip(found_inf, old, new))
    return out


_ADAGRAD = dict(family="foreach", static=("weight_decay",), runtime=("lr", "lr_decay", "eps"))


@lowering(aten._fused_adagrad.default, meta=_lists_meta(4), **_ADAGRAD)
def fused_adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                  grad_scale=None, found_inf=None):
    # this overload's schema also writes the step counters, which the kernel leaves as they are
    return (*_adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize,
                      grad_scale, found_inf), list(state_steps))


@lowering(aten._fused_adagrad.tensor_lr, meta=_lists_meta(3), **_ADAGRAD)
def fused_adagrad_tensor_lr(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                            grad_scale=None, found_inf=None):
    return _adagrad(params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale,
                    found_inf)


# --- gradient scaling (torch.amp.GradScaler) ---------------------------------------------------


@lowering(aten._amp_foreach_non_finite_check_and_unscale.default, family="foreach")
def amp_unscale(grads, found_inf, inv_scale):
    """Every gradient times inv_scale; found_inf becomes 1 if any gradient has an inf or NaN."""
    bad = jnp.zeros((), bool)
    out = []
    for g in grads:
        bad = bad | ~jnp.all(jnp.isfinite(g))
        out.append(g * inv_scale.reshape(()).astype(g.dtype))
    return out, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lowering(aten._amp_update_scale.default, family="foreach", static=("scale_growth_factor", "scale_backoff_factor"))
def amp_update_scale(scale, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    """Back off after a step with an inf; grow after `growth_interval` clean steps in a row, unless
    the grown scale would overflow."""
    found = found_inf.reshape(()) != 0
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = (scale * scale_growth_factor).astype(scale.dtype)
    new_scale = jnp.where(found, scale * scale_backoff_factor,
                          jnp.where(grow & jnp.isfinite(grown), grown, scale)).astype(scale.dtype)
    new_tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful).astype(growth_tracker.dtype)
    return new_scale, new_tracker
