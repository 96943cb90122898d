"""LU, Cholesky and triangular-solve lowerings (deferfuse/lowering/factorizations.py) against CPU:
factors, LAPACK's info and pivots, batched and singular inputs, and no CPU fallback."""
from __future__ import annotations

import pytest
import torch

import deferfuse
from conftest import run_on
from deferfuse.lowering import device_limits

DTYPES = [torch.float64, torch.float32, torch.complex128, torch.complex64]

_G = torch.Generator().manual_seed(0)


def _rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, generator=_G)


def _singular(dtype):
    """A regular matrix, one with a dependent row (U[2,2] is an exact zero), a zero matrix and a
    nilpotent shift (whose LU and A^T's LU have different pivots)."""
    s = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    shift = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    return torch.stack([torch.eye(3) * 2, s, torch.zeros(3, 3), shift]).to(dtype)


def _check_lowered(fn, *inputs, modes=("strict", "debug", "defer_and_fuse")):
    """fn's result in each mode equals CPU's, and no op of it took the CPU fallback."""
    deferfuse.reset_metrics()
    expected = run_on(lambda d: fn(*[x.to(d) for x in inputs]), "cpu", None)
    for m in modes:
        got = run_on(lambda d: fn(*[x.to(d) for x in inputs]), "tpu", m)
        torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda s, m=m: f"[{m}] {s}")
    if any(x.dtype in (torch.float64, torch.complex128) for x in inputs) and device_limits.LIMITS.get(
            device_limits.platform()):
        return  # a TPU runs these dtypes as the named CPU fallback (test_device_limits.py)
    assert not deferfuse.metrics()["cpu_fallbacks"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_factor_info_and_pivots(dtype):
    a = torch.cat([_rand(2, 3, 3, dtype=dtype), _singular(dtype)])
    _check_lowered(lambda a: [*torch.linalg.lu_factor_ex(a), *torch.linalg.lu(a), *torch.lu_unpack(*torch.linalg.lu_factor_ex(a)[:2])], a)
    _check_lowered(lambda a: [*torch.linalg.lu_factor_ex(a), *torch.linalg.lu(a)], _rand(2, 3, 5, dtype=dtype))
    _check_lowered(lambda a: [*torch.linalg.lu_factor_ex(a), *torch.linalg.lu(a)], _rand(2, 5, 3, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_inv_and_solve_report_singular_in_info(dtype):
    a = torch.cat([_rand(2, 3, 3, dtype=dtype), _singular(dtype)])
    b = _rand(6, 3, 2, dtype=dtype)
    _check_lowered(lambda a, b: [*torch.linalg.inv_ex(a), *torch.linalg.solve_ex(a, b),
                                 *torch.ops.aten._linalg_solve_ex(a, b)], a, b)
    assert torch.linalg.inv_ex(a.to("tpu")).info.tolist() == [0, 0, 0, 3, 1, 1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_variants(dtype):
    a = _rand(3, 4, 4, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)
    b = _rand(3, 4, 2, dtype=dtype)
    _check_lowered(lambda a, b: [torch.linalg.solve(a, b), torch.linalg.solve(a, b.mT, left=False),
                                 torch.linalg.solve(a[0], b), torch.linalg.solve(a, b[0, :, 0]),
                                 torch.linalg.inv(a), torch.linalg.matrix_power(a, -2)], a, b)
    _check_lowered(lambda a, b: [torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=left, adjoint=adj)
                                 for left in (True, False) for adj in (True, False)], a, _rand(3, 4, 4, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_det_and_slogdet(dtype):
    """CPU factors A^T when A is real and contiguous; its LU and pivots are outputs. (Debug flags
    the -inf logabsdet of a singular matrix, lowered or not.)"""
    a = torch.cat([_rand(2, 3, 3, dtype=dtype), _singular(dtype)[[0, 2, 3]]])
    _check_lowered(lambda a: [*torch.ops.aten._linalg_det(a), *torch.ops.aten._linalg_slogdet(a),
                              *torch.ops.aten._linalg_det(a.mT), *torch.ops.aten._linalg_slogdet(a.mT)], a,
                   modes=("strict", "defer_and_fuse"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_info_and_partial_factor(dtype, upper):
    """info is the order of the first leading minor that is not positive definite; the factor is
    potrf's partial state (the columns before it, the failed pivot, the rest of A)."""
    x = _rand(4, 4, 4, dtype=dtype)
    p = x @ x.mH + torch.eye(4, dtype=dtype)
    p[1, 2, 2] = -5
    p[2, 0, 0] = float("nan")
    p[3] = x[3]  # not Hermitian: only the triangle potrf reads matters
    _check_lowered(lambda p: [*torch.linalg.cholesky_ex(p, upper=upper)], p)
    assert torch.linalg.cholesky_ex(p.to("tpu"), upper=upper).info.tolist() == \
        torch.linalg.cholesky_ex(p, upper=upper).info.tolist()
    good = p[[0]]
    _check_lowered(lambda p: [torch.linalg.cholesky(p, upper=upper),
                              torch.cholesky_solve(p[0, :, :2], torch.linalg.cholesky(p, upper=upper), upper=upper),
                              torch.cholesky_inverse(torch.linalg.cholesky(p, upper=upper)[0], upper=upper)], good)


@pytest.mark.parametrize("dtype", DTYPES)
def test_triangular_solves(dtype):
    a = _rand(2, 4, 4, dtype=dtype)
    b = _rand(2, 4, 3, dtype=dtype)
    _check_lowered(lambda a, b: [torch.linalg.solve_triangular(a, b if left else b.mT, upper=up, left=left,
                                                               unitriangular=unit)
                                 for up in (True, False) for left in (True, False) for unit in (True, False)], a, b)
    _check_lowered(lambda a, b: [t for up in (True, False) for tr in (True, False)
                                 for t in torch.triangular_solve(b[0], a, upper=up, transpose=tr)], a, b)


def test_empty_matrices():
    e = torch.zeros(2, 0, 0, dtype=torch.float64)
    _check_lowered(lambda e: [*torch.linalg.inv_ex(e), *torch.linalg.lu_factor_ex(e), *torch.linalg.cholesky_ex(e),
                              *torch.ops.aten._linalg_slogdet(e), torch.linalg.det(e)], e)


@pytest.mark.parametrize("case", ["rows", "columns", "shared_dim", "batched"])
def test_grouped_mm_matches_cpu_forward_and_backward(case):
    """torch._grouped_mm, the product of transformers' MoE expert layers on any device but CPU:
    rows of `a` in groups (the forward), columns of `b` in groups, the shared dim in groups (the
    weight gradient) and plain batches, with an empty group. Rows past offs[-1] are left
    uninitialised by CPU, so only the rows the groups cover are compared."""
    shape_a, shape_b, ends = {"rows": ((7, 8), (4, 8, 8), [2, 3, 3, 6]), "columns": ((4, 4, 8), (8, 8), [2, 4, 4, 8]),
                              "shared_dim": ((4, 8), (8, 4), [2, 4, 4, 8]), "batched": ((4, 4, 8), (4, 8, 4), None)}[case]

    def run(d):
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(*s, generator=g).to(d).requires_grad_() for s in (shape_a, shape_b))
        offs = None if ends is None else torch.tensor(ends, dtype=torch.int32).to(d)
        y = torch.nn.functional.grouped_mm(a, b, offs=offs)
        y = y[:ends[-1]] if case == "rows" else y
        (y * torch.arange(y.numel(), device=d).reshape(y.shape).cos()).sum().backward()
        grad_a = a.grad[:ends[-1]] if case == "rows" else a.grad
        return [y, grad_a, b.grad]

    for mode in ("strict", "debug", "defer_and_fuse"):
        torch.testing.assert_close(run_on(run, "tpu", mode), run_on(run, "cpu", None), msg=lambda s: f"[{mode}] {s}")
    assert not deferfuse.metrics()["cpu_fallbacks"]


def test_grouped_mm_refuses_what_cpu_refuses():
    a, b, offs = torch.randn(6, 8), torch.randn(3, 8, 8), torch.tensor([2, 4, 6], dtype=torch.int32)
    for bad in ({"bias": torch.randn(3, 8)}, {"out_dtype": torch.float64}):
        with pytest.raises(RuntimeError) as cpu:
            torch._grouped_mm(a, b, offs, **bad)
        tpu_bad = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in bad.items()}
        with pytest.raises(RuntimeError) as got:
            torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs.to("tpu"), **tpu_bad)
        assert str(got.value) == str(cpu.value)
