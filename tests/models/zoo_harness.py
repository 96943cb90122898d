"""The model zoo's checks: one model, built twice from the same seed, run on CPU eager (the oracle)
and on tpu in one mode, compared stage by stage.

A stage is one of
- forward: eval mode, no_grad, every floating tensor of the output;
- train: train mode (the zoo's configs set every dropout, layer-drop and SpecAugment probability to
  zero, so train mode is deterministic), the loss, which parameters got a gradient and each
  gradient, then one AdamW step and the loss after it;
- generate: greedy `generate(max_new_tokens=8)` with the KV cache, once on an unpadded batch with
  no attention mask and once on a left-padded batch (right-padded encoder inputs for
  encoder-decoders) of prompts of different lengths;
- loop (`run_loop`, DeferAndFuse's step replay): four AdamW steps, each step's loss.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

import deferfuse

RTOL = ATOL = 1e-4
REL_MSE = 1e-6
STAGES = ("forward", "train", "generate")
ZERO_PROBABILITIES = ("dropout", "pdrop", "layerdrop", "drop_path", "mask_time_prob", "mask_feature_prob")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One architecture. `build` and `inputs` are seeded, so two calls give the same model and
    inputs; `labels(inputs)` gives the keyword arguments that make the model return a loss.
    `fallbacks` names each op the model may send to CPU, with the reason; `xfail` maps a
    (mode, stage) pair, "*" for any mode, to the reason it fails."""

    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, torch.Tensor]]
    labels: Callable[[dict], dict[str, torch.Tensor]]
    generates: bool = False
    prompts: Callable[[], tuple[dict, dict]] | None = None  # (unpadded, padded) generate inputs
    fallbacks: dict[str, str] = dataclasses.field(default_factory=dict)
    xfail: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)

    def stages(self) -> tuple[str, ...]:
        return STAGES if self.generates else STAGES[:2]

    def xfail_reason(self, mode: str, stage: str) -> str | None:
        return self.xfail.get((mode, stage)) or self.xfail.get(("*", stage))


def deterministic(config):
    """Zero every probability that makes training random (dropout, layer drop, SpecAugment masks):
    tpu's random streams are not CPU's, and the comparison needs the same function on both."""
    for key, value in config.to_dict().items():
        if isinstance(value, float) and any(word in key for word in ZERO_PROBABILITIES):
            setattr(config, key, 0.0)
    return config


