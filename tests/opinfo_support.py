"""Running PyTorch's OpInfo samples on CPU and on "tpu", and comparing.

Kept apart from the test module so `python -m deferfuse.coverage` can reuse it to count passes.
"""
from __future__ import annotations

import contextlib
import glob
import os
import warnings
from dataclasses import dataclass

import torch

import deferfuse
from deferfuse.lowering import device_limits

warnings.filterwarnings("ignore", category=UserWarning)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

HERE = os.path.dirname(os.path.abspath(__file__))

MODES = ("strict", "debug", "defer_and_fuse")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "int64": torch.int64,
          "bool": torch.bool, "complex64": torch.complex64}

# Ops whose values are random: compared on shape, dtype and determinism under manual_seed.
RANDOM_OPS = {
    "bernoulli", "normal", "rand_like", "randn_like", "randint_like", "randint", "multinomial", "uniform",
    "cauchy", "exponential", "geometric", "log_normal", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu", "randn", "rand", "randperm", "empty", "empty_like", "new_empty", "empty_strided",
    "new_empty_strided", "empty_permuted", "torch.empty", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "bernoulli", "poisson", "nn.functional.multi_head_attention_forward",
}
# Ops whose output is uninitialised memory: only shape and dtype can be compared.
UNINITIALISED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


def full_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def is_random(op, sample=None) -> bool:
    if op.name in RANDOM_OPS or full_name(op) in RANDOM_OPS:
        return True
    # ops that are random only for some samples (attention with dropout)
    return sample is not None and bool(sample.kwargs.get("dropout_p", 0))


def load_xfails(full: bool = False) -> dict[str, str]:
    """All tests/opinfo_xfail*.json files (one per op family keeps edits from colliding);
    opinfo_xfail_full*.json only for the full profile, whose extra samples reach more failures."""
    from deferfuse.coverage import load_xfails as load

    paths = sorted(glob.glob(os.path.join(HERE, "opinfo_xfail*.json")))
    return load([p for p in paths if full or not os.path.basename(p).startswith("opinfo_xfail_full")])


def xfail_key(op_name: str, variant: str, dtype: str, mode: str) -> str:
    return f"{op_name}|{variant}|{dtype}|{mode}"


def lookup_xfail(xfails: dict, op_name: str, variant: str, dtype: str, mode: str) -> str | None:
    """Entries may use * for variant, dtype or mode."""
    for v in (variant, "*"):
        for d in (dtype, "*"):
            for m in (mode, "*"):
                hit = xfails.get(xfail_key(op_name, v, d, m))
                if hit is not None:
                    return hit
    return None


