"""Pointwise ops: unary math, arithmetic, comparisons, selection.

Type promotion is declared (`promote=`), so bodies only hold the math. Where PyTorch's CPU
semantics differ from the obvious JAX call (integer division, lerp, pow with integer exponents),
the body says how it matches CPU.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..dtypes import cast, to_jax_dtype, HALF as _HALF
from ..meta import run_meta
from .registry import aten, lowering


def _unary(op, fn, promote="default"):
    lowering(op, promote=promote)(fn)


def signbit(x):
    """jnp.signbit reads a float64's sign by shifting its 64-bit pattern, which XLA:TPU's 64-bit
    emulation fails to compile (an s32/u32 shift); narrowing to float32 first keeps every sign,
    of zeros, infinities and numbers too small for float32 included, so it is exact everywhere."""
    if x.dtype == jnp.float64:
        x = x.astype(jnp.float32)
    return jnp.signbit(x)


def copysign(x, y):
    """jnp.copysign, through the signbit above: x negated where the two signs differ. Not through
    abs, which XLA:TPU's float64 leaves negative for -0.0 and for the negatives too small for
    float32 that it holds as -0.0 (a TPU v5e gave copysign(-1e-300, inf) a set sign bit)."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    dt = jnp.result_type(x, y)
    x = x.astype(dt)
    return jnp.where(signbit(x) != signbit(y.astype(dt)), -x, x)


# --- unary ---------------------------------------------------------------------------------------

for _op, _fn in [
    (aten.exp.default, jnp.exp),
    (aten.exp2.default, jnp.exp2),
    (aten.expm1.default, jnp.expm1),
    (aten.log.default, jnp.log),
    (aten.log2.default, jnp.log2),
    (aten.log10.default, jnp.log10),
    (aten.log1p.default, jnp.log1p),
    (aten.sin.default, jnp.sin),
    (aten.cos.default, jnp.cos),
    (aten.tan.default, jnp.tan),
    (aten.asin.default, jnp.arcsin),
    (aten.acos.default, jnp.arccos),
    (aten.atan.default, jnp.arctan),
    (aten.sinh.default, jnp.sinh),
    (aten.cosh.default, jnp.cosh),
    (aten.tanh.default, jnp.tanh),
    (aten.asinh.default, jnp.arcsinh),
    (aten.acosh.default, jnp.arccosh),
    (aten.atanh.default, jnp.arctanh),
    (aten.sqrt.default, jnp.sqrt),
    (aten.rsqrt.default, lax.rsqrt),
    (aten.sigmoid.default, jax.nn.sigmoid),
    (aten.erf.default, jax.scipy.special.erf),
    (aten.erfc.default, jax.scipy.special.erfc),
    (aten.erfinv.default, jax.scipy.special.erfinv),
    (aten.lgamma.default, jax.scipy.special.gammaln),
    (aten.reciprocal.default, lambda x: _true_divide(1, x) if jnp.iscomplexobj(x) else jnp.reciprocal(x)),
    (aten.sinc.default, jnp.sinc),
    (aten.deg2rad.default, jnp.deg2rad),
    (aten.rad2deg.default, jnp.rad2deg),
]:
    _unary(_op, _fn, promote="int_to_float")

for _op, _fn in [
    (aten.neg.default, jnp.negative),
    (aten.floor.default, jnp.floor),
    (aten.ceil.default, jnp.ceil),
    (aten.trunc.default, jnp.trunc),
    (aten.frac.default, lambda x: x - jnp.trunc(x)),
    (aten.bitwise_not.default, jnp.invert),
]:
    _unary(_op, _fn)

for _op, _fn in [
    (aten.isnan.default, jnp.isnan),
    (aten.isinf.default, jnp.isinf),
    (aten.isfinite.default, jnp.isfinite),
    (aten.isposinf.default, jnp.isposinf),
    (aten.isneginf.default, jnp.isneginf),
    (aten.signbit.default, signbit),
    (aten.logical_not.default, jnp.logical_not),
]:
    _unary(_op, _fn, promote=None)


