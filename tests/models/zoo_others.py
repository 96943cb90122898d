"""Encoders, encoder-decoders, vision and speech models of the zoo: tiny configs (hidden 32 or
less, 2 layers or stages), random weights, a classification or language-modelling head so the
model returns a loss."""
from __future__ import annotations

import torch
import transformers as T

from zoo_harness import Spec, deterministic

VOCAB, PAD, BOS, EOS = 128, 0, 1, 2
SEQ, TARGET = 8, 6
CLASSES = dict(num_labels=3)
BERT_LIKE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64, **CLASSES)
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
               pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS)
VISION = dict(image_size=32, num_channels=3, **CLASSES)


def right_padded(rows: int, length: int):
    """Token ids with the last two positions of the second row padded, and their mask."""
    ids = torch.randint(3, VOCAB, (rows, length))
    mask = torch.ones(rows, length, dtype=torch.long)
    ids[1, -2:], mask[1, -2:] = PAD, 0
    return ids, mask


def encoder_inputs():
    ids, mask = right_padded(2, SEQ)
    return {"input_ids": ids, "attention_mask": mask}


def class_labels(inputs):
    return {"labels": torch.tensor([0, 2])}


def seq2seq_inputs():
    ids, mask = right_padded(2, SEQ)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": torch.randint(3, VOCAB, (2, TARGET))}


def seq2seq_labels(inputs):
    return {"labels": (inputs["decoder_input_ids"] * 7 + 5) % VOCAB}


def seq2seq_prompts():
    unpadded = {"input_ids": torch.randint(3, VOCAB, (2, 6))}
    ids, mask = right_padded(2, 6)
    return unpadded, {"input_ids": ids, "attention_mask": mask}


def image_inputs():
    return {"pixel_values": torch.randn(2, 3, 32, 32)}


def spec(name, family, model_cls, config_cls, inputs, labels, *, prompts=None, fallbacks=None, xfail=None,
         **config) -> Spec:
    def build():
        return model_cls(deterministic(config_cls(**config)))

    return Spec(name, family, build, inputs, labels, generates=prompts is not None, prompts=prompts,
                fallbacks=fallbacks or {}, xfail=xfail or {})


def encoder(name, model_cls, config_cls, **config):
    return spec(name, "encoder", model_cls, config_cls, encoder_inputs, class_labels, **config)


def seq2seq(name, model_cls, config_cls, **config):
    return spec(name, "encoder-decoder", model_cls, config_cls, seq2seq_inputs, seq2seq_labels,
                prompts=seq2seq_prompts, **config)


def vision(name, model_cls, config_cls, **config):
    return spec(name, "vision", model_cls, config_cls, image_inputs, class_labels, **VISION, **config)


def wav2vec2_inputs():
    return {"input_values": torch.randn(2, 400)}


def ctc_labels(inputs):
    return {"labels": torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, -100, -100]])}


def whisper_inputs():
    return {"input_features": torch.randn(2, 16, 16), "decoder_input_ids": torch.randint(3, VOCAB, (2, TARGET))}


# The lengths are tpu tensors (the model sums its masks), and the second output's shape (batch,
# time, 2 * max(target_lengths) + 1) depends on their values: no lowering yet, so CTC runs on CPU.
CTC_REASON = "CTC loss is not lowered: log_alpha's shape depends on the target lengths' values"
CTC_FALLBACKS = {"aten._ctc_loss.Tensor": CTC_REASON, "aten._ctc_loss_backward.Tensor": CTC_REASON}

SPECS = [
    encoder("bert", T.BertForSequenceClassification, T.BertConfig, **BERT_LIKE),
    encoder("roberta", T.RobertaForSequenceClassification, T.RobertaConfig, pad_token_id=PAD, **BERT_LIKE),
    encoder("distilbert", T.DistilBertForSequenceClassification, T.DistilBertConfig, vocab_size=VOCAB, dim=32,
            n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64, **CLASSES),
    encoder("albert", T.AlbertForSequenceClassification, T.AlbertConfig, embedding_size=16, **BERT_LIKE),
    encoder("electra", T.ElectraForSequenceClassification, T.ElectraConfig, embedding_size=16, **BERT_LIKE),
    encoder("deberta_v2", T.DebertaV2ForSequenceClassification, T.DebertaV2Config, relative_attention=True,
            pos_att_type=["p2c", "c2p"], position_buckets=8, **BERT_LIKE),
    # local sliding-window layers between global ones, rotary positions, gated MLPs
    encoder("modernbert", T.ModernBertForSequenceClassification, T.ModernBertConfig, vocab_size=VOCAB, hidden_size=32,
            num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
            pad_token_id=PAD, global_attn_every_n_layers=2, local_attention=4, **CLASSES),
    seq2seq("t5", T.T5ForConditionalGeneration, T.T5Config, vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
            num_layers=2, num_heads=4, relative_attention_num_buckets=8, pad_token_id=PAD, eos_token_id=EOS,
            decoder_start_token_id=PAD),
    seq2seq("bart", T.BartForConditionalGeneration, T.BartConfig, **SEQ2SEQ),
    seq2seq("marian", T.MarianMTModel, T.MarianConfig, **SEQ2SEQ),
    seq2seq("pegasus", T.PegasusForConditionalGeneration, T.PegasusConfig, **SEQ2SEQ),
    vision("siglip", T.SiglipForImageClassification, T.SiglipConfig,
           vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                              patch_size=8, image_size=32),
           text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                            vocab_size=VOCAB)),
    vision("vit", T.ViTForImageClassification, T.ViTConfig, patch_size=8, hidden_size=32, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=64),
    vision("deit", T.DeiTForImageClassification, T.DeiTConfig, patch_size=8, hidden_size=32,
           num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
    vision("swin", T.SwinForImageClassification, T.SwinConfig, patch_size=4, embed_dim=16, depths=[1, 1],
           num_heads=[2, 2], window_size=4),
    vision("convnext", T.ConvNextForImageClassification, T.ConvNextConfig, patch_size=4, hidden_sizes=[8, 16],
           depths=[1, 1], num_stages=2),
    vision("resnet", T.ResNetForImageClassification, T.ResNetConfig, embedding_size=8, hidden_sizes=[8, 16],
           depths=[1, 1], layer_type="basic"),
    vision("mobilenet_v2", T.MobileNetV2ForImageClassification, T.MobileNetV2Config, depth_multiplier=0.25,
           output_stride=8, finegrained_output=False),
    spec("wav2vec2", "speech", T.Wav2Vec2ForCTC, T.Wav2Vec2Config, wav2vec2_inputs, ctc_labels, vocab_size=32,
         hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
         conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
         pad_token_id=PAD, fallbacks=CTC_FALLBACKS),
    spec("whisper", "speech", T.WhisperForConditionalGeneration, T.WhisperConfig, whisper_inputs,
         seq2seq_labels, vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=32,
         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
         max_source_positions=8, max_target_positions=32, pad_token_id=PAD, bos_token_id=BOS,
         eos_token_id=EOS, decoder_start_token_id=BOS),
]