def to_tpu(x, memo: dict | None = None):
    """A tpu copy of x; with `memo`, a tensor shared by several samples gets one shared copy, so
    samples that mutate it (batch_norm's running stats) see the same sequence of states as on CPU."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise NotImplementedError("sparse sample")
        if memo is not None and id(x) in memo:
            return memo[id(x)][1]
        t = x.detach().to("tpu")
        if x.requires_grad:
            t.requires_grad_(True)
        if memo is not None:
            memo[id(x)] = (x, t)
        return t
    if isinstance(x, (list, tuple)):
        return type(x)(to_tpu(y, memo) for y in x)
    if isinstance(x, dict):
        return {k: to_tpu(v, memo) for k, v in x.items()}
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("tpu")
    if isinstance(x, str) and x == "cpu":
        return "tpu"
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(y) for y in x)
    return x


def variants(op) -> dict[str, object]:
    out = {"function": op.op}
    if op.method_variant is not None:
        out["method"] = op.method_variant
    if op.inplace_variant is not None:
        out["inplace"] = op.inplace_variant
    if op.supports_out:
        out["out"] = "out"
    return out


def samples(op, dtype: torch.dtype, requires_grad: bool = False, limit: int | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
        out = []
        for s in it:
            out.append(s)
            if limit is not None and len(out) >= limit:
                break
    return out


def _call(fn, sample, variant: str, op):
    inp = sample.input
    args, kwargs = sample.args, sample.kwargs
    if variant == "function":
        return op.op(inp, *args, **kwargs)
    if variant == "method":
        return op.method_variant(inp, *args, **kwargs)
    if variant == "inplace":
        target = inp.clone() if isinstance(inp, torch.Tensor) else inp
        res = op.inplace_variant(target, *args, **kwargs)
        return target if res is None else res
    if variant == "out":
        expected = op.op(inp, *args, **kwargs)
        if isinstance(expected, torch.Tensor):
            out = torch.empty(0, dtype=expected.dtype, device=expected.device)
        elif isinstance(expected, (tuple, list)) and all(isinstance(e, torch.Tensor) for e in expected):
            out = type(expected)(torch.empty(0, dtype=e.dtype, device=e.device) for e in expected)
        else:
            raise NotImplementedError("out= with non-tensor results")
        op.op(inp, *args, **kwargs, out=out)
        return out
    raise ValueError(variant)


@dataclass
class Outcome:
    ok: bool
    detail: str = ""


def compare(expected, got, exact_dtype=True, wide_f32=False) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
        k = _TPU_F32_FACTOR if wide_f32 and expected.dtype == torch.float32 else 1
        torch.testing.assert_close(got, expected, equal_nan=True, check_dtype=exact_dtype, check_device=False,
                                   atol=k * _atol(expected), rtol=k * _rtol(expected))
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(got)
        for e, g in zip(expected, got):
            compare(e, g, exact_dtype, wide_f32)
    elif isinstance(expected, float):
        torch.testing.assert_close(got, expected, equal_nan=True, atol=1e-5, rtol=1.3e-6)
    else:
        assert expected == got, f"{expected!r} != {got!r}"


# Cross-backend tolerances, as PyTorch's own device tests use: XLA and CPU kernels may reduce in a
# different order, so float32 gets 1e-5 rather than CPU-vs-CPU's 1.3e-6.
_TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}


# A TPU's float32 transcendentals are XLA:TPU's own approximations, not XLA:CPU's. Measured on a
# v5e against XLA:CPU, 20,000 points each (docs/testing.md, "TPU"): log and the functions built on
# it went 4 to 12 times past the float32 tolerance above (log: 1.05e-4 absolute, 3.6e-4 relative;
# lgamma 12, cumsum's reassociation 12), tanh and log_softmax 2.4 to 2.7 times, erfinv 1.07; exp,
# sin, erf, sqrt, sigmoid, gelu and the rest stayed inside it. In the OpInfo run on the chip,
# logaddexp (log1p of exp; masked.logaddexp 5.7e-5 absolute, 5.7 times) and hfft2 (XLA:TPU's FFT,
# 1.6 times) went past it too. These ops alone, in float32 on a TPU alone, compare at 20 times the
# tolerance; every other op, dtype and platform keeps the table's.
_TPU_F32_WIDE = frozenset({"log", "log2", "log10", "log1p", "asinh", "acosh", "atanh", "logit", "lgamma", "digamma",
                           "nn.functional.softplus", "tanh", "log_softmax", "nn.functional.log_softmax", "erfinv",
                           "cumsum", "logaddexp", "masked.logaddexp", "fft.hfft2"})
_TPU_F32_FACTOR = 20
_ON_TPU = device_limits.platform() == "tpu"


def unheld_on_this_device(err: BaseException) -> bool:
    """The sample made a value this device cannot hold (complex128 on a TPU: a float64 FFT or eig),
    and deferfuse refused it, naming it, as it must."""
    while err is not None:
        if isinstance(err, NotImplementedError) and "tensors cannot be held on a" in str(err):
            return _ON_TPU
        err = err.__cause__ or err.__context__
    return False


def _wide_f32(op) -> bool:
    return _ON_TPU and op is not None and op.name in _TPU_F32_WIDE


def _atol(t):
    return _TOL.get(t.dtype, (0, 0))[0]


def _rtol(t):
    return _TOL.get(t.dtype, (0, 0))[1]


def _expected(op, sample, variant):
    try:
        return to_cpu(_call(None, sample, variant, op)), None
    except Exception as e:  # noqa: BLE001 - some samples are error cases on CPU too
        return None, e


# OpInfos whose samples carry a tensor PyTorch requires on the CPU whatever the device under test
# (torch.tensor_split's indices): the harness leaves those where they are.
_CPU_ARGS = {"tensor_split": lambda s: s.args[0] if s.args and isinstance(s.args[0], torch.Tensor) else None}


def _tpu_sample(sample, op=None, memo: dict | None = None):
    keep = _CPU_ARGS.get(op.name)(sample) if op is not None and op.name in _CPU_ARGS else None
    if keep is None:
        return sample.transform(lambda t: to_tpu(t, memo))
    moved = sample.transform(lambda t: t if t is keep else to_tpu(t, memo))
    return moved


def _check_one(op, expected, cpu_exc, got, tpu_exc, sample=None) -> None:
    if cpu_exc is not None:
        if tpu_exc is None:
            raise AssertionError(f"CPU raised {type(cpu_exc).__name__}: {cpu_exc}; tpu did not")
        if not isinstance(tpu_exc, type(cpu_exc)):
            raise AssertionError(f"CPU raised {type(cpu_exc).__name__}, tpu raised {type(tpu_exc).__name__}: {tpu_exc}")
        return
    if tpu_exc is not None:
        raise tpu_exc
    if is_random(op, sample) or op.name in UNINITIALISED:
        _compare_meta(expected, got)
    else:
        compare(expected, got, wide_f32=_wide_f32(op))


def run_sample(op, sample, variant: str, mode: str) -> None:
    """Raise AssertionError (or the op's exception) when tpu differs from CPU for one sample."""
    run_samples(op, [sample], variant, mode)


BATCH = 32


def run_samples(op, sample_list, variant: str, mode: str) -> None:
    """Run samples BATCH at a time inside one mode block, so DeferAndFuse flushes (and compiles)
    once per batch (XLA's compile time grows faster than the program: 1,440 max_pool2d samples in
    one program take minutes, 32 take a second), then compare each result with CPU."""
    if len(sample_list) > BATCH:
        for i in range(0, len(sample_list), BATCH):
            run_samples(op, sample_list[i:i + BATCH], variant, mode)
        return
    memo: dict = {}  # copies taken before CPU runs: samples may mutate (and share) their inputs
    tpu_samples = [_tpu_sample(s, op, memo) for s in sample_list]
    expected = [_expected(op, s, variant) for s in sample_list]
    got = []
    with deferfuse.mode(mode):
        for s in tpu_samples:
            try:
                got.append((_call(None, s, variant, op), None))
            except Exception as e:  # noqa: BLE001
                got.append((None, e))
        try:
            got = [(to_cpu(g), e) for g, e in got]
        except deferfuse.FlushError:
            if len(sample_list) == 1:
                raise
            got = None
    if got is None:  # find the failing sample one by one
        for s in sample_list:
            run_samples(op, [s], variant, mode)
        raise AssertionError("the batch failed to flush but no single sample did")
    for s, (exp, cpu_exc), (g, tpu_exc) in zip(sample_list, expected, got):
        _check_one(op, exp, cpu_exc, g, tpu_exc, s)


def _compare_meta(expected, got):
    if isinstance(expected, torch.Tensor):
        assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, got.dtype, expected.shape)
    elif isinstance(expected, (list, tuple)):
        for e, g in zip(expected, got):
            _compare_meta(e, g)