@lowering(aten.digamma.default, promote="int_to_float")
def digamma(x):
    """CPU's poles at zero are signed infinities (-inf at +0, +inf at -0); JAX gives NaN there."""
    return jnp.where(x == 0, copysign(jnp.inf, -x).astype(x.dtype), jax.scipy.special.digamma(x))


@lowering(aten.sign.default, promote="default")
def sign(x):
    """CPU gives 0 for NaN and +0 for -0 (jnp.sign keeps both); a bool is its own sign."""
    if x.dtype == jnp.bool_:
        return x
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lowering(aten.abs.default, promote="complex_to_float")
def absolute(x):
    """float64 through its sign bit (see copysign): XLA:TPU's float64 abs keeps -0.0 negative."""
    if x.dtype == jnp.float64:
        return jnp.where(signbit(x), -x, x)
    return jnp.abs(x)


@lowering(aten.round.default, promote="default")
def round_half_even(x):
    """Half to even, like CPU PyTorch."""
    return jnp.round(x) if jnp.issubdtype(x.dtype, jnp.inexact) else x


@lowering(aten.round.decimals, promote="default")
def round_decimals(x, *, decimals=0):
    return jnp.round(x, decimals)


def cpu_max(a, b):
    """CPU's max: NaN if either is NaN, else `b if a < b else a`, so max(-0.0, 0.0) is -0.0
    where XLA's max gives 0.0 (relu_(-0.0) is -0.0 on CPU: 1 / it is -inf; fuzzer seed 897)."""
    out = jnp.where(a < b, b, a)
    return jnp.where(jnp.isnan(b), b, out) if jnp.issubdtype(jnp.result_type(out), jnp.inexact) else out


def cpu_min(a, b):
    """CPU's min: NaN if either is NaN, else `b if a > b else a` (min(0.0, -0.0) is 0.0)."""
    out = jnp.where(a > b, b, a)
    return jnp.where(jnp.isnan(b), b, out) if jnp.issubdtype(jnp.result_type(out), jnp.inexact) else out


def _cpu_fmax(a, b):
    """fmax: the number where one is NaN, else CPU's max rule for signed zeros."""
    return jnp.where(jnp.isnan(b), a, jnp.where(jnp.isnan(a) | (a < b), b, a))


def _cpu_fmin(a, b):
    return jnp.where(jnp.isnan(b), a, jnp.where(jnp.isnan(a) | (a > b), b, a))


@lowering(aten.relu.default, promote="default")
def relu(x):
    return jnp.where(x < 0, jnp.zeros((), x.dtype), x)  # -0.0 and NaN stay, as on CPU


@lowering(aten.gelu.default, promote="default")
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + jnp.tanh(inner))
    return 0.5 * x * (1.0 + jax.scipy.special.erf(x * (1.0 / math.sqrt(2.0))))


@lowering(aten.silu.default, promote="default")
def silu(x):
    return x * jax.nn.sigmoid(x)


@lowering(aten.hardtanh.default, promote="default")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return cpu_min(cpu_max(x, min_val), max_val)


@lowering(aten.leaky_relu.default, promote="default")
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lowering(aten.elu.default, promote="default")
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * alpha * scale)


@lowering(aten.softplus.default, promote="default")
def softplus(x, beta=1.0, threshold=20.0):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@lowering(aten.logit.default, promote="int_to_float")
def logit(x, eps=None):
    if eps is not None:
        x = jnp.clip(x, eps, 1.0 - eps)
    return jnp.log(x / (1.0 - x))


# --- binary arithmetic ---------------------------------------------------------------------------


@lowering(aten.add.Tensor, aten.add.Scalar, promote="default")
def add(x, y, *, alpha=1):
    if x.dtype == jnp.bool_:
        return jnp.logical_or(x, jnp.logical_and(y, alpha))
    return x + y * alpha if not (isinstance(alpha, int) and alpha == 1) else x + y


