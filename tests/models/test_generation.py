"""Hugging Face `generate` beyond the zoo's greedy stage, against CPU eager.

Beam search reorders the cache and ranks hypotheses on the host's reads of the scores; logits
processors gather, scatter and mask by the tokens already generated; sampling draws from the tpu
random stream, so it is held to determinism and to greedy at top_k=1 rather than to CPU's tokens;
and watermarking draws its green list on the host with a generator of its own per call (a
fallback that once kept the first call's generator, so a second identical call gave other tokens).
"""
from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

import deferfuse
import zoo_harness as H
from test_zoo import SPECS

MODES = ["strict", "defer_and_fuse"]


def _pair(name: str):
    model = H.seeded(SPECS[name].build).eval()
    return model, copy.deepcopy(model).to("tpu")


def _padded_prompt(name: str) -> dict:
    return H.seeded(SPECS[name].prompts, 2)[1]


def _generate(model, prompt: dict, device: str, **kw):
    out = model.generate(**H.to_device(prompt, device), max_new_tokens=6, return_dict_in_generate=True, **kw)
    scores = out.sequences_scores if "num_beams" in kw else torch.stack(out.scores)
    return out.sequences.cpu(), scores.cpu()


def _check_like_cpu(name: str, mode: str, **kw) -> None:
    cpu_model, tpu_model = _pair(name)
    prompt = _padded_prompt(name)
    want_tokens, want_scores = _generate(cpu_model, prompt, "cpu", **kw)
    with deferfuse.mode(mode):
        got_tokens, got_scores = _generate(tpu_model, prompt, "tpu", **kw)
    assert torch.equal(got_tokens, want_tokens), (got_tokens.tolist(), want_tokens.tolist())
    # masked tokens score -inf, which assert_close holds equal where the relative MSE cannot
    torch.testing.assert_close(got_scores, want_scores, rtol=H.RTOL, atol=H.ATOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_beam_search_keeps_cpus_hypotheses_and_scores(name, mode):
    _check_like_cpu(name, mode, do_sample=False, num_beams=3, num_return_sequences=2, length_penalty=0.5,
                    early_stopping=True, output_scores=True)


@pytest.mark.parametrize("mode", MODES)
def test_logits_processors_give_cpus_tokens_and_scores(mode):
    _check_like_cpu("llama", mode, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=2,
                    bad_words_ids=[[5], [7, 8]], min_new_tokens=4, output_scores=True)


@pytest.mark.parametrize("mode", MODES)
def test_seeded_sampling_repeats_and_top_k_of_one_is_greedy(mode):
    _, model = _pair("gpt2")
    prompt = H.to_device(_padded_prompt("gpt2"), "tpu")
    vocab = model.config.vocab_size
    with deferfuse.mode(mode):
        runs = []
        for _ in range(2):
            torch.manual_seed(3)
            runs.append(model.generate(**prompt, max_new_tokens=6, do_sample=True, top_k=20, top_p=0.9,
                                       temperature=0.8).cpu())
        greedy = model.generate(**prompt, max_new_tokens=6, do_sample=False).cpu()
        top1 = model.generate(**prompt, max_new_tokens=6, do_sample=True, top_k=1).cpu()
    assert torch.equal(runs[0], runs[1])
    assert 0 <= int(runs[0].min()) and int(runs[0].max()) < vocab
    assert torch.equal(top1, greedy)


@pytest.mark.parametrize("mode", MODES)
def test_two_identical_watermarked_generates_give_cpus_tokens(mode):
    cpu_model, tpu_model = _pair("gpt2")
    prompt = _padded_prompt("gpt2")
    config = T.WatermarkingConfig(bias=2.5, seeding_scheme="lefthash")
    want = cpu_model.generate(**prompt, max_new_tokens=6, do_sample=False, watermarking_config=config)
    with deferfuse.mode(mode):
        got = [tpu_model.generate(**H.to_device(prompt, "tpu"), max_new_tokens=6, do_sample=False,
                                  watermarking_config=config).cpu() for _ in range(2)]
    assert torch.equal(got[0], want) and torch.equal(got[1], want), ([g.tolist() for g in got], want.tolist())
