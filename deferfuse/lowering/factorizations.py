"""LU, Cholesky and triangular solves, with LAPACK's `info` and pivots.

CPU PyTorch's kernels are LAPACK's getrf/getrs, potrf and trsm; lax.linalg's lu, cholesky and
triangular_solve are the same algorithms (on the CPU backend, the same LAPACK routines), so the
unique results (factors, solutions, determinants) match. What LAPACK adds is `info`, rebuilt here
from the factors: getrf's is the first exactly-zero diagonal of U (1-based), potrf's the order of
the first leading minor that is not positive definite.

Only float32/64 and complex64/128 are lowered (CPU refuses the rest with its own error, which the
fallback raises), and only `check_errors=False`: PyTorch's composites (linalg.inv, solve,
cholesky, ...) call the *_ex kernel so and check `info` themselves, which raises CPU's LinAlgError.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .registry import aten, bound, lowering

_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
_HIGHEST = lax.Precision.HIGHEST


def _supported(op, **want):
    def supports(args, kwargs):
        got = bound(op, args, kwargs)
        if any(got.get(k) != v for k, v in want.items()):
            return False
        return all(a.dtype in (_DTYPES if a.is_floating_point() or a.is_complex() else (torch.int32,))
                   for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))

    return supports


def _batch(*xs):
    """Broadcast the batch dims (all but the last two) of each matrix to a common shape."""
    batch = jnp.broadcast_shapes(*(x.shape[:-2] for x in xs))
    return [jnp.broadcast_to(x, batch + x.shape[-2:]) for x in xs]


def _eye_like(a):
    """Identity matrices of a's batch shape: inverses are solves against them, as in LAPACK."""
    return jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)


def _first_zero(d):
    """getrf's info: 1 + the index of U's first exactly-zero diagonal element, 0 if none."""
    zero = d == 0
    if d.shape[-1] == 0:
        return jnp.zeros(d.shape[:-1], jnp.int32)
    return jnp.where(zero.any(-1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)


def _lu(a):
    """(LU, 1-based int32 pivots, permutation, info); getrf's partial pivoting."""
    lu, piv, perm = lax.linalg.lu(a)
    return lu, piv + 1, perm, _first_zero(jnp.diagonal(lu, 0, -2, -1))


def _tri(a, b, *, lower, left=True, unit=False, adjoint=False, transpose=False):
    a, b = _batch(a, b)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, unit_diagonal=unit,
                                       transpose_a=adjoint or transpose, conjugate_a=adjoint)


def _perm_rows(b, perm, inverse=False):
    batch = jnp.broadcast_shapes(b.shape[:-2], perm.shape[:-1])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    perm = jnp.broadcast_to(perm, batch + perm.shape[-1:])
    if inverse:
        perm = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(b, perm[..., :, None], axis=-2)


def _lu_solve(lu, perm, b, *, left=True, adjoint=False):
    """getrs: A X = B from A's LU (A[perm] = L U); adjoint solves A^H X = B. The right-side
    solve X A = B is the left one of A^H, conjugated back, as PyTorch's lu_solve computes it."""
    if not left:
        return jnp.conj(jnp.swapaxes(_lu_solve(lu, perm, jnp.conj(jnp.swapaxes(b, -1, -2)),
                                               adjoint=not adjoint), -1, -2))
    if not adjoint:
        y = _tri(lu, _perm_rows(b, perm), lower=True, unit=True)
        return _tri(lu, y, lower=False)
    y = _tri(lu, b, lower=False, adjoint=True)
    return _perm_rows(_tri(lu, y, lower=True, unit=True, adjoint=True), perm, inverse=True)


@lowering(aten.linalg_lu_factor_ex.default, family="misc",
          supports=_supported(aten.linalg_lu_factor_ex.default, pivot=True, check_errors=False))
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    lu, piv, _, info = _lu(a)
    return lu, piv, info


def _unpack(lu, perm, m, n):
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    P = jnp.swapaxes(jnp.eye(m, dtype=lu.dtype)[perm], -1, -2)  # A = P L U
    return P, L, U


@lowering(aten.linalg_lu.default, family="misc", supports=_supported(aten.linalg_lu.default, pivot=True))
def linalg_lu(a, *, pivot=True):
    lu, _, perm, _ = _lu(a)
    return _unpack(lu, perm, *a.shape[-2:])


@lowering(aten.lu_unpack.default, family="misc", supports=_supported(aten.lu_unpack.default))
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    """The pivots are data here: the permutation is rebuilt from them as getrf's row swaps."""
    m, n = lu.shape[-2:]
    perm = lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)
    P, L, U = _unpack(lu, perm, m, n)
    empty = jnp.zeros((0,), lu.dtype)
    return (P if unpack_pivots else empty, *((L, U) if unpack_data else (empty, empty)))


@lowering(aten.linalg_lu_solve.default, family="misc", supports=_supported(aten.linalg_lu_solve.default))
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    n = lu.shape[-1]
    perm = lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, n)
    return _lu_solve(lu, perm, b, left=left, adjoint=adjoint)


@lowering(aten.linalg_inv_ex.default, family="misc",
          supports=_supported(aten.linalg_inv_ex.default, check_errors=False))
def linalg_inv_ex(a, *, check_errors=False):
    """CPU solves A X = I through getrf/getrs, so a singular input leaves the same Inf/NaN."""
    lu, _, perm, info = _lu(a)
    return _lu_solve(lu, perm, _eye_like(a)), info


@lowering(aten._linalg_solve_ex.default, family="misc",
          supports=_supported(aten._linalg_solve_ex.default, check_errors=False))
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    """A vector right-hand side is B of A's shape less its last dim (or 1-D), as in linalg.solve."""
    lu, piv, perm, info = _lu(a)
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    x = _lu_solve(lu, perm, b[..., None] if vector else b, left=left)
    return (x[..., 0] if vector else x), lu, piv, info