@lowering(aten.sub.Tensor, aten.sub.Scalar, promote="default")
def sub(x, y, *, alpha=1):
    return x - y * alpha if not (isinstance(alpha, int) and alpha == 1) else x - y


@lowering(aten.rsub.Tensor, aten.rsub.Scalar, promote="default")
def rsub(x, y, *, alpha=1):
    return y - x * alpha


@lowering(aten.mul.Tensor, aten.mul.Scalar, promote="default")
def mul(x, y):
    if x.dtype == jnp.bool_:
        return jnp.logical_and(x, y)
    return x * y


@lowering(aten.div.Tensor, aten.div.Scalar, promote="int_to_float")
def div(x, y):
    return _true_divide(x, y)


def _true_divide(x, y):
    """x / y, with c10::complex's division for complex numbers (Smith's algorithm, and each part
    over the magnitudes of a zero divisor), which CPU's kernels use: XLA's follows C99, where
    `1 / (inf+infj)` is 0 and CPU's is NaN (seeds 4091, 6076)."""
    if not (jnp.iscomplexobj(x) or jnp.iscomplexobj(y)):
        return x / y
    dt = jnp.result_type(x, y)
    a, b = jnp.real(x), jnp.imag(x)
    c, d = jnp.real(y), jnp.imag(y)
    abs_c, abs_d = jnp.abs(c), jnp.abs(d)
    # c10 multiplies by 1 / (c + d * rat); dividing instead differs by rounding only, and keeps
    # a huge divisor's reciprocal from becoming a subnormal, which XLA:CPU flushes to zero
    rat = d / c
    den = c + d * rat
    re, im = (a + b * rat) / den, (b - a * rat) / den  # |c| >= |d|
    zero = (abs_c == 0) & (abs_d == 0)
    re, im = jnp.where(zero, a / abs_c, re), jnp.where(zero, b / abs_d, im)
    rat2 = c / d
    den2 = d + c * rat2
    first = abs_c >= abs_d
    re = jnp.where(first, re, (a * rat2 + b) / den2)
    im = jnp.where(first, im, (b * rat2 - a) / den2)
    return lax.complex(re, im).astype(dt)


def _binary_layout(args, kwargs, leaves):
    """The meta kernels of floor division, copysign and xlogy lay the result out unlike CPU's
    TensorIterator, which follows its inputs (a transposed x gives a transposed x // y) as add's
    meta kernel does."""
    out = leaves[0]
    try:
        like = run_meta(aten.add.Tensor, tuple(args[:2]), {})
    except Exception:  # noqa: BLE001 - the op's own checks have already run
        return leaves
    if tuple(like.shape) != tuple(out.shape):
        return leaves
    return [torch.empty_strided(out.shape, like.stride(), dtype=out.dtype, device="meta")]


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode, promote="default", ctx=True, meta_fix=_binary_layout)
def div_mode(ctx, x, y, *, rounding_mode=None):
    """Integers divide exactly (C truncation or Python floor). CPU's trunc mode for half types
    rounds the quotient to the half type *before* truncating (17.95 -> 18), so we do too."""
    if rounding_mode is None:
        # integers and bools are promoted here, through dtypes.cast (jnp's own conversion of a
        # bool lets XLA fold `convert(False) / 0` to 0 where CPU gives NaN: fuzzer seed 488)
        out = to_jax_dtype(ctx.out_dtype)
        x, y = (v if jnp.issubdtype(jnp.result_type(v), jnp.inexact) else cast(jnp.asarray(v), out) for v in (x, y))
        return _true_divide(x, y)
    if jnp.issubdtype(x.dtype, jnp.integer):
        if jnp.result_type(y) == jnp.bool_:  # `div(int_tensor, True, ...)`: lax.div takes no bool (5859)
            y = cast(jnp.asarray(y), x.dtype)
        if rounding_mode == "trunc":
            return lax.div(*jnp.broadcast_arrays(x, y))
        return jnp.floor_divide(x, y)
    if rounding_mode == "trunc":
        q = x / y
        out = to_jax_dtype(ctx.out_dtype)
        if out != q.dtype and out in _HALF:
            q = q.astype(out).astype(q.dtype)
        return jnp.trunc(q)
    return _floor_div(x, y)


