"""Dense linear algebra shared by strategies: PSD (pseudo-)inverses and the L1 sensitivity.

Strategy Grams ``AᵀA`` are symmetric positive semi-definite; the matrix mechanism needs their
(pseudo-)inverse for least squares and for the expected error (Li thesis §3.1-3.2), and the
largest column norm of ``A`` to calibrate its noise.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg


def read_only(values: np.ndarray, dtype: type | None = None) -> np.ndarray:
    """A write-protected copy of ``values`` (for arrays held by frozen dataclasses)."""
    array = np.array(values, dtype=dtype, copy=True)
    array.setflags(write=False)
    return array


def l1_sensitivity(strategy: np.ndarray) -> float:
    """Maximum column L1 norm ``max_j Σ_i |A_ij|`` of a dense strategy. O(p n).

    Privacy: the L1 sensitivity of ``x ↦ A·x`` when neighbouring data differ by at most 1 in one
    cell (Li thesis Prop 2.2; LRM Definition 2); the Laplace scale is this over ε.  A non-finite
    strategy has no sensitivity and is refused."""
    matrix = np.asarray(strategy, dtype=np.float64)
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(f"strategy must be a non-empty 2-D array, got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError("strategy must be finite")
    return float(np.abs(matrix).sum(axis=0).max())


def psd_pinv(matrix: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of a symmetric PSD matrix (see :func:`psd_inverse`). O(n³)."""
    return psd_inverse(matrix)[0]


def psd_inverse(matrix: np.ndarray) -> tuple[np.ndarray, bool]:
    """(pseudo-inverse, full rank?) of a symmetric PSD matrix: Cholesky when well conditioned,
    else the eigendecomposition's pseudo-inverse of its symmetric part (full rank then False).

    The Cholesky path is taken only when the factor's diagonal shows the matrix is far from
    singular (a Cholesky of a singular Gram can succeed in floating point and return garbage); it
    reads the upper triangle.  O(n³) (``potrf`` + ``potri``, else an eigendecomposition); a
    positive diagonal matrix in O(n²).
    """
    square = np.asarray(matrix, dtype=np.float64)
    diagonal = np.diag(square)
    if np.all(diagonal > 0) and np.count_nonzero(square) == square.shape[0]:
        return np.diag(1.0 / diagonal), True  # diagonal (the identity strategy's Gram): O(n²)
    # the transpose of a C-ordered matrix is Fortran-ordered: LAPACK takes it without a transpose
    factor, info = scipy.linalg.lapack.dpotrf(square.T, lower=True, clean=True)
    if info == 0:
        diagonal = np.abs(np.diag(factor))
        if diagonal.min() ** 2 >= 1e-10 * diagonal.max() ** 2:
            lower, info = scipy.linalg.lapack.dpotri(factor, lower=True)
            if info == 0:
                return symmetric_from_lower(lower), True
    return _eigh_pinv((square + square.T) / 2), False


def _eigh_pinv(symmetric: np.ndarray) -> np.ndarray:
    """Pseudo-inverse from an eigendecomposition, eigenvalues below ``n·eps·max|λ|`` dropped (the
    cut-off of ``scipy.linalg.pinvh``, without its input checks: half its time at n = 85, where
    the union's weight search inverts thousands of singular blocks). O(n³)."""
    values, vectors = np.linalg.eigh(symmetric)
    if values.size == 0:
        return np.zeros_like(symmetric)
    cutoff = float(np.abs(values).max()) * symmetric.shape[0] * np.finfo(np.float64).eps
    keep = np.abs(values) > cutoff
    kept = vectors[:, keep]
    return (kept / values[keep]) @ kept.T


def symmetric_from_lower(lower: np.ndarray, *, block: int = 128) -> np.ndarray:
    """Copy the lower triangle onto the upper one, in place, tile by tile. O(n²).

    A whole-matrix transpose at large n is dominated by cache misses; 128-row tiles stay in cache.
    """
    n = lower.shape[0]
    for start in range(block, n, block):
        stop = min(n, start + block)
        lower[:start, start:stop] = lower[start:stop, :start].T
    for start in range(0, n, block):
        stop = min(n, start + block)
        tile = lower[start:stop, start:stop]
        tile[...] = np.tril(tile) + np.tril(tile, -1).T
    return lower
