"""deferfuse.check: does a model give CPU's numbers on tpu, and if not, which layer is first wrong?

TorchTPU's migration guide validates a model moved to TPU by the relative MSE of its output
against CPU's (at most 0.10). One number for the whole model says *that* something differs; an
error spreads forward from the layer that made it, so hooking every submodule and listing them in
the order they finish puts the culprit first. Gradients (`backward=True`) are listed in the order
backward produces them (last layer first), for the same reason. CPU PyTorch is the oracle.

`python -m deferfuse.check target` runs the same check from a shell (see `__main__.py`).
`import deferfuse` rebinds the name `deferfuse.check` to the function below; import the rest with
`from deferfuse.check import CheckResult`.
"""
from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..api import metrics
from ..executors.base import EagerMode
from ..modes import mode as _mode

__all__ = ["check", "CheckResult", "Row"]

ROOT = "(model)"  # the row of the whole model's output
# A gradient that is zero in exact arithmetic (an attention key bias: softmax ignores a constant
# per row) is rounding noise on both sides, so its own variance is no scale to judge it by: its
# error is measured against this fraction of its module's mean squared gradient instead.
GRAD_FLOOR = 1e-6


@dataclass
class Row:
    name: str  # a submodule's qualified name (+ " (call n)" and the leaf's path), or a parameter's
    kind: str  # "output" or "grad"
    shape: tuple[int, ...]
    rel_mse: float  # MSE / variance of CPU's values; nan where they cannot be compared
    max_abs: float
    ok: bool
    note: str = ""


@dataclass
class CheckResult:
    rows: list[Row]  # outputs in completion order, then gradients in backward's order
    fallbacks: dict[str, list[str]]  # op -> the layers (innermost running module) where it fell back
    threshold: float
    mode: str

    @property
    def first_failure(self) -> Row | None:
        return next((r for r in self.rows if not r.ok), None)

    @property
    def ok(self) -> bool:
        return self.first_failure is None

    def __str__(self) -> str:
        return _table(self)


