"""PyTorch's OpInfo database on "tpu", in all three modes, against CPU PyTorch.

What runs (chosen to fit CI's 30 minutes on 2 cores; see docs/ops.md for the counts):
- float32: every sample of every variant (function, method, in-place, out=) in DeferAndFuse, all
  samples of one entry recorded in one block so the batch compiles as one program; the first
  two samples in Strict and in Debug.
- bfloat16, int64, bool (where the OpInfo lists them): every sample in DeferAndFuse, the first
  sample in Strict.
- backward (float32, OpInfos that support autograd): the first three samples in DeferAndFuse.
- random ops: shape and dtype against CPU, and identical values for the same seed.

Expected failures live in tests/opinfo_xfail*.json (op|variant|dtype|mode -> reason; * matches
any); an entry there that starts passing fails the run, so the list can only shrink.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

import opinfo_support as S

STRICT_SAMPLES = 2
OTHER_DTYPE_STRICT_SAMPLES = 1
BACKWARD_SAMPLES = 3

XFAILS = S.load_xfails()
RESULTS: dict[str, str] = {}


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
                    fwd.append(pytest.param(op, variant, dtype_name, mode, id=f"{name}-{variant}-{dtype_name}-{mode}"))
        if op.supports_autograd and torch.float32 in supported:
            bwd.append(pytest.param(op, id=name))
    return fwd, bwd


FORWARD, BACKWARD = _items()


def _run_expecting(key: str, reason: str | None, body) -> None:
    try:
        with S.quiet():
            body()
    except Exception as e:  # noqa: BLE001
        RESULTS[key] = "xfail" if reason else "fail"
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
    if mode == "defer_and_fuse":
        limit = None
    elif dtype == "float32":
        limit = STRICT_SAMPLES
    else:
        limit = OTHER_DTYPE_STRICT_SAMPLES

    def body():
        samples = S.samples(op, S.DTYPES[dtype], limit=limit)
        if not samples:
            return
        S.run_samples(op, samples, variant, mode)
        if S.is_random(op) and variant == "function" and mode == "strict":
            S.run_random_determinism(op, samples[0], mode)

    _run_expecting(key, reason, body)


@pytest.mark.parametrize("op", BACKWARD)
def test_backward(op):
    name = S.full_name(op)
    key = S.xfail_key(name, "backward", "float32", "defer_and_fuse")
    reason = S.lookup_xfail(XFAILS, name, "backward", "float32", "defer_and_fuse")

    def body():
        for sample in S.samples(op, torch.float32, requires_grad=True, limit=BACKWARD_SAMPLES):
            S.run_backward(op, sample, "defer_and_fuse")

    _run_expecting(key, reason, body)


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