def _floor_div(x, y):
    """CPU's floating floor division (c10's div_floor_floating), not NumPy's: a zero quotient takes
    the sign of x / y (0 / -2 is -0.0, -0.0 / 2 is -0.0, and `3 // q` then gives CPU's infinity)."""
    dt = jnp.result_type(x, y)
    if not jnp.issubdtype(dt, jnp.floating):
        return jnp.floor_divide(x, y)
    x, y = jnp.broadcast_arrays(cast(jnp.asarray(x), dt), cast(jnp.asarray(y), dt))  # a bool divisor too
    mod = lax.rem(x, y)
    div = (x - mod) / y
    div = jnp.where((mod != 0) & ((y < 0) != (mod < 0)), div - 1, div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    quotient = x / y
    return jnp.where(y == 0, quotient, jnp.where(div != 0, floor, copysign(jnp.zeros_like(div), quotient)))


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar, promote="default", meta_fix=_binary_layout)
def floor_divide(x, y):
    return _floor_div(x, y)


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, promote="default")
def remainder(x, y):
    return jnp.remainder(x, y)


@lowering(aten.remainder.Scalar_Tensor, promote="default")
def remainder_scalar_tensor(x, y):
    return jnp.remainder(x, y)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar, promote="default")
def fmod(x, y):
    return jnp.fmod(x, y)


def _wrapping_pow(x, y):
    """x ** y (y >= 0) by binary exponentiation over every bit of y, wrapping as C++ does:
    jnp.power stops after six bits (any more would overflow), which is wrong where CPU's wrapped
    result shows (512 ** 512 is 0 on CPU, 1 in jnp.power: fuzzer seed 708)."""
    def step(_, carry):
        acc, base, e = carry
        return jnp.where((e & 1) != 0, acc * base, acc), base * base, e >> 1

    acc, _, _ = lax.fori_loop(0, jnp.iinfo(y.dtype).bits, step, (jnp.ones_like(x), x, y))
    return acc


def _int_pow(x, y):
    """CPU's integer pow: wraps on overflow; a negative exponent gives 0 except for bases 1 and -1."""
    if x.dtype == jnp.bool_:
        return jnp.logical_or(x, jnp.logical_not(y))
    x, y = jnp.broadcast_arrays(x, y)
    pos = _wrapping_pow(x, jnp.maximum(y, 0).astype(y.dtype))
    if not jnp.issubdtype(y.dtype, jnp.signedinteger):
        return pos
    one = jnp.ones((), x.dtype)
    odd = (y % 2) != 0
    neg = jnp.where(x == 1, one, jnp.where(x == -1, jnp.where(odd, -one, one), jnp.zeros((), x.dtype)))
    return jnp.where(y < 0, neg, pos)


def _complex_pow(x, y):
    """CPU's complex pow is exp(y * log(x)) in C99 arithmetic, so a zero base gives 0 for an exponent
    of positive real part and NaN for a zero exponent, where XLA's pow gives NaN and 1. The other
    zero-base cases: pure imaginary gives NaN in both; a negative real part gives inf+nanj on CPU,
    which XLA gives for some exponents and not others (nan+nanj for a tensor of -6: seed 893), so
    it is set here. An infinite imaginary part, whose result hangs on the zero's signs, is left
    to XLA."""
    y = jnp.asarray(y)
    dtype = jnp.result_type(x, y)
    zero = x == 0
    out = jnp.where(zero & (jnp.real(y) > 0) & ~jnp.isinf(jnp.imag(y)), jnp.zeros((), dtype), jnp.power(x, y))
    out = jnp.where(zero & (jnp.real(y) < 0) & ~jnp.isinf(jnp.imag(y)), jnp.full((), complex(math.inf, math.nan), dtype),
                    out)
    out = jnp.where(zero & (y == 0), jnp.full((), complex(math.nan, math.nan), dtype), out)
    # an infinite base to a finite exponent of negative real part: exp(-inf + i*t) is 0 in C99,
    # where XLA's pow gives NaN (seed 9030: inf ** (-1.5+1.5j))
    vanishes = jnp.isinf(jnp.abs(x)) & (jnp.real(y) < 0) & jnp.isfinite(y)
    return jnp.where(vanishes, jnp.zeros((), dtype), out)


