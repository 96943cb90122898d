"""How this device's XLA computes against XLA:CPU, op by op: the numbers behind the TPU tolerances
(tests/opinfo_support.py, _TPU_F32_WIDE) and the TPU's dtype limits
(deferfuse/lowering/device_limits.py). Pure JAX, no torch, so it runs on a TPU host before the
torch bundle arrives (docs/testing.md, "On a TPU v5e").

    python tests/device_numerics.py f32      # float32 functions, in multiples of 1e-5 + 1e-5 * |x|
    python tests/device_numerics.py f64      # float64, complex128 and int64 ops: error, or what raised

The 64-bit pass compiles each op for the device in turn, and on a TPU complex128 division aborts
the whole process (a failed CHECK in XLA:TPU): pass op names after `f64` to run some only.
"""
import sys
import time

import jax
import jax.numpy as jnp
import jax.scipy.special as sp
import numpy as np
from jax import lax

jax.config.update("jax_enable_x64", True)
dev = jax.devices()[0]
cpu = jax.devices("cpu")[0]
rng = np.random.default_rng(0)


def f32():
    def u(lo, hi, n=20000): return rng.uniform(lo, hi, n).astype(np.float32)
    W = u(-9, 9); P = u(0.01, 9); O = u(-0.99, 0.99); G = u(1.01, 9)
    OPS = {"log": (jnp.log, P), "log10": (jnp.log10, P), "log2": (jnp.log2, P), "log1p": (jnp.log1p, P),
           "asinh": (jnp.arcsinh, W), "acosh": (jnp.arccosh, G), "atanh": (jnp.arctanh, O), "exp": (jnp.exp, W),
           "exp2": (jnp.exp2, W), "expm1": (jnp.expm1, W), "sin": (jnp.sin, W), "cos": (jnp.cos, W), "tan": (jnp.tan, O),
           "tanh": (jnp.tanh, W), "sinh": (jnp.sinh, W), "cosh": (jnp.cosh, W), "asin": (jnp.arcsin, O),
           "acos": (jnp.arccos, O), "atan": (jnp.arctan, W), "erf": (sp.erf, W), "erfc": (sp.erfc, W),
           "erfinv": (sp.erfinv, O), "lgamma": (sp.gammaln, P), "digamma": (sp.digamma, P), "sigmoid": (jax.nn.sigmoid, W),
           "sqrt": (jnp.sqrt, P), "rsqrt": (lax.rsqrt, P), "logit": (sp.logit, u(0.01, 0.99)), "sinc": (jnp.sinc, W),
           "i0": (sp.i0, W), "gelu": (lambda x: jax.nn.gelu(x, approximate=False), W), "silu": (jax.nn.silu, W),
           "softplus": (jax.nn.softplus, W), "reciprocal": (lambda x: 1 / x, P), "div": (lambda x: x / 3.7, W),
           "pow": (lambda x: x ** 2.5, P), "log_softmax": (lambda x: jax.nn.log_softmax(x.reshape(100, 200)), W),
           "cumsum": (jnp.cumsum, W), "sum": (jnp.sum, W), "mean": (jnp.mean, W)}
    for name, (fn, x) in OPS.items():
        try:
            ref = np.asarray(jax.jit(fn)(jax.device_put(x, cpu))).astype(np.float64)
            got = np.asarray(jax.jit(fn)(jax.device_put(x, dev))).astype(np.float64)
            ok = np.isfinite(ref)
            d = np.abs(got - ref)[ok]; r = np.abs(ref)[ok]
            factor = float(np.max(d / (1e-5 + 1e-5 * r)))
            rel = float(np.max(d / np.maximum(r, 1e-30)))
            print(f"{name:12s} x-tol {factor:8.2f}  max abs {d.max():.2e}  max rel {rel:.2e}", flush=True)
        except Exception as e:
            print(f"{name:12s} RAISED {type(e).__name__}: {str(e)[:150]}", flush=True)


def spd(n, dt):
    a = rng.standard_normal((n, n))
    return (a @ a.T + n * np.eye(n)).astype(dt)


def mat(n, dt):
    a = rng.standard_normal((n, n))
    if np.dtype(dt).kind == "c":
        a = a + 1j * rng.standard_normal((n, n))
    return a.astype(dt)


def vec(n, dt, lo=-3, hi=3):
    a = rng.uniform(lo, hi, n)
    if np.dtype(dt).kind == "c":
        a = a + 1j * rng.uniform(lo, hi, n)
    return a.astype(dt)


CASES = []  # (name, fn, inputs)


def case(name, fn, *arrays):
    CASES.append((name, fn, arrays))


