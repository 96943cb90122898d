"""Decoder-only language models of the zoo: tiny configs (hidden 32, 2 layers, vocab 128), random
weights. Grouped-query attention where the architecture has it (4 query heads, 2 key/value
heads), mixture-of-experts routing, rotary and ALiBi positions, and sliding windows shorter than
the prompts plus the generated tokens, so the window actually masks something."""
from __future__ import annotations

import torch
import transformers as T

from zoo_harness import Spec, deterministic

VOCAB, PAD, BOS, EOS = 128, 0, 1, 2
SEQ = 8
TOKENS = dict(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, **TOKENS)


def lm_inputs():
    """Two sequences, the second left-padded by two (how batched prompts reach a decoder), so
    attention sees fully masked query rows."""
    ids = torch.randint(3, VOCAB, (2, SEQ))
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, :2] = 0
    ids[1, :2] = PAD
    return {"input_ids": ids, "attention_mask": mask}


def lm_labels(inputs):
    return {"labels": inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)}


def lm_prompts():
    """An unpadded batch without a mask, and a batch of a 5- and a 3-token prompt left-padded."""
    unpadded = {"input_ids": torch.randint(3, VOCAB, (2, 5))}
    ids = torch.randint(3, VOCAB, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    ids[1, :2], mask[1, :2] = PAD, 0
    return unpadded, {"input_ids": ids, "attention_mask": mask}


def causal_lm(name: str, model_cls, config_cls, *, fallbacks=None, xfail=None, **config) -> Spec:
    def build():
        return model_cls(deterministic(config_cls(**config)))

    return Spec(name, "decoder", build, lm_inputs, lm_labels, generates=True, prompts=lm_prompts,
                fallbacks=fallbacks or {}, xfail=xfail or {})


SPECS = [
    causal_lm("llama", T.LlamaForCausalLM, T.LlamaConfig, **LLAMA_LIKE),
    causal_lm("mistral", T.MistralForCausalLM, T.MistralConfig, sliding_window=4, **LLAMA_LIKE),
    causal_lm("qwen2", T.Qwen2ForCausalLM, T.Qwen2Config, **LLAMA_LIKE),
    causal_lm("qwen3", T.Qwen3ForCausalLM, T.Qwen3Config, head_dim=8, **LLAMA_LIKE),
    causal_lm("gemma", T.GemmaForCausalLM, T.GemmaConfig, head_dim=8, **LLAMA_LIKE),
    causal_lm("gemma2", T.Gemma2ForCausalLM, T.Gemma2Config, head_dim=8, sliding_window=4,
              query_pre_attn_scalar=8, **LLAMA_LIKE),
    causal_lm("gemma3", T.Gemma3ForCausalLM, T.Gemma3TextConfig, head_dim=8, sliding_window=4,
              query_pre_attn_scalar=8, **LLAMA_LIKE),
    causal_lm("mixtral", T.MixtralForCausalLM, T.MixtralConfig, num_local_experts=4, num_experts_per_tok=2,
              **LLAMA_LIKE),
    causal_lm("qwen2_moe", T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig, num_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=32, **LLAMA_LIKE),
    causal_lm("starcoder2", T.Starcoder2ForCausalLM, T.Starcoder2Config, sliding_window=4, **LLAMA_LIKE),
    causal_lm("phi3", T.Phi3ForCausalLM, T.Phi3Config, **LLAMA_LIKE),
    causal_lm("phi", T.PhiForCausalLM, T.PhiConfig, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, partial_rotary_factor=0.5, max_position_embeddings=64, **TOKENS),
    causal_lm("bloom", T.BloomForCausalLM, T.BloomConfig, hidden_size=32, n_layer=2, n_head=4, **TOKENS),
    causal_lm("mpt", T.MptForCausalLM, T.MptConfig, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2,
              max_seq_len=64, **TOKENS),
    causal_lm("falcon", T.FalconForCausalLM, T.FalconConfig, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64, **TOKENS),
    causal_lm("gpt2", T.GPT2LMHeadModel, T.GPT2Config, n_embd=32, n_layer=2, n_head=4, n_positions=64, **TOKENS),
    causal_lm("gpt_neox", T.GPTNeoXForCausalLM, T.GPTNeoXConfig, hidden_size=32, intermediate_size=64,
              num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, **TOKENS),
    causal_lm("gptj", T.GPTJForCausalLM, T.GPTJConfig, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
              n_positions=64, **TOKENS),
    causal_lm("opt", T.OPTForCausalLM, T.OPTConfig, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
              num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=64, **TOKENS),
    # multi-head latent attention (low-rank q and kv, a rotary part of each head) and group-limited
    # top-k routing with a shared expert; its attention takes as many kv heads as query heads
    causal_lm("deepseek_v3", T.DeepseekV3ForCausalLM, T.DeepseekV3Config, n_routed_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16,
              q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, head_dim=4, n_group=2,
              topk_group=1, **{**LLAMA_LIKE, "num_key_value_heads": 4}),
    # attention sinks, a clamped SwiGLU in its experts, sliding and full attention layers alternating
    causal_lm("gpt_oss", T.GptOssForCausalLM, T.GptOssConfig, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
              sliding_window=4, **LLAMA_LIKE),
    # a state-space model, not attention: transformers' sequential selective scan and causal conv1d
    causal_lm("mamba", T.MambaForCausalLM, T.MambaConfig, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
              conv_kernel=4, **TOKENS),
]