@lowering(aten.pow.Tensor_Tensor, promote="default")
def pow_tt(x, y):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return _complex_pow(x, y)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.power(x, y)
    return _int_pow(x, y)


def _row_major(args, kwargs, leaves):
    """CPU's `number ** tensor` is laid out row-major whatever the exponent's layout (its kernel
    converts the exponent first); the meta kernel follows the exponent (seeds 8582, 9231)."""
    out = leaves[0]
    if out.is_contiguous():
        return leaves
    return [torch.empty(out.shape, dtype=out.dtype, device="meta")]


@lowering(aten.pow.Scalar, promote="default", meta_fix=_row_major)
def pow_scalar(x, exponent):
    """A number to tensor powers: the kind of the pair decides (`False ** float_tensor` is a float
    pow, 0 ** -1.5 = inf; the bool rule gave 0: fuzzer seed 3357)."""
    dt = jnp.result_type(x, exponent)
    if not jnp.issubdtype(dt, jnp.integer) and dt != jnp.bool_:
        x = cast(jnp.asarray(x), dt)
    if jnp.issubdtype(dt, jnp.complexfloating):
        return _complex_pow(x, exponent)
    if jnp.issubdtype(dt, jnp.inexact):
        return jnp.power(x, exponent)
    return _int_pow(jnp.asarray(x), exponent)


def _bool_pow_dtype(args, kwargs, leaves):
    """A bool tensor to a bool power stays bool on CPU (result_type(bool, bool)); the meta kernel
    says int64, as it does for an int exponent, where CPU agrees."""
    x, exponent = args[0], args[1] if len(args) > 1 else kwargs.get("exponent")
    if x.dtype == torch.bool and isinstance(exponent, bool):
        out = leaves[0]
        return [torch.empty_strided(out.shape, out.stride(), dtype=torch.bool, device="meta")]
    return leaves


@lowering(aten.pow.Tensor_Scalar, promote="default", static=("exponent",), ctx=True, meta_fix=_bool_pow_dtype)
def pow_ts(ctx, x, exponent):
    """A static exponent lets XLA use repeated multiplication for integers, exactly like CPU. The
    exponent is static, so promotion never saw it: x is cast to the result's computation dtype
    here (int ** 0.5 is float, bool ** 2 is int64)."""
    out = to_jax_dtype(ctx.out_dtype)
    x = x.astype(jnp.float32 if out in _HALF else out)
    if x.dtype == jnp.bool_:
        return x if exponent else jnp.ones_like(x)
    if isinstance(exponent, float) and exponent.is_integer() and abs(exponent) <= 64:
        exponent = int(exponent)
        if exponent < 0 and jnp.issubdtype(x.dtype, jnp.inexact):
            return 1.0 / lax.integer_pow(x, -exponent)
    if isinstance(exponent, int) and exponent >= 0:
        return lax.integer_pow(x, exponent)
    if exponent == 0.5:
        return jnp.sqrt(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return _int_pow(x, jnp.asarray(exponent, x.dtype))
    if isinstance(exponent, complex) and exponent.real > 0 and math.isfinite(exponent.imag):
        return _complex_pow(x, exponent)
    return jnp.power(x, exponent)


for _op, _fn in [
    (aten.maximum.default, cpu_max),
    (aten.minimum.default, cpu_min),
    (aten.fmax.default, _cpu_fmax),
    (aten.fmin.default, _cpu_fmin),
    (aten.atan2.default, jnp.arctan2),
    (aten.hypot.default, jnp.hypot),
    (aten.copysign.Tensor, copysign),
    (aten.copysign.Scalar, copysign),
    (aten.nextafter.default, jnp.nextafter),
    (aten.logaddexp.default, jnp.logaddexp),
    (aten.logaddexp2.default, jnp.logaddexp2),
]:
    lowering(_op, promote="int_to_float" if _op in (aten.atan2.default, aten.hypot.default, aten.copysign.Tensor,
                                                   aten.copysign.Scalar, aten.logaddexp.default,
                                                   aten.logaddexp2.default) else "default",
             meta_fix=_binary_layout if _op is aten.copysign.Tensor else None)(_fn)


@lowering(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self, promote="int_to_float",
          meta_fix=_binary_layout)
def xlogy(x, y):
    return jax.scipy.special.xlogy(x, y)


for _op, _fn in [
    (aten.bitwise_and.Tensor, jnp.bitwise_and),
    (aten.bitwise_and.Scalar, jnp.bitwise_and),
    (aten.bitwise_or.Tensor, jnp.bitwise_or),
    (aten.bitwise_or.Scalar, jnp.bitwise_or),
    (aten.bitwise_xor.Tensor, jnp.bitwise_xor),
    (aten.bitwise_xor.Scalar, jnp.bitwise_xor),
]:
    lowering(_op, promote="default")(_fn)


@lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
          aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar, promote="default")