for dt in (np.float64, np.complex128):
    t = np.dtype(dt).name
    case(f"add {t}", lambda a, b: a + b, vec(64, dt), vec(64, dt))
    case(f"mul {t}", lambda a, b: a * b, vec(64, dt), vec(64, dt))
    case(f"div {t}", lambda a, b: a / b, vec(64, dt), vec(64, dt, 1, 3))
    case(f"exp {t}", jnp.exp, vec(64, dt))
    case(f"log {t}", jnp.log, vec(64, dt, 0.1, 5))
    case(f"sqrt {t}", jnp.sqrt, vec(64, dt, 0.1, 5))
    case(f"sin {t}", jnp.sin, vec(64, dt))
    case(f"tanh {t}", jnp.tanh, vec(64, dt))
    case(f"sum {t}", jnp.sum, vec(4096, dt))
    case(f"cumsum {t}", jnp.cumsum, vec(512, dt))
    case(f"matmul {t}", lambda a, b: jnp.matmul(a, b, precision="highest"), mat(64, dt), mat(64, dt))
    case(f"matmul-default {t}", lambda a, b: a @ b, mat(64, dt), mat(64, dt))
    case(f"fft {t}", jnp.fft.fft, vec(64, dt))
    case(f"lu {t}", lambda a: lax.linalg.lu(a)[0], mat(16, dt))
    case(f"tri_solve {t}", lambda a, b: lax.linalg.triangular_solve(jnp.tril(a) + 16 * jnp.eye(16, dtype=a.dtype), b, left_side=True, lower=True), mat(16, dt), mat(16, dt))
    case(f"cholesky {t}", lambda a: lax.linalg.cholesky(a), spd(16, np.float64).astype(dt))
    case(f"inv {t}", jnp.linalg.inv, mat(16, dt) + 16 * np.eye(16))
    case(f"abs {t}", jnp.abs, vec(64, dt))
for name, fn in [("erf", jax.scipy.special.erf), ("expm1", jnp.expm1), ("log1p", jnp.log1p), ("atan2", None),
                 ("pow", None), ("lgamma", jax.scipy.special.gammaln), ("digamma", jax.scipy.special.digamma),
                 ("erfinv", jax.scipy.special.erfinv), ("sigmoid", jax.nn.sigmoid), ("cos", jnp.cos),
                 ("asin", jnp.arcsin), ("sinh", jnp.sinh), ("rsqrt", lax.rsqrt)]:
    if name == "atan2":
        case("atan2 float64", jnp.arctan2, vec(64, np.float64), vec(64, np.float64))
    elif name == "pow":
        case("pow float64", jnp.power, vec(64, np.float64, 0.1, 3), vec(64, np.float64))
    elif name in ("erfinv", "asin"):
        case(f"{name} float64", fn, vec(64, np.float64, -0.99, 0.99))
    elif name in ("lgamma", "digamma", "rsqrt", "log1p"):
        case(f"{name} float64", fn, vec(64, np.float64, 0.1, 5))
    else:
        case(f"{name} float64", fn, vec(64, np.float64))
case("sort float64", jnp.sort, vec(512, np.float64))
case("argmax float64", jnp.argmax, vec(4096, np.float64))
case("conv float64", lambda x, w: lax.conv(x, w, (1, 1), "SAME"), rng.standard_normal((1, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3)))
big = np.array([2**40 + 7, -(2**41) + 3, 2**50, 123456789012], np.int64)
case("int64 add", lambda a, b: a + b, big, big[::-1].copy())
case("int64 mul", lambda a, b: a * b, np.array([3, 2**20 + 1, -7, 2**31], np.int64), np.array([2**30 + 5, 2**20 - 1, 2**33, 3], np.int64))
case("int64 floordiv", lambda a, b: a // b, big, np.array([3, -7, 2**20 + 1, 1000], np.int64))
case("int64 matmul", lambda a, b: a @ b, np.arange(12, dtype=np.int64).reshape(3, 4), np.arange(8, dtype=np.int64).reshape(4, 2))
case("int64 cumsum", jnp.cumsum, np.arange(2**20, dtype=np.int64) * 4099)
case("f64 tiny", lambda a: a * 1e-300, np.array([1e-10, 3.0], np.float64))
case("f64 huge", lambda a: a * 1e300, np.array([1e7, 3.0], np.float64))
case("f64 eps", lambda a: (a + 1e-15) - a, np.array([1.0, 2.0], np.float64))


def f64(which):
    for name, fn, arrays in CASES:
        if which and not any(w in name for w in which):
            continue
        t0 = time.perf_counter()
        try:
            ref = np.asarray(jax.jit(fn)(*[jax.device_put(a, cpu) for a in arrays]))
            out = np.asarray(jax.jit(fn)(*[jax.device_put(a, dev) for a in arrays]))
            dt = time.perf_counter() - t0
            if out.dtype != ref.dtype:
                print(f"{name:28s} DTYPE {out.dtype} vs {ref.dtype}", flush=True)
            if np.issubdtype(ref.dtype, np.integer):
                bad = int((out != ref).sum())
                print(f"{name:28s} int mismatches {bad}/{ref.size} {dt:.1f}s", flush=True)
            else:
                scale = np.maximum(np.abs(ref), 1e-300)
                err = np.abs(out - ref) / np.maximum(scale, np.abs(ref).max() * 1e-12)
                print(f"{name:28s} max rel err {float(np.nanmax(err)):.2e} nan-mismatch {int((np.isnan(out) != np.isnan(ref)).sum())} {dt:.1f}s", flush=True)
        except Exception as e:
            print(f"{name:28s} RAISED {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    print("device", dev.platform, getattr(dev, "device_kind", ""), flush=True)
    if sys.argv[1:2] == ["f32"]:
        f32()
    elif sys.argv[1:2] == ["f64"]:
        f64(sys.argv[2:])
    else:
        sys.exit(__doc__)
