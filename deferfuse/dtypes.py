"""torch <-> JAX dtype mapping.

JAX's x64 mode is switched on before any array exists: without it int64 and float64 silently
become 32-bit, a defect users of other bridges hit (see docs/reference). bfloat16 crosses the
host boundary through ml_dtypes because torch cannot hand it to NumPy directly.
"""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

TORCH_TO_JAX: dict[torch.dtype, jnp.dtype] = {
    torch.float32: jnp.dtype("float32"),
    torch.float64: jnp.dtype("float64"),
    torch.float16: jnp.dtype("float16"),
    torch.bfloat16: jnp.dtype(ml_dtypes.bfloat16),
    torch.int8: jnp.dtype("int8"),
    torch.int16: jnp.dtype("int16"),
    torch.int32: jnp.dtype("int32"),
    torch.int64: jnp.dtype("int64"),
    torch.uint8: jnp.dtype("uint8"),
    torch.uint16: jnp.dtype("uint16"),
    torch.uint32: jnp.dtype("uint32"),
    torch.uint64: jnp.dtype("uint64"),
    torch.bool: jnp.dtype("bool"),
    torch.complex64: jnp.dtype("complex64"),
    torch.complex128: jnp.dtype("complex128"),
    torch.float8_e4m3fn: jnp.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(ml_dtypes.float8_e5m2),
}
JAX_TO_TORCH: dict[jnp.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}

# Dtypes NumPy cannot receive from torch directly; crossed as same-width integers.
_BITCAST_VIA = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.int8,
    torch.float8_e5m2: torch.int8,
}


# The half-precision types lowerings compute in float32 (CPU's kernels accumulate them that way).
HALF = (jnp.dtype(jnp.float16), jnp.dtype(ml_dtypes.bfloat16))


def compute_dtype(dtype):
    """The dtype a lowering computes a `dtype` value in: float32 for a half type, else itself."""
    return jnp.float32 if dtype in HALF else dtype


def up_half(x):
    """x in float32 if it is a half type, else unchanged."""
    return x.astype(jnp.float32) if x.dtype in HALF else x


def cast(x, jd):
    """x.astype(jd), with CPU's float-to-integer conversion where C++ leaves it undefined.

    XLA saturates out-of-range values and sends NaN to 0. CPU PyTorch converts through a 32-bit
    integer for the narrower types, whose bits are then kept: -1.0 as uint8 is 255 (image code
    relies on it), 200.0 as int8 is -56; NaN, infinities and values past the 32-bit range become
    INT_MIN there, and INT64_MIN for int64."""
    if x.dtype == jnp.bool_ and jnp.dtype(jd) != jnp.bool_:
        # XLA's algebraic simplifier rewrites convert(bool) * y as select(bool, y, 0), and
        # convert(bool) / broadcast(y) likewise: 0 where CPU's 0 * inf and 0 / 0 give NaN. The
        # barrier hides the convert from that rewrite (fuzzer seed 307: eq(a, False) / b).
        return lax.optimization_barrier(x.astype(jd))
    if jnp.issubdtype(x.dtype, jnp.complexfloating) and not jnp.issubdtype(jd, jnp.complexfloating):
        if jnp.dtype(jd) == jnp.bool_:
            return x != 0  # either part nonzero, as C++'s bool(complex); XLA looks at the real part
        x = jnp.real(x)  # CPU drops the imaginary part (with a warning), then converts the real one
    if not (jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(jd, jnp.integer)):
        return x.astype(jd)
    wide = jnp.dtype(jd).itemsize == 8
    it = jnp.int64 if wide else jnp.int32
    bound = float(2 ** (63 if wide else 31))
    if x.dtype.itemsize < 4:  # half types: the bound itself would overflow them
        x = x.astype(jnp.float32)
    bad = jnp.isnan(x) | (x >= bound) | (x < -bound)
    y = jnp.where(bad, jnp.iinfo(it).min, jnp.where(bad, 0, x).astype(it))
    return y.astype(jd)


def to_jax_dtype(dtype: torch.dtype) -> jnp.dtype:
    """A RuntimeError for a dtype JAX lacks (complex32), as PyTorch's kernels raise for a dtype
    they do not implement: a TypeError inside `half_tensor * (1+2j)` becomes Python's
    "unsupported operand type(s)", which hides the dtype."""
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise RuntimeError(f"deferfuse: dtype {dtype} is not supported on the tpu device") from None


def to_torch_dtype(dtype) -> torch.dtype:
    return JAX_TO_TORCH[jnp.dtype(dtype)]


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy array with t's logical contents (a copy whenever t's memory could change)."""
    t = t.detach()
    to_jax_dtype(t.dtype)  # a dtype JAX lacks: name it, where NumPy would say "unsupported ScalarType"
    via = _BITCAST_VIA.get(t.dtype)
    if via is not None:
        return t.contiguous().view(via).numpy().view(TORCH_TO_JAX[t.dtype])
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.numpy()


def numpy_to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    via = _BITCAST_VIA.get(dtype)
    a = np.asarray(a, order="C")  # (ascontiguousarray would turn 0-d into 1-d)
    if via is not None:
        return torch.from_numpy(a.view(TORCH_TO_JAX[via].type).copy()).view(dtype)
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


def is_floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


# Caches keyed by a call's signature hold what the call makes, which for factories and
# int-to-float promotions depends on torch's default dtype: each registers how to forget itself.
_FORGET: list = []


def on_default_dtype_change(forget) -> None:
    _FORGET.append(forget)


def default_dtype_changed() -> None:
    for forget in _FORGET:
        forget()