def lshift(x, y):
    bits = x.dtype.itemsize * 8
    return jnp.where((y >= bits) | (y < 0), jnp.zeros((), x.dtype), jnp.left_shift(x, y.astype(x.dtype)))


@lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
          aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar, promote="default")
def rshift(x, y):
    bits = x.dtype.itemsize * 8
    y = y.astype(x.dtype)
    over = (y >= bits) | (y < 0)
    fill = jnp.where(x < 0, -1, 0).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.signedinteger) else 0
    return jnp.where(over, fill, jnp.right_shift(x, jnp.where(over, 0, y)))


for _op, _fn in [
    (aten.logical_and.default, jnp.logical_and),
    (aten.logical_or.default, jnp.logical_or),
    (aten.logical_xor.default, jnp.logical_xor),
]:
    lowering(_op)(_fn)

for _ops, _fn in [
    ((aten.eq.Tensor, aten.eq.Scalar), jnp.equal),
    ((aten.ne.Tensor, aten.ne.Scalar), jnp.not_equal),
    ((aten.lt.Tensor, aten.lt.Scalar), jnp.less),
    ((aten.le.Tensor, aten.le.Scalar), jnp.less_equal),
    ((aten.gt.Tensor, aten.gt.Scalar), jnp.greater),
    ((aten.ge.Tensor, aten.ge.Scalar), jnp.greater_equal),
]:
    lowering(*_ops, promote="always_bool")(_fn)


# --- selection, clamping, fused arithmetic ----------------------------------------------------------


@lowering(aten.where.self, promote="default", promote_args=("self", "other"))
def where(cond, x, y):
    return jnp.where(cond, x, y)


def _clamp_meta(args, kwargs):
    """CPU's clamp keeps a floating tensor's dtype and converts a complex bound with no imaginary
    part to it (`x.clamp(min=2+0j)`); the meta kernel promotes to complex. Other complex bounds
    raise in the CPU rehearsal before this runs."""
    x, bounds = args[0], [*args[1:3]] + [kwargs.get(k) for k in ("min", "max")[len(args) - 1:]]
    bounds = (bounds + [None, None])[:2]
    if x.dtype.is_floating_point and any(type(b) is complex for b in bounds):
        bounds = [b.real if type(b) is complex else b for b in bounds]
    return aten.clamp(x, *bounds)


@lowering(aten.clamp.default, promote="default", meta=_clamp_meta)
def clamp(x, min=None, max=None):
    if jnp.iscomplexobj(min) and not jnp.iscomplexobj(x):
        min = jnp.real(min)
    if jnp.iscomplexobj(max) and not jnp.iscomplexobj(x):
        max = jnp.real(max)
    if min is not None:
        x = cpu_max(x, min)
    if max is not None:
        x = cpu_min(x, max)
    return x


