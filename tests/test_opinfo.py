"""PyTorch's OpInfo database on "tpu", in all three modes, against CPU PyTorch.

Two profiles (DEFERFUSE_OPINFO=ci|full, default ci). CI's 30 minutes on 2 cores cannot hold every
sample of every variant in every mode and dtype (~11,500 tests, about 90 minutes here), so the ci
profile runs a fixed selection (~2,900 tests, about 18 minutes on two workers here):
- float32, DeferAndFuse: every entry's function, in-place and out= variants (the method variant
  calls the same ATen op as the function), the first 32 samples (all of them for most entries),
  recorded in one block so they compile as one program;
- float32, Strict and Debug: the function variant of a fixed third of the entries, two samples in
  Strict and one in Debug (the fixed sample the issue allows for the other two modes);
- float64: the function variant of every entry, the first 12 samples, in DeferAndFuse (a TPU
  has no native float64: each entry must compute it right or take a named fallback);
- bfloat16, int64, bool, complex64 (where the OpInfo lists them): the function variant of a fixed
  half of the entries, the first 12 samples, in DeferAndFuse (complex64 is the complex type a TPU
  holds; the full profile runs this same selection of it, until its other cases are triaged);
- backward (float32, OpInfos that support autograd): the first two samples in DeferAndFuse;
- random ops: shape and dtype against CPU, and identical values for the same seed.
Fixed fractions are chosen by a hash of the entry's name, so every run tests the same entries.
The full profile runs every variant of every entry in every mode (all samples in DeferAndFuse,
two in Strict and Debug, one in Strict for the other dtypes) and three backward samples.

Expected failures live in tests/opinfo_xfail*.json (op|variant|dtype|mode -> reason; * matches
any); an entry there that starts passing fails the run, so the list can only shrink.
"""
from __future__ import annotations

import json
import os
import zlib

import pytest
import torch

import device_profile
import opinfo_support as S

FULL = os.environ.get("DEFERFUSE_OPINFO", "ci") == "full"
STRICT_SAMPLES = 2
BACKWARD_SAMPLES = 3 if FULL else 2
DEFER_SAMPLES = 32  # ci: one batch, one program; a few OpInfos generate over a thousand samples (max_pool2d: 1,440)
OTHER_DTYPE_SAMPLES = 12  # ci

XFAILS = S.load_xfails(full=FULL)
RESULTS: dict[str, str] = {}


def _in_ci(name: str, dtype: str, variant: str, mode: str) -> bool:
    h = zlib.crc32(name.encode())  # a stable choice of entries, the same on every machine
    if mode == "defer_and_fuse":
        if dtype == "float32":
            return variant != "method"
        if dtype == "float64":  # what a TPU emulates, or must refuse by name (lowering/device_limits.py)
            return variant == "function"
        return variant == "function" and h % 2 == 0
    return dtype == "float32" and variant == "function" and h % 3 == 0


def _items():
    fwd, bwd = [], []
    for op in S.op_db:
        name = S.full_name(op)
        supported = op.supported_dtypes("cpu")
        for dtype_name, dtype in S.DTYPES.items():
            if dtype not in supported:
                continue
            modes = S.MODES if dtype == torch.float32 else ("strict", "defer_and_fuse")
            for variant in S.variants(op):
                for mode in modes:
                    if not ((FULL and dtype_name != "complex64") or _in_ci(name, dtype_name, variant, mode)):
                        continue
                    fwd.append(pytest.param(op, variant, dtype_name, mode, id=f"{name}-{variant}-{dtype_name}-{mode}"))
        if op.supports_autograd and torch.float32 in supported:
            bwd.append(pytest.param(op, id=name))
    return fwd, bwd


FORWARD, BACKWARD = _items()
if os.environ.get("DEFERFUSE_OPINFO_SAMPLE"):  # "k/n": every n-th case from the k-th, to time or triage
    _k, _n = map(int, os.environ["DEFERFUSE_OPINFO_SAMPLE"].split("/"))
    FORWARD, BACKWARD = FORWARD[_k::_n], BACKWARD[_k::_n]


