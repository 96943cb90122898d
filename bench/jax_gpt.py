"""The bench's `jax` engine: examples/gpt_train.py's GPT and torch's AdamW written directly in JAX.

It is the external anchor for the deferfuse engines: the same model, weights, batch and optimizer,
with none of deferfuse's lowerings, recording or fusion in the way, as a JAX user would write it
(one `jax.jit` of the whole step with `jax.value_and_grad`, parameters and optimizer state
donated, compiled ahead of time so XLA's own FLOP count comes with it). If `jit` (deferfuse's
capture of the step) is slower than this, the difference is in deferfuse's programs.

Every contraction runs at the precision the caller names, PyTorch's setting by default
(`torch.get_float32_matmul_precision()`, mapped to XLA as deferfuse maps it: "highest" ->
HIGHEST, "high" -> HIGH, "medium" -> DEFAULT), so the engines of one bench run do the same MXU
work and a TPU's float32 results agree with CPU PyTorch at "highest"; an MFU figure holds for the
precision the table states.

What matches PyTorch, and why it matters for the loss check in tests/test_bench.py: LayerNorm
(biased variance, eps 1e-5), exact erf GELU, causal softmax attention scaled by 1/√head_dim,
cross-entropy as `F.cross_entropy(logits.flatten(0, 1), y.flatten())`, and AdamW as
torch.optim's: weight decay decoupled and applied to every parameter, `exp_avg.lerp_(g, 1-β1)`,
bias corrections 1-βᵗ (computed as -expm1(t·log β), which float32 keeps exact where 1-0.999ᵗ
would cancel), `denom = sqrt(v)/sqrt(bc2) + eps`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

PRECISIONS = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH,
              "medium": jax.lax.Precision.DEFAULT}


def _hparams(opt: torch.optim.Optimizer) -> dict:
    """The AdamW hyperparameters the torch optimizer was given, so the workload's choices carry
    over; anything this step does not implement is refused rather than silently run differently."""
    if not isinstance(opt, torch.optim.AdamW) or len(opt.param_groups) != 1:
        raise NotImplementedError("the jax engine implements torch.optim.AdamW with one parameter group")
    g = opt.param_groups[0]
    if g.get("amsgrad") or g.get("maximize") or not g.get("decoupled_weight_decay", True):
        raise NotImplementedError("the jax engine implements AdamW without amsgrad or maximize")
    b1, b2 = g["betas"]
    return {"lr": float(g["lr"]), "b1": float(b1), "b2": float(b2), "eps": float(g["eps"]),
            "wd": float(g["weight_decay"])}


def _layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * w + b


def forward(p: dict, idx, cfg, prec):
    def linear(x, name, bias=True):
        y = jnp.einsum("...i,oi->...o", x, p[name + ".weight"], precision=prec)
        return y + p[name + ".bias"] if bias else y

    b, t = idx.shape
    c, h = cfg.dim, cfg.heads
    x = p["tok.weight"][idx] + p["pos.weight"][:t]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    for i in range(cfg.layers):
        blk = f"blocks.{i}."
        qkv = linear(_layer_norm(x, p[blk + "ln1.weight"], p[blk + "ln1.bias"]), blk + "qkv")
        q, k, v = (a.reshape(b, t, h, c // h) for a in jnp.split(qkv, 3, axis=-1))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=prec) / math.sqrt(c // h)
        a = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", a, v, precision=prec).reshape(b, t, c)
        x = x + linear(y, blk + "proj")
        m = _layer_norm(x, p[blk + "ln2.weight"], p[blk + "ln2.bias"])
        x = x + linear(jax.nn.gelu(linear(m, blk + "fc"), approximate=False), blk + "out")
    return linear(_layer_norm(x, p["ln.weight"], p["ln.bias"]), "head", bias=False)


def loss_fn(p, x, y, cfg, prec):
    logits = forward(p, x, cfg, prec).reshape(-1, cfg.vocab)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, y.reshape(-1, 1), axis=-1).mean()


def adamw(p, grads, state, hp):
    t = state["t"] + 1
    tf = t.astype(jnp.float32)
    bc1 = -jnp.expm1(tf * math.log(hp["b1"]))
    bc2 = -jnp.expm1(tf * math.log(hp["b2"]))
    new_p, m, v = {}, {}, {}
    for k in p:
        g = grads[k]
        m[k] = state["m"][k] + (1 - hp["b1"]) * (g - state["m"][k])
        v[k] = state["v"][k] * hp["b2"] + (1 - hp["b2"]) * g * g
        denom = jnp.sqrt(v[k]) / jnp.sqrt(bc2) + hp["eps"]
        new_p[k] = p[k] * (1 - hp["lr"] * hp["wd"]) - (hp["lr"] / bc1) * m[k] / denom
    return new_p, {"t": t, "m": m, "v": v}


def params_of(model: torch.nn.Module) -> dict:
    # named_parameters, not state_dict: AdamW updates exactly these, and none is tied
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.named_parameters()}


class Trainer:
    """One GPT and its AdamW state as JAX arrays on JAX's default device, started from a torch
    model's weights and a torch AdamW's hyperparameters, both taken before any step."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 precision: str | None = None):
        hp = _hparams(opt)
        self.precision = precision or torch.get_float32_matmul_precision()
        prec = PRECISIONS[self.precision]
        cfg = model.cfg
        self.params = params_of(model)
        def zeros():  # a buffer each: m and v are donated, and one buffer cannot be donated twice
            return {k: jnp.zeros_like(v) for k, v in self.params.items()}

        self.state = {"t": jnp.zeros((), jnp.int32), "m": zeros(), "v": zeros()}
        self.x = jnp.asarray(x.cpu().numpy().astype(np.int32))
        self.y = jnp.asarray(y.cpu().numpy().astype(np.int32))

        def step(p, state, xb, yb):
            loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb, cfg, prec)
            p, state = adamw(p, grads, state, hp)
            return p, state, loss

        self.compiled = jax.jit(step, donate_argnums=(0, 1)).lower(self.params, self.state, self.x, self.y).compile()
        cost = self.compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # older JAX: one dict per program
        self.xla_flops = float((cost or {}).get("flops", 0.0))
        self.last = None

    def step(self):
        self.params, self.state, self.last = self.compiled(self.params, self.state, self.x, self.y)
        return self.last

    def sync(self) -> None:
        jax.block_until_ready((self.params, self.last))
