"""Model FLOPs utilisation: a training step's FLOPs over its time, as a share of the chip's peak.

Every engine of a workload is credited with the same analytic count, taken from the model's
shape rather than from what each engine's programs happen to execute, so the column compares
engines, not lowerings (a recomputation or an extra transpose costs time but earns no FLOPs).
XLA's own count of the plain-JAX engine's compiled step is printed beside it as a cross-check;
it is larger because it also counts elementwise work (LayerNorm, softmax, GELU, AdamW).

Peaks are the bf16 dense figures Google publishes per chip. A float32 matmul at "highest"
precision runs as several bf16 passes on the MXU (about six), so at that precision, PyTorch's
default and the bench's, MFU against the bf16 peak is low by design; read it with the precision
the table states, and ask for "medium" (one bf16 pass) to see the MXU's share.
"""
from __future__ import annotations

# device_kind as JAX reports it -> peak bf16 FLOP/s per chip
PEAK_BF16 = {
    "TPU v4": 275e12,        # cloud.google.com/tpu/docs/v4
    "TPU v5 lite": 197e12,   # cloud.google.com/tpu/docs/v5e (JAX calls v5e "TPU v5 lite")
    "TPU v5e": 197e12,
    "TPU v5": 459e12,        # cloud.google.com/tpu/docs/v5p
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,   # cloud.google.com/tpu/docs/v6e
    "TPU v6e": 918e12,
}


def gpt_train_flops(cfg, batch: int) -> float:
    """FLOPs of one training step of examples/gpt_train.py's GPT:

        6 · N · B·T  +  12 · L · B · T² · d

    N counts the weights that enter a matmul: per layer qkv 3d², proj d², fc 4d², out 4d² (12d²),
    and the untied head d·V; biases, LayerNorms and both embeddings are left out, since a lookup
    multiplies nothing. 2·N per token is the forward pass and the backward pass costs twice that
    (the gradient with respect to the input and to the weight). The second term is attention's
    QKᵀ and AV, 2·T²·d each per layer and sequence forward, three times for the step; the causal
    mask does not halve it, as the engines compute the whole T×T score matrix (PaLM's appendix B
    counts the same way)."""
    d, L, T, V = cfg.dim, cfg.layers, cfg.seq, cfg.vocab
    n = L * 12 * d * d + d * V
    return 6.0 * n * batch * T + 12.0 * L * batch * T * T * d


def device() -> tuple[str, str, float]:
    """(platform, device kind, peak FLOP/s or 0 where unknown) of JAX's default device, where
    every engine but "cpu" runs."""
    import jax

    dev = jax.devices()[0]
    return dev.platform, dev.device_kind, PEAK_BF16.get(dev.device_kind, 0.0) if dev.platform == "tpu" else 0.0


def mfu(flops: float, step_ms: float, peak: float) -> float | None:
    if not flops or not peak or not step_ms or step_ms != step_ms:
        return None
    return flops / (step_ms / 1e3) / peak