def _perm_sign(piv):
    swaps = jnp.sum(piv != jnp.arange(1, piv.shape[-1] + 1, dtype=piv.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1)


def _det_lu(ctx, a):
    """CPU factors A^T (det(A^T) = det(A)) when A is real and contiguous, to spare lu_factor's
    copy into column-major order; that LU and those pivots are outputs, and for a singular A
    rounding can leave a tiny pivot in one factorization where the other has an exact zero."""
    m = ctx.meta_args[0]
    if m.is_contiguous() and not m.is_complex():
        a = jnp.swapaxes(a, -1, -2)
    lu, piv, _, _ = _lu(a)
    return lu, piv, jnp.diagonal(lu, 0, -2, -1)


@lowering(aten._linalg_det.default, family="misc", ctx=True, supports=_supported(aten._linalg_det.default))
def linalg_det(ctx, a):
    lu, piv, d = _det_lu(ctx, a)
    return jnp.prod(d, axis=-1) * _perm_sign(piv).astype(a.dtype), lu, piv


@lowering(aten._linalg_slogdet.default, family="misc", ctx=True, supports=_supported(aten._linalg_slogdet.default))
def linalg_slogdet(ctx, a):
    """sign is torch.sgn of the determinant (z/|z|, 0 for a singular matrix, with logabsdet -inf)."""
    lu, piv, d = _det_lu(ctx, a)
    mag = jnp.abs(d)
    unit = jnp.where(mag == 0, 0, d / jnp.where(mag == 0, 1, mag).astype(d.dtype))
    sign = jnp.prod(unit, axis=-1) * _perm_sign(piv).astype(a.dtype)
    return sign, jnp.sum(jnp.log(mag), axis=-1), lu, piv


@lowering(aten.linalg_solve_triangular.default, family="misc",
          supports=_supported(aten.linalg_solve_triangular.default))
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    return _tri(a, b, lower=not upper, left=left, unit=unitriangular)


@lowering(aten.triangular_solve.default, family="misc", supports=_supported(aten.triangular_solve.default))
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """`transpose` is a plain transpose, also for complex A (LAPACK's trans='T')."""
    x = _tri(a, b, lower=not upper, unit=unitriangular, transpose=transpose)
    return x, a


def _potf2(a):
    """Unblocked left-looking potrf on the lower triangle of one matrix: the state LAPACK leaves
    when a leading minor fails (the columns before it factored, its pivot holding the failed
    non-positive value, the rest untouched), and its order as info."""
    n = a.shape[-1]
    idx = jnp.arange(n)

    def column(j, carry):
        m, info = carry
        lj = jnp.where(idx < j, m[j], 0)
        ajj = jnp.real(m[j, j]) - jnp.real(jnp.vdot(lj, lj))
        fail = (info == 0) & ~(ajj > 0)  # NaN fails too
        d = jnp.sqrt(jnp.where(ajj > 0, ajj, 1)).astype(m.dtype)
        col = (m[:, j] - jnp.matmul(jnp.where(idx[None, :] < j, m, 0), jnp.conj(lj), precision=_HIGHEST)) / d
        col = jnp.where(idx > j, col, m[:, j]).at[j].set(d)
        done = m.at[:, j].set(col)
        failed = m.at[j, j].set(ajj.astype(m.dtype))
        m = jnp.where(info != 0, m, jnp.where(fail, failed, done))
        return m, jnp.where(fail, j + 1, info)

    return lax.fori_loop(0, n, column, (a, jnp.zeros((), jnp.int32)))


def _cholesky(a, upper):
    """potrf reads only A's lower triangle (upper: the upper one, i.e. A^H's lower). The fast
    factor serves when every matrix in the batch is positive definite; otherwise the unblocked
    loop gives LAPACK's info and partial factor (one branch for the batch, not per matrix)."""
    if upper:
        a = jnp.conj(jnp.swapaxes(a, -1, -2))
    if a.size == 0:
        L, info = a, jnp.zeros(a.shape[:-2], jnp.int32)
    else:
        fast = lax.linalg.cholesky(a, symmetrize_input=False)
        flat = a.reshape((-1,) + a.shape[-2:])

        def slow(_):
            m, info = jax.vmap(_potf2)(flat)
            return m.reshape(a.shape), info.reshape(a.shape[:-2])

        L, info = lax.cond(jnp.isfinite(fast).all(), lambda _: (fast, jnp.zeros(a.shape[:-2], jnp.int32)),
                           slow, None)
    L = jnp.tril(L)
    return (jnp.conj(jnp.swapaxes(L, -1, -2)) if upper else L), info


@lowering(aten.linalg_cholesky_ex.default, family="misc",
          supports=_supported(aten.linalg_cholesky_ex.default, check_errors=False))
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    return _cholesky(a, upper)


@lowering(aten._cholesky_solve_helper.default, family="misc",
          supports=_supported(aten._cholesky_solve_helper.default))
def cholesky_solve_helper(b, f, upper):
    """potrs: A = L L^H (upper: U^H U); cholesky_solve broadcast the batch dims already."""
    if upper:
        return _tri(f, _tri(f, b, lower=False, adjoint=True), lower=False)
    return _tri(f, _tri(f, b, lower=True), lower=True, adjoint=True)


@lowering(aten.cholesky_inverse.default, family="misc", supports=_supported(aten.cholesky_inverse.default))
def cholesky_inverse(f, upper=False):
    return cholesky_solve_helper(_eye_like(f), f, upper)