def seeded(fn: Callable[[], Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return fn()


def to_device(tree, device: str):
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    return tree


def floating_outputs(out) -> dict[str, torch.Tensor]:
    """Every floating tensor a model returned, by field name (nested tuples such as hidden_states
    flattened with an index), on CPU."""
    found: dict[str, torch.Tensor] = {}

    def walk(name, value):
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                found[name] = value.detach().cpu()
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(f"{name}.{i}", v)

    items = out.items() if hasattr(out, "items") else [("out", out)]
    for key, value in items:
        walk(key, value)
    return found


def assert_matches(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """The issue's forward criterion: relative MSE (MSE over the CPU values' variance) at most
    1e-6, and assert_close at rtol = atol = 1e-4."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != CPU's {tuple(want.shape)}"
    g, w = got.double(), want.double()
    # a scalar (a loss) has no variance: its square is the scale then
    scale = w.var().item() if w.numel() > 1 else w.pow(2).mean().item()
    scale = max(scale, 1e-12)
    mse = (g - w).pow(2).mean().item()
    assert mse <= REL_MSE * scale, f"{what}: relative MSE {mse / scale:.2e} > {REL_MSE:g}"
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def assert_outputs_match(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), f"{what}: outputs {sorted(got)} != CPU's {sorted(want)}"
    for key in want:
        assert_matches(got[key], want[key], f"{what} {key}")


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}


def assert_gradients_match(got: dict, want: dict) -> None:
    """The set of parameters with a gradient must be CPU's exactly (a gradient missing on one side
    is a failure, never a tolerance question). Each gradient is then compared with an absolute
    tolerance scaled by the largest gradient of its module: some gradients are zero in exact
    arithmetic (an attention key's bias: softmax ignores a per-row constant) and are rounding
    noise on both sides, which only the size of their neighbours can judge."""
    only_cpu, only_tpu = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    assert not only_cpu and not only_tpu, f"gradient on CPU only: {only_cpu}; on tpu only: {only_tpu}"
    scale: dict[str, float] = {}
    for name, g in want.items():
        module = name.rpartition(".")[0]
        scale[module] = max(scale.get(module, 0.0), g.abs().max().item() if g.numel() else 0.0)
    for name, g in want.items():
        atol = ATOL * max(scale[name.rpartition(".")[0]], 1e-3)
        torch.testing.assert_close(got[name], g, rtol=RTOL, atol=atol, msg=lambda m, n=name: f"grad {n}: {m}")


def run_forward(spec: Spec, device: str) -> dict[str, torch.Tensor]:
    model = seeded(spec.build).eval().to(device)
    inputs = to_device(seeded(spec.inputs, 1), device)
    with torch.no_grad():
        return floating_outputs(model(**inputs))


def run_train(spec: Spec, device: str) -> dict[str, Any]:
    """Loss, gradients, one AdamW step, and the loss after it."""
    model = seeded(spec.build).train().to(device)
    inputs = seeded(spec.inputs, 1)
    batch = to_device({**inputs, **spec.labels(inputs)}, device)
    loss = model(**batch).loss
    loss.backward()
    grads = gradients(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()
    opt.zero_grad()
    after = model(**batch).loss
    return {"loss": loss.detach().cpu(), "grads": grads, "loss_after_step": after.detach().cpu()}


def run_loop(spec: Spec, device: str, steps: int = 4, compiled: bool = False) -> tuple[torch.Tensor, float]:
    """`steps` AdamW steps on one batch, the forward `torch.compile`d (backend "tpu") if
    `compiled`: each step's loss, and the calls DeferAndFuse's step replay served in the last
    step over all the ops that step recorded (decomposed calls' parts included: a lower bound of
    the replayed share; 0 on CPU)."""
    model = seeded(spec.build).train().to(device)
    inputs = seeded(spec.inputs, 1)
    batch = to_device({**inputs, **spec.labels(inputs)}, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def forward():
        return model(**batch).loss

    if compiled:
        forward = torch.compile(forward, backend="tpu")
    losses = []
    for i in range(steps):
        if i == steps - 1:
            m0 = deferfuse.metrics()
        loss = forward()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    m1 = deferfuse.metrics()
    replayed = (m1["ops_replayed"] - m0["ops_replayed"]) / max(1, m1["ops_recorded"] - m0["ops_recorded"])
    return torch.stack(losses).cpu(), replayed


def run_generate(spec: Spec, device: str) -> list[torch.Tensor]:
    model = seeded(spec.build).eval().to(device)
    out = []
    for prompt in seeded(spec.prompts, 2):
        tokens = model.generate(**to_device(prompt, device), max_new_tokens=8, do_sample=False, use_cache=True)
        out.append(tokens.cpu())
    return out


RUNNERS = {"forward": run_forward, "train": run_train, "generate": run_generate}


def check(spec: Spec, mode: str, stage: str) -> None:
    """Runs `stage` on CPU and on tpu in `mode`, compares, and checks the CPU fallbacks are exactly
    the spec's list."""
    want = RUNNERS[stage](spec, "cpu")
    deferfuse.reset_metrics()
    with deferfuse.mode(mode):
        got = RUNNERS[stage](spec, "tpu")
    fallbacks = set(deferfuse.metrics()["cpu_fallbacks"])
    if stage == "forward":
        assert_outputs_match(got, want, f"{spec.name} forward")
    elif stage == "train":
        assert_matches(got["loss"], want["loss"], "loss")
        assert_gradients_match(got["grads"], want["grads"])
        assert_matches(got["loss_after_step"], want["loss_after_step"], "loss after one AdamW step")
    else:
        for kind, g, w in zip(("unpadded, no mask", "left-padded with mask"), got, want):
            assert torch.equal(g, w), f"generate ({kind}): tpu {g.tolist()} != CPU {w.tolist()}"
    expected = set(spec.fallbacks)
    assert fallbacks <= expected, f"unexpected CPU fallbacks: {sorted(fallbacks - expected)}"
    if stage == "train":  # the stage that reaches every op of the model
        assert fallbacks == expected, f"expected fallbacks that did not happen: {sorted(expected - fallbacks)}"