def run_random_determinism(op, sample, mode: str) -> None:
    if op.name in UNINITIALISED:
        return  # uninitialised memory has no value to reproduce
    tpu_sample = _tpu_sample(sample, op)
    outs = []
    for _ in range(2):
        torch.manual_seed(1234)
        with deferfuse.mode(mode):
            outs.append(to_cpu(_call(None, tpu_sample, "function", op)))
    compare(outs[0], outs[1])


def run_backward(op, sample, mode: str = "defer_and_fuse") -> None:
    """Gradients of sum(outputs * fixed weights) w.r.t. every floating input match CPU."""

    def grads(s, device):
        inputs = [t for t in _tensors(s) if t.requires_grad]
        if not inputs:
            return None
        out = op.op(s.input, *s.args, **s.kwargs)
        outs = [o for o in (out if isinstance(out, (list, tuple)) else [out])
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outs:
            return None
        total = sum(_real((o * _weights(o)).sum()) for o in outs)
        return torch.autograd.grad(total, inputs, allow_unused=True)

    if is_random(op, sample):
        return
    expected = grads(sample, "cpu")
    if expected is None:
        return
    tpu_sample = _tpu_sample(sample, op)
    with deferfuse.mode(mode):
        got = grads(tpu_sample, "tpu")
        got = [None if g is None else g.cpu() for g in got]
    for e, g in zip(expected, got):
        if e is None:
            assert g is None or torch.count_nonzero(g) == 0
            continue
        torch.testing.assert_close(g, e, equal_nan=True, atol=1e-4, rtol=1e-4)


def _real(s: torch.Tensor) -> torch.Tensor:
    """A real scalar to differentiate: complex outputs contribute both parts."""
    return s.real + s.imag if s.is_complex() else s


def _weights(o: torch.Tensor) -> torch.Tensor:
    n = o.numel()
    w = torch.linspace(0.5, 1.5, max(n, 1), dtype=torch.float32)[:n].reshape(o.shape)
    return w.to(dtype=o.dtype if o.dtype.is_floating_point else torch.float32, device=o.device)


def _tensors(s):
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(s.input)
    walk(s.args)
    walk(s.kwargs)
    return out


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
