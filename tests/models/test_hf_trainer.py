"""transformers' `Trainer` with accelerate, as a user runs it: given no device, it picks tpu:0 by
itself (accelerate asks `torch.accelerator`) and trains a tiny GPT-2 to CPU's losses, in Strict
and in DeferAndFuse (issue 40, item 8).

Nothing in deferfuse names Trainer or accelerate, so nothing else would notice when a change to
either side (a new accelerate asking the device something new, a sync point Trainer adds) breaks
the most common way people train a Hugging Face model. The model is built from its config class,
offline, with every dropout at zero (zoo_harness.deterministic), so CPU is the oracle.
"""
from __future__ import annotations

import pytest
import torch
import transformers as T

import deferfuse
from zoo_decoders import TOKENS, VOCAB
from zoo_harness import deterministic

STEPS, SEQ, BATCH = 4, 16, 2


def _dataset() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(3, VOCAB, (STEPS * BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row, "labels": row} for row in ids]


def _train(out_dir, use_cpu: bool) -> tuple[list[float], T.Trainer]:
    """Trainer's defaults (fused AdamW, linear decay, gradient clipping, the loss logged every
    step), and nothing written: no checkpoints, no logging integration, no hub."""
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(deterministic(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **TOKENS)))
    args = T.TrainingArguments(output_dir=str(out_dir), use_cpu=use_cpu, max_steps=STEPS, per_device_train_batch_size=BATCH,
                               learning_rate=1e-3, seed=0, logging_steps=1, report_to="none", save_strategy="no",
                               push_to_hub=False, disable_tqdm=True)
    trainer = T.Trainer(model=model, args=args, train_dataset=_dataset())
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer


@pytest.fixture(scope="module")
def cpu_losses(tmp_path_factory) -> list[float]:
    losses, trainer = _train(tmp_path_factory.mktemp("cpu") / "out", use_cpu=True)
    assert trainer.args.device.type == "cpu" and len(losses) == STEPS
    return losses


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_trainer_picks_tpu_and_trains_gpt2_to_cpus_losses(mode, cpu_losses, tmp_path, monkeypatch):
    # the default mode, which is all TORCH_TPU_DEFER_AND_FUSE=1 selects at import (modes.py)
    before = deferfuse.get_default_mode()
    deferfuse.set_default_mode(mode)
    monkeypatch.chdir(tmp_path)  # so a file written to the working directory shows up below
    deferfuse.reset_metrics()
    try:
        losses, trainer = _train(tmp_path / "out", use_cpu=False)
    finally:
        deferfuse.set_default_mode(before)
    assert trainer.args.device == torch.device("tpu", 0)
    assert {p.device for p in trainer.model.parameters()} == {torch.device("tpu", 0)}
    m = deferfuse.metrics()
    assert m["cpu_fallbacks_total"] == 0, m["cpu_fallbacks"]
    assert ("strict_op" in m["flushes_by_cause"]) == (mode == "strict"), m["flushes_by_cause"]  # the mode ran
    # float32 at "highest" matmul precision on both sides: the losses differ only by XLA's order
    # of summation (1e-7 relative after 4 AdamW steps, one float32 step at 4.5), so 1e-5 leaves
    # room for other backends' sums, while noise of half its spread added to tanh (inside GPT-2's
    # GELU) moves them by 1e-4, the zoo's own bound after one step
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=0)
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "out"])
