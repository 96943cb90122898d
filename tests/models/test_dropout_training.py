"""A Hugging Face model trained with its default dropout: DeferAndFuse replays the whole step and
draws Strict's numbers.

Models train with dropout on by default (GPT-2's three probabilities are 0.1), so this is the step
most users run. CPU cannot be the oracle for values drawn from the tpu stream; Strict can: it runs
each op as it comes, and Strict, Debug and DeferAndFuse draw identical numbers by design (rng.py).
A replay that reused its trace's keys, or drew them in another order, would give other losses.
"""
from __future__ import annotations

import torch
import transformers as T

import deferfuse
from deferfuse import events
from zoo_decoders import TOKENS

STEPS = 6


def _train(mode: str):
    """Losses and parameters of STEPS AdamW steps reading `loss.item()`, and the step replay's
    stops after the second step (the first makes AdamW's state, the second is traced)."""
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **TOKENS)).to("tpu")
    assert model.config.resid_pdrop > 0 and model.config.attn_pdrop > 0 and model.training
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(3, TOKENS["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1)).to("tpu")
    torch.tpu.manual_seed(3)
    losses = []
    with deferfuse.mode(mode):
        for i in range(STEPS):
            if i == 2:
                events.start_collecting()
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        stops = [(e["op"], e["why"]) for e in events.stop_collecting() if e["kind"] == "replay_stop"]
        params = [p.detach().cpu() for p in model.parameters()]
    return torch.tensor(losses), params, stops


def test_gpt2_with_dropout_replays_its_steps_with_stricts_numbers():
    strict_losses, strict_params, _ = _train("strict")
    deferfuse.reset_metrics()
    losses, params, stops = _train("defer_and_fuse")
    assert stops == []
    assert deferfuse.metrics()["ops_replayed"] > 0
    torch.testing.assert_close(losses, strict_losses)
    torch.testing.assert_close(params, strict_params)
    assert len(set(losses.tolist())) == STEPS
