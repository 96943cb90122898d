"""The lowering table: one small decorated function per ATen overload.

A lowering takes JAX arrays and Python (or traced) scalars in the ATen argument order and returns
JAX arrays. It never sees torch tensors, the graph, the cache or the executors, so the same
function serves Strict, Debug and DeferAndFuse. Everything else about the op is declared in the
decorator, in one statement:

- `family`: what the fuser and the report group it with (elementwise, reduction, matmul, ...),
  and nothing else.
- `promote`: a PyTorch type-promotion kind; inputs are cast to the computation dtype (float32
  for half types, as CPU PyTorch computes them) and the result to the result dtype.
- `static`: Scalar arguments whose *value* matters to the program (a norm's order, an
  exponent); every other Scalar is a runtime input so a changing value never recompiles.
- `meta`: `(meta_args, meta_kwargs) -> meta outputs`, for the few ops whose PyTorch meta kernel is
  missing (the GRU cell, some fused optimizers) or fails (the LSTM cell without biases).
- `runtime`: `float` arguments (which are otherwise static, like a norm's `eps`) that are runtime
  inputs instead: an optimizer's learning rate, which a scheduler changes every step.
- `supports`: a predicate over meta arguments; calls outside it take the CPU fallback.
- `rng=True`: the op gets a fresh JAX key as keyword `key`.
- `ctx=True`: the function's first argument is a `LowerCtx` (output avals, meta inputs).
- `meta_fix`: `(args, kwargs, meta_outputs) -> meta_outputs`, for the few ops whose meta kernel
  disagrees with CPU PyTorch (the oracle) about an output dtype or layout.
- `precision`: the op contracts float32 operands (a dot or a convolution), so it is traced at the
  float32 matmul precision of its call (precision.py); by default the matmul and conv families.
- `probe`: which of CPU's argument checks that meta kernels miss are rehearsed on CPU before the
  op is recorded (probe.needs_cpu_probe): "elementwise" (in-place result casts, bitwise ops,
  integer inputs, complex order), "reduction" (integer inputs, complex order), "index" (a
  floating index, a source of another dtype), "random" (argument ranges), "named" (only the
  ops meta.py names: class targets, sorts, softmaxes), or None, for the few ops CUDA takes in
  dtypes CPU refuses (an integer `histc`): on tpu, what CUDA runs works. By default the rule of
  the same name as the family where there is one, else "named".

Registering the same overload twice is an error at import.
"""
from __future__ import annotations

import sys

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

aten = torch.ops.aten

PROMOTE = {
    "default": ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
    "no_opmath": ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH,
    "int_to_float": ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT,
    "always_bool": ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL,
    "complex_to_float": ELEMENTWISE_TYPE_PROMOTION_KIND.COMPLEX_TO_FLOAT,
    "bool_to_long": ELEMENTWISE_TYPE_PROMOTION_KIND.BOOL_TO_LONG,
}

FAMILIES = frozenset(
    {"elementwise", "reduction", "matmul", "conv", "norm", "loss", "index", "view", "creation", "random", "foreach",
     "misc"}
)
PROBES = frozenset({"elementwise", "reduction", "index", "random", "named"})
_DEFAULT = object()


@dataclass(frozen=True)
class Lowering:
    op: Any
    fn: Callable
    family: str
    promote: str | None
    promote_args: tuple[str, ...] | None
    static: tuple[str, ...]
    supports: Callable | None
    rng: bool
    ctx: bool
    meta_fix: Callable | None = None
    runtime: tuple[str, ...] = ()
    meta: Callable | None = None
    probe: str | None = "named"
    precision: bool = False
    # deferfuse's own (a module of deferfuse.lowering), so fixed by deferfuse's source: programs
    # holding it may be stored on disk under their key (cache/stored.py); a jax_op's runs the
    # user's function, which may change between runs under the same name
    portable: bool = False


LOWERINGS: dict[Any, Lowering] = {}


def bound(op, args, kwargs) -> dict:
    """A call's arguments by schema name, defaults filled in (for `supports=` and `meta=` hooks)."""
    got = {a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}
    got.update(zip([a.name for a in op._schema.arguments], args), **kwargs)
    return got


def lowering(
    *ops,
    family: str = "elementwise",
    promote: str | None = None,
    promote_args: tuple[str, ...] | None = None,
    static: tuple[str, ...] = (),
    supports: Callable | None = None,
    rng: bool = False,
    ctx: bool = False,
    meta_fix: Callable | None = None,
    runtime: tuple[str, ...] = (),
    meta: Callable | None = None,
    probe: str | None = _DEFAULT,  # type: ignore[assignment]
    precision: bool | None = None,
):
    if family not in FAMILIES:
        raise ValueError(f"unknown lowering family {family!r}")
    if promote is not None and promote not in PROMOTE:
        raise ValueError(f"unknown promotion kind {promote!r}")
    if probe is _DEFAULT:
        probe = family if family in PROBES else "named"
    elif probe is not None and probe not in PROBES:
        raise ValueError(f"unknown probe {probe!r}")
    contracts = family in ("matmul", "conv") if precision is None else precision
    # registered by a module of this package (a lowering family), not by jax_op or a user
    portable = sys._getframe(1).f_globals.get("__name__", "").startswith(__package__ + ".")

    def register(fn):
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"deferfuse: {op} has two lowerings ({LOWERINGS[op].fn.__name__}, {fn.__name__})")
            LOWERINGS[op] = Lowering(op, fn, family, promote, promote_args, tuple(static), supports, rng, ctx, meta_fix,
                                   tuple(runtime), meta, probe, contracts, portable)
        return fn

    return register


class LowerCtx:
    """What a lowering may ask about its call: output avals and meta versions of its inputs."""

    __slots__ = ("out_shapes", "out_dtypes", "meta_args", "meta_kwargs", "key")

    def __init__(self, out_shapes, out_dtypes, meta_args, meta_kwargs, key=None):
        self.out_shapes = out_shapes
        self.out_dtypes = out_dtypes
        self.meta_args = meta_args
        self.meta_kwargs = meta_kwargs
        self.key = key

    @property
    def out_dtype(self) -> torch.dtype:
        return self.out_dtypes[0]

    @property
    def out_shape(self) -> tuple:
        return self.out_shapes[0]


def promotion_dtypes(kind: str, participants: list) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) by PyTorch's rules; participants are meta tensors/scalars."""
    return elementwise_dtypes(*participants, type_promotion_kind=PROMOTE[kind])