def _leaves(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a module's output (tuples, lists, dicts, ModelOutputs), with their paths."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")


class _Recorder:
    """Hooks every submodule of one copy of the model. Outputs are cloned when a module returns,
    since a later in-place op (ReLU(inplace=True)) would otherwise change what is compared; they
    stay on their device until the run ends, so recording adds no sync point to DeferAndFuse.
    CPU fallbacks are charged to the innermost module running when they happen."""

    def __init__(self, model: nn.Module):
        self.outputs: dict[str, torch.Tensor] = {}
        self.finished: dict[str, int] = {}  # module name -> rank of its first completion
        self.fallbacks: dict[str, list[str]] = defaultdict(list)
        self._stack: list[str] = []
        self._calls: dict[str, int] = defaultdict(int)
        self._seen = metrics()["cpu_fallbacks"]
        for name, m in model.named_modules():
            m.register_forward_pre_hook(lambda m, a, n=name or ROOT: self._enter(n))
            m.register_forward_hook(lambda m, a, out, n=name or ROOT: self._leave(n, out))

    def charge(self, where: str) -> None:
        now = metrics()["cpu_fallbacks"]
        for op, count in now.items():
            if count > self._seen.get(op, 0) and where not in self.fallbacks[op]:
                self.fallbacks[op].append(where)
        self._seen = now

    def _enter(self, name: str) -> None:
        self.charge(self._stack[-1] if self._stack else "(outside modules)")
        self._stack.append(name)

    def _leave(self, name: str, out: Any) -> None:
        self.charge(self._stack.pop())
        self._calls[name] += 1
        self.finished.setdefault(name, len(self.finished))
        label = name if self._calls[name] == 1 else f"{name} (call {self._calls[name]})"
        for path, t in _leaves(out):
            self.outputs[label + path] = t.detach().clone()


def _weighted_sum(out: Any) -> torch.Tensor:
    """The default loss: a fixed random weighting of every floating output. `out.sum()` would send
    a constant gradient, which a softmax or a normalisation maps to zero, hiding wrong gradients."""
    gen = torch.Generator().manual_seed(0)
    terms = [(t.float() * torch.randn(t.shape, generator=gen).to(t.device)).sum()
             for _, t in _leaves(out) if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise ValueError("deferfuse.check: no floating output requires grad; pass loss_fn= to say what to differentiate")
    return sum(terms)


def _run(model: nn.Module, inputs: tuple, kwargs: dict, device: str, backward: bool,
         loss_fn: Callable | None) -> tuple[_Recorder, dict[str, torch.Tensor | None]]:
    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().to(device, copy=True).requires_grad_(x.requires_grad)

    rec = _Recorder(model)
    with torch.random.fork_rng(device_type="tpu"), torch.set_grad_enabled(backward):
        torch.manual_seed(0)  # seeds tpu's random ops too (their values are not CPU's)
        out = model(*tree_map(move, inputs), **tree_map(move, kwargs))
        rec.charge("(outside modules)")
        if backward:
            (loss_fn or _weighted_sum)(out).backward()
            rec.charge("(backward)")
    grads = {n: p.grad for n, p in model.named_parameters()}
    return rec, grads


def _as_float(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().resolve_conj()
    return (torch.view_as_real(t) if t.is_complex() else t).double()


def _compare(name: str, kind: str, ref: torch.Tensor | None, got: torch.Tensor | None,
             threshold: float, floor: float = 0.0) -> Row:
    if ref is None or got is None:
        t = ref if got is None else got
        side = "cpu" if got is None else "tpu"
        return Row(name, kind, tuple(t.shape), math.nan, math.nan, False, f"only on {side}")
    shape = tuple(ref.shape)
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return Row(name, kind, shape, math.nan, math.nan, False, f"tpu gives {tuple(got.shape)} {got.dtype}")
    a, b = _as_float(ref), _as_float(got)
    same = (a == b) | (a.isnan() & b.isnan())  # NaN and Inf where CPU has them are CPU's answer
    diff = torch.where(same, 0.0, b - a)
    if a.numel() == 0:
        return Row(name, kind, shape, 0.0, 0.0, True)
    if not diff.isfinite().all():
        return Row(name, kind, shape, math.inf, math.inf, False, "non-finite where CPU differs")
    finite = a[a.isfinite()]
    var = finite.var(unbiased=False).item() if finite.numel() > 1 else 0.0
    # a constant output has no variance: judge it against its square, an all-zero one absolutely
    denom = max(var, floor) or (finite.pow(2).mean().item() if finite.numel() else 0.0) or 1.0
    rel = diff.pow(2).mean().item() / denom
    return Row(name, kind, shape, rel, diff.abs().max().item(), rel <= threshold)


def _grad_rows(cpu: dict, tpu: dict, finished: dict[str, int], threshold: float) -> list[Row]:
    owner = {n: n.rpartition(".")[0] or ROOT for n in cpu}
    scale: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for n, g in cpu.items():
        if g is not None:
            scale[owner[n]][0] += _as_float(g).pow(2).sum().item()
            scale[owner[n]][1] += g.numel()
    # backward's order: the last module to finish forward first; modules that never ran last
    names = sorted((n for n in cpu if cpu[n] is not None or tpu[n] is not None),
                   key=lambda n: -finished.get(owner[n], -1))
    return [_compare(n, "grad", cpu[n], tpu[n], threshold,
                     GRAD_FLOOR * scale[owner[n]][0] / max(scale[owner[n]][1], 1)) for n in names]


def check(model: nn.Module, *inputs: Any, mode: str | EagerMode = "defer_and_fuse", backward: bool = False,
          threshold: float = 0.10, kwargs: dict[str, Any] | None = None,
          loss_fn: Callable[[Any], torch.Tensor] | None = None, train: bool = False) -> CheckResult:
    """Run `model(*inputs, **kwargs)` on CPU and on tpu in `mode`, and compare every submodule's
    output (and with `backward=True` every parameter's gradient of `loss_fn(output)`, by default a
    fixed random weighted sum of the outputs).

    The model and inputs are copied, never changed. Both copies run in eval mode (dropout would
    draw different random numbers on each side) unless `train=True`, from the same seed; forward
    alone runs under no_grad, as inference does. A row fails when its relative MSE (MSE / variance
    of CPU's values) is over `threshold` (TorchTPU's 0.10 by default; 1e-6 is float32-tight), its
    shape or dtype differs, it is non-finite where CPU's is not, or it exists on one side only.
    """
    kwargs = kwargs or {}
    cpu_model = copy.deepcopy(model).cpu().train(train)
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu, cpu_grads = _run(cpu_model, inputs, kwargs, "cpu", backward, loss_fn)
    with _mode(mode) as ctx:
        tpu, tpu_grads = _run(tpu_model, inputs, kwargs, "tpu", backward, loss_fn)
    rows = [_compare(n, "output", cpu.outputs.get(n), tpu.outputs.get(n), threshold)
            for n in [*cpu.outputs, *(n for n in tpu.outputs if n not in cpu.outputs)]]
    if backward:
        rows += _grad_rows(cpu_grads, tpu_grads, cpu.finished, threshold)
    return CheckResult(rows, dict(tpu.fallbacks), threshold, ctx.kind.value)


def _table(result: CheckResult) -> str:
    first = result.first_failure
    head = ("", "layer", "kind", "shape", "rel MSE", "max |diff|", "status")
    body = [(">>" if r is first else "", r.name, r.kind, "x".join(map(str, r.shape)) or "scalar",
             f"{r.rel_mse:.2e}", f"{r.max_abs:.2e}", ("ok" if r.ok else "FAIL") + (f": {r.note}" if r.note else ""))
            for r in result.rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head) - 1)]
    lines = [f"deferfuse.check: tpu ({result.mode}) against CPU, relative MSE threshold {result.threshold:g}",
             *("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1] for line in [head, *body])]
    if first is None:
        lines.append(f"all {len(result.rows)} rows pass")
    else:
        failing = sum(not r.ok for r in result.rows)
        lines.append(f"{failing} of {len(result.rows)} rows fail; first: {first.name} ({first.kind})")
    if result.fallbacks:
        lines.append("CPU fallbacks on tpu (op: layers):")
        lines += [f"  {op}: {', '.join(layers)}" for op, layers in result.fallbacks.items()]
    else:
        lines.append("no CPU fallbacks")
    return "\n".join(lines)
