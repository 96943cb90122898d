"""What the device's XLA lacks: calls with a lowering that the device cannot run, per op and dtype.

A lowering is pure JAX and compiles for every backend, but not every backend compiles every dtype.
A TPU has no native 64-bit types: XLA:TPU emulates float64 (as float32 pairs, device_dtypes.py) and
int64 for elementwise ops, reductions and float64 contractions, but it raised for float64 LU and
FFT (so `solve`, `inv`, `slogdet`, `fft`) and for int64 matrix products, and aborted the whole
process compiling complex128 (a Python complex number becomes one). Such a call must not reach a
program, where the whole flush would fail far from the user's line: it takes the CPU fallback
instead, counted and warned about under a reason that names the dtype and the device, or raises
NotImplementedError saying the same with DEFERFUSE_NO_CPU_FALLBACK=1. A result the device cannot
hold at all (complex128 on a TPU, device_dtypes.py) raises where its recipe is made, naming the op.

The table is per JAX platform and names lowering families by module. What is not listed runs on
the device; the TPU profile of the suite (docs/testing.md, the OpInfo float64 entries) is what
decides an entry, so a family joins or leaves the table on that evidence.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import target
from . import factorizations, fft, linalg
from .registry import LOWERINGS


class Limit(NamedTuple):
    module: str  # the lowering family, by the module its lowerings live in; "*" for every family
    dtypes: frozenset  # a call with a tensor (or Python number) of one of these dtypes cannot run on the device
    why: str


_WIDE = frozenset({torch.float64, torch.complex128})
LIMITS: dict[str, tuple[Limit, ...]] = {
    "tpu": (
        Limit(fft.__name__, _WIDE, "XLA:TPU's FFT takes float32 and complex64 only"),
        Limit(factorizations.__name__, _WIDE,
              "XLA:TPU has no 64-bit LU, Cholesky or triangular solve (JAX raised for float64 solve, inv and "
              "slogdet on a TPU)"),
        Limit(linalg.__name__, frozenset({torch.int64, torch.uint64}),
              "XLA:TPU has no 64-bit integer matrix product (its X64 rewriter raised UNIMPLEMENTED for mm, "
              "mv, bmm, dot and addmm)"),
        Limit("*", frozenset({torch.complex128}),
              "XLA:TPU takes a Python complex number as a complex128 operand, and complex128 programs aborted "
              "the whole process compiling (a failed CHECK in its float64 rewriter)"),
    ),
}

_REFUSED: dict = {}  # signature key -> reason, for calls already refused


def platform() -> str:
    return target.platform()


def lacks(func, key, args, kwargs) -> str | None:
    """Why the device cannot run this call (the fallback's reason), or None when it can. Asked
    once per new signature: a refused one is remembered under its key, an accepted one gets a
    recipe and is never asked about again. A Python complex number counts as complex128 (JAX
    passes it so). An output the device cannot hold at all (device_dtypes.py) is refused where its
    recipe is made (record.make_recipe), naming the op."""
    why = _REFUSED.get(key)
    if why is not None:
        return why
    where = platform()
    limits = LIMITS.get(where)
    if not limits:
        return None
    module = LOWERINGS[func].fn.__module__
    limits = [lim for lim in limits if lim.module in (module, "*")]
    ins = [x.dtype if isinstance(x, torch.Tensor) else torch.complex128
           for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor) or type(x) is complex]
    for limit in limits:
        for dtype in ins:
            if dtype in limit.dtypes:
                why = _REFUSED[key] = f"{str(dtype).removeprefix('torch.')} on a {where} device: {limit.why}"
                return why
    return None


def forget() -> None:
    """Drop remembered refusals (tests that pretend to be another platform)."""
    _REFUSED.clear()
