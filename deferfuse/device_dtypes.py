"""What a device's memory holds faithfully, per dtype: the check on every value put on the device.

XLA:TPU has no 64-bit floating types. It keeps a float64 as a pair of float32s: about 48 bits of
mantissa and float32's exponent range, so a round trip of 1e-3 is not exact and 1e300 becomes inf
(both seen on a v5e in the device profile, docs/testing.md). It does not keep complex128 intact at
all: programs reading complex128 values gave wrong results or failed a RET_CHECK compiling, and
dividing them aborted the process. So on a TPU a complex128 tensor is refused where it would be
made, naming the op, the dtype and the device; a float64 one is held, and the first of them warns
once with what the emulation keeps. Elsewhere (CPU, GPU) every dtype is held as it is.
"""
from __future__ import annotations

import warnings

import torch

from . import sources, target

REFUSED: dict[str, dict[torch.dtype, str]] = {
    "tpu": {
        torch.complex128: "XLA:TPU does not keep complex128 values intact (reads gave wrong values or failed to "
                          "compile, division aborted the process); use complex64, or keep this tensor on the CPU",
    },
}
EMULATED: dict[str, dict[torch.dtype, str]] = {
    "tpu": {
        torch.float64: "XLA:TPU holds a float64 as a pair of float32s: about 48 bits of mantissa (relative error "
                       "up to ~4e-15) and float32's exponent range (magnitudes above ~3.4e38 become inf, below "
                       "~1.2e-38 zero)",
    },
}
_warned: set = set()


def check(dtype: torch.dtype, op: str | None = None) -> None:
    """Raise NotImplementedError (PyTorch's error for what a backend lacks) when a value of `dtype`
    cannot be held here; warn once when it is held emulated."""
    where = target.platform()  # read at each call: tests pretend to be a TPU
    why = REFUSED.get(where, {}).get(dtype)
    name = str(dtype).removeprefix("torch.")
    if why is not None:
        what = f"{op}: " if op else ""
        raise NotImplementedError(f"deferfuse: {what}{name} tensors cannot be held on a {target.NAME} device "
                                  f"({where}): {why}")
    note = EMULATED.get(where, {}).get(dtype)
    if note is not None and (where, dtype) not in _warned:
        _warned.add((where, dtype))
        filename, line, _ = sources.parts(sources.user_frame(2))
        warnings.warn_explicit(f"deferfuse: {name} on a {target.NAME} device ({where}) is emulated: {note}. "
                               "Results agree with CPU to that precision, not bit for bit.", UserWarning, filename, line)