def in_device_profile(item) -> bool:
    """The device profile's share of the ci profile (tests/device_profile.py): every test it runs
    for a fixed seventh of the entries, two fifths of those in its ci share (by a hash of the name, as
    `_in_ci` chooses, and independent of its thirds and halves), and the tests of no one entry.
    Whole entries, so that a failure on the device shows across the entry's dtypes, modes,
    variants and backward, as the xfail tables key it; a part, because the whole ci profile takes
    about 20 minutes in one process on our CPU machines, and a TPU v5e is about 3.4 times slower."""
    params = getattr(item, "callspec", None)
    if params is None or "op" not in params.params:
        return True
    return device_profile.in_share("opinfo entries", S.full_name(params.params["op"]))


def _forward_body(op, variant: str, dtype: str, mode: str) -> None:
    if FULL:
        limit = None if mode == "defer_and_fuse" else STRICT_SAMPLES if dtype == "float32" else 1
    elif mode == "defer_and_fuse":
        limit = DEFER_SAMPLES if dtype == "float32" else OTHER_DTYPE_SAMPLES
    else:
        limit = STRICT_SAMPLES if mode == "strict" else 1
    samples = S.samples(op, S.DTYPES[dtype], limit=limit)
    if not samples:
        return
    S.run_samples(op, samples, variant, mode)
    if S.is_random(op) and variant == "function" and mode == "strict":
        S.run_random_determinism(op, samples[0], mode)


def _backward_body(op) -> None:
    for sample in S.samples(op, torch.float32, requires_grad=True, limit=BACKWARD_SAMPLES):
        S.run_backward(op, sample, "defer_and_fuse")


def _run_expecting(key: str, reason: str | None, body) -> None:
    try:
        with S.quiet():
            body()
    except Exception as e:  # noqa: BLE001
        if reason is None and S.unheld_on_this_device(e):
            reason = "a complex128 result: a TPU cannot hold complex128 (deferfuse/device_dtypes.py)"
        # with why, for docs/ops.md's list of what passes on CPU and not on a device
        first = str(e).splitlines()[0][:160] if str(e) else ""
        RESULTS[key] = f"xfail: {reason}" if reason else f"fail: {type(e).__name__}: {first}"
        if reason:
            pytest.xfail(reason)
        raise AssertionError(f"{key}: {type(e).__name__}: {e}") from e
    RESULTS[key] = "pass"
    if reason:
        pytest.fail(f"{key} passes now: remove it from tests/opinfo_xfail*.json (it said: {reason})")


@pytest.mark.parametrize("op,variant,dtype,mode", FORWARD)
def test_forward(op, variant, dtype, mode):
    name = S.full_name(op)
    key = S.xfail_key(name, variant, dtype, mode)
    reason = S.lookup_xfail(XFAILS, name, variant, dtype, mode)
    _run_expecting(key, reason, lambda: _forward_body(op, variant, dtype, mode))


@pytest.mark.parametrize("op", BACKWARD)
def test_backward(op):
    name = S.full_name(op)
    key = S.xfail_key(name, "backward", "float32", "defer_and_fuse")
    reason = S.lookup_xfail(XFAILS, name, "backward", "float32", "defer_and_fuse")
    _run_expecting(key, reason, lambda: _backward_body(op))


def test_xfail_entries_name_real_ops():
    names = {S.full_name(op) for op in S.op_db}
    unknown = [k for k in XFAILS if k.split("|")[0] not in names]
    assert not unknown, f"tests/opinfo_xfail*.json names ops that are not in op_db: {unknown[:10]}"


@pytest.fixture(scope="module", autouse=True)
def _write_results():
    yield
    path = os.environ.get("DEFERFUSE_OPINFO_RESULTS")
    if path and RESULTS:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{path}.{worker}.json", "w") as f:
            json.dump(RESULTS, f, indent=0, sort_keys=True)