@lowering(aten.clamp.Tensor, promote="default")
def clamp_tensor(x, min=None, max=None):
    return clamp(x, min, max)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor, promote="default")
def clamp_min(x, min):
    return cpu_max(x, min)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor, promote="default")
def clamp_max(x, max):
    return cpu_min(x, max)


def _masked_fill_meta(args, kwargs):
    """CPU's kernel takes only a bool mask (`x[uint8_mask] = v` reaches masked_fill_ with a uint8
    one); PyTorch's meta kernel takes any. The recipe builder replaces this error by CPU's own."""
    if args[1].dtype != torch.bool:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype {args[1].dtype}")
    x, value = args[0], args[2] if len(args) > 2 else kwargs.get("value")
    if type(value) is complex and not x.dtype.is_complex and (x.dtype == torch.bool or value.imag == 0):
        # CPU converts a complex fill value with no imaginary part, and any into bool (x != 0);
        # the meta kernel refuses every complex value into a real tensor
        value = bool(value) if x.dtype == torch.bool else value.real
    return aten.masked_fill(x, args[1], value)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor, meta=_masked_fill_meta)
def masked_fill(x, mask, value):
    # dtypes.cast takes a complex value into bool or a real type as CPU does (the meta kernel let
    # only CPU's cases through)
    return jnp.where(mask, cast(jnp.asarray(value), x.dtype), x)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor, promote="default")
def lerp(start, end, weight):
    """CPU PyTorch's two-sided formula, exact at weight 0 and 1."""
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


@lowering(aten.addcmul.default, promote="default", promote_args=("self", "tensor1", "tensor2"), ctx=True)
def addcmul(ctx, x, t1, t2, *, value=1):
    """`value` takes no part in the result type; for integer tensors CPU converts it to their
    type first (-1.5 is -1: seed 4050; a complex 2+0j is 2: seed 6177), and the product stays
    integer (a float `value` made it float32, rounding int64 values past 2^24)."""
    out = to_jax_dtype(ctx.out_dtype)
    if jnp.issubdtype(out, jnp.integer):
        value = cast(jnp.asarray(value), out)
    return x + value * t1 * t2


@lowering(aten.addcdiv.default, promote="int_to_float")
def addcdiv(x, t1, t2, *, value=1):
    """In CPU's order, `value * t1` first: a complex `t1 / 0` is infinite in both parts, and
    multiplying that by a real `value` makes NaN of 0 * inf where CPU's order does not (seed 6076)."""
    return x + _true_divide(value * t1, t2)


@lowering(aten.sigmoid_backward.default, promote="default")
def sigmoid_backward(grad, y):
    return grad * (1 - y) * y


@lowering(aten.tanh_backward.default, promote="default")
def tanh_backward(grad, y):
    return grad * (1 - y * y)


@lowering(aten.threshold_backward.default, promote="default")
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@lowering(aten.threshold.default, promote="default")
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, value, x)


@lowering(aten.gelu_backward.default, promote="default")
def gelu_backward(grad, x, *, approximate="none"):
    _, vjp = jax.vjp(lambda v: gelu(v, approximate=approximate), x)
    return vjp(grad)[0]


@lowering(aten.silu_backward.default, promote="default")
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lowering(aten.polar.default)
def polar(abs, angle):
    return jax.lax.complex(*jnp.broadcast_arrays(abs * jnp.cos(angle), abs * jnp.sin(angle)))


@lowering(aten.complex.default)
def complex_from_parts(real, imag):
    # lax.complex, not real + 1j * imag: an infinite imag would make the real part NaN
    return jax.lax.complex(*jnp.broadcast_arrays(real, imag))


@lowering(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    """PyTorch's decomposition refuses complex inputs (isneginf), CPU's kernel takes them and
    replaces in the real and imaginary parts; computed in x's own dtype, whose largest finite
    value replaces +inf (float32's would overflow bfloat16 back to inf)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)
