"""How far a model zoo architecture's numbers move with the float32 matmul precision, against CPU.

On a TPU the matrix unit multiplies in bfloat16 passes: "highest" takes six (float32-exact),
"high" three, "medium" one (XLA's DEFAULT, TorchTPU's own default). For each architecture this
runs `deferfuse.check` (forward output, and every parameter's gradient of the model's loss) at the
three settings and prints the relative MSE against CPU PyTorch as a markdown table, so a user can
choose a setting knowing what it costs in accuracy. Where the backend computes float32 contractions
exactly whatever the setting (XLA:CPU), the three columns agree: the table means something only on
a TPU, where it is recorded in docs/models.md.

    python tests/models/precision_table.py                 # a dozen architectures, DeferAndFuse
    python tests/models/precision_table.py --all           # all of the zoo
    python tests/models/precision_table.py llama bert      # these
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_decoders  # noqa: E402
import zoo_others  # noqa: E402

import deferfuse  # noqa: E402
from deferfuse.check import ROOT, CheckResult  # noqa: E402

SPECS = {s.name: s for s in zoo_decoders.SPECS + zoo_others.SPECS}
PRECISIONS = ("highest", "high", "medium")
# one per kind of model the zoo has: dense, GQA/sliding-window and MoE decoders, soft-capped
# attention, ALiBi, encoders, encoder-decoders, vision transformers and convolutions, audio
DEFAULT = ("llama", "mistral", "mixtral", "gemma2", "gpt2", "bloom", "bert", "t5", "bart", "vit", "resnet",
           "wav2vec2", "whisper")


def _loss(out) -> torch.Tensor:
    return out["loss"] if "loss" in out else out[0]


def _worst(result: CheckResult, kind: str, root_only: bool = False) -> float:
    """The largest relative MSE over the model's own output (forward) or over its gradients."""
    values = [r.rel_mse for r in result.rows
              if r.kind == kind and (not root_only or r.name.startswith(ROOT)) and not math.isnan(r.rel_mse)]
    return max(values, default=math.nan)


def measure(name: str, mode: str = "defer_and_fuse") -> dict[str, tuple[float, float]]:
    """precision -> (forward output rel MSE, worst gradient rel MSE), for one architecture."""
    spec = SPECS[name]
    inputs = spec.inputs()
    out: dict[str, tuple[float, float]] = {}
    for precision in PRECISIONS:
        torch.set_float32_matmul_precision(precision)
        try:
            fwd = deferfuse.check(spec.build(), kwargs=inputs, mode=mode, threshold=math.inf)
            bwd = deferfuse.check(spec.build(), kwargs={**inputs, **spec.labels(inputs)}, mode=mode, backward=True,
                                  loss_fn=_loss, threshold=math.inf)
        finally:
            torch.set_float32_matmul_precision("highest")
        out[precision] = (_worst(fwd, "output", root_only=True), _worst(bwd, "grad"))
    return out


def _head() -> list[str]:
    return ["| architecture | " + " | ".join(f"forward, {p}" for p in PRECISIONS) + " | " + " | ".join(
        f"gradients, {p}" for p in PRECISIONS) + " |", "|---|" + "---:|" * (2 * len(PRECISIONS))]


def _row(name: str, by: dict[str, tuple[float, float]]) -> str:
    cells = [f"{by[p][0]:.1e}" for p in PRECISIONS] + [f"{by[p][1]:.1e}" for p in PRECISIONS]
    return f"| {name} | " + " | ".join(cells) + " |"


def table(results: dict[str, dict[str, tuple[float, float]]]) -> str:
    return "\n".join(_head() + [_row(name, by) for name, by in results.items()])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"architectures (default: {', '.join(DEFAULT)})")
    ap.add_argument("--all", action="store_true", help=f"all {len(SPECS)} architectures of the zoo")
    ap.add_argument("--mode", default="defer_and_fuse")
    args = ap.parse_args(argv)
    names = sorted(SPECS) if args.all else args.names or list(DEFAULT)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        ap.error(f"unknown architectures {unknown}; known: {sorted(SPECS)}")
    device = deferfuse.target.jax_device()
    print(f"relative MSE against CPU PyTorch ({args.mode}, {getattr(device, 'device_kind', device.platform)}):\n")
    print("\n".join(_head()), flush=True)
    t0 = time.perf_counter()
    for name in names:  # a row as each architecture finishes: a run cut short keeps what it measured
        print(_row(name, measure(name, args.mode)), flush=True)
        print(f"{name}: done at {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
