"""Implicit query matrices over one attribute ("factors") and their Kronecker products over a domain.

A release's cells are the product of its attributes' cells, so every workload item and every
data-independent strategy in the pipeline is a Kronecker product ``F_1 ⊗ … ⊗ F_d`` of per-attribute
factors.  Each factor is a :class:`scipy.sparse.linalg.LinearOperator` that also knows, in closed
form where one exists, its Gram matrix ``FᵀF``, its column norms (for sensitivity) and the
variances ``diag(F M Fᵀ)`` of its queries under a cell covariance ``M``.  Nothing here ever forms
the full ``m × N`` matrix of a product; per-attribute matrices are at most ``n × n``.

Every structural shortcut is tested against :meth:`Factor.dense` in ``tests/unit``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator


class Factor(LinearOperator):
    """A query matrix over one attribute with ``n`` cells (rows are queries)."""

    def __init__(self, shape: tuple[int, int]) -> None:
        if shape[1] < 1:
            raise ValueError(f"a factor needs at least one cell, got n={shape[1]}")
        super().__init__(dtype=np.float64, shape=shape)

    @property
    def n(self) -> int:
        return int(self.shape[1])

    @property
    def m(self) -> int:
        return int(self.shape[0])

    def dense(self) -> np.ndarray:
        """The explicit matrix (for tests and small factors). O(m n)."""
        return np.asarray(self.matmat(np.eye(self.n)))

    def gram(self) -> np.ndarray:
        """``FᵀF`` as a dense ``n × n`` array."""
        dense = self.dense()
        return dense.T @ dense

    def column_norms(self, *, norm: int) -> np.ndarray:
        """Per-column L1 (``norm=1``) or L2 (``norm=2``) norms."""
        if norm == 2:
            return np.sqrt(np.diag(self.gram()))
        return np.abs(self.dense()).sum(axis=0)

    def sensitivity(self, *, norm: int) -> float:
        """Largest column norm: the L1 / L2 sensitivity of the query set to one cell's count."""
        _check_norm(norm)
        return float(self.column_norms(norm=norm).max())

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        """``diag(F M Fᵀ)`` for a symmetric ``n × n`` cell covariance ``M``. O(m n²) generic."""
        dense = self.dense()
        return np.einsum("ij,jk,ik->i", dense, covariance, dense)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return self.dense().T @ x

    def _adjoint(self) -> LinearOperator:
        return LinearOperator(
            dtype=self.dtype, shape=(self.n, self.m), matvec=self._rmatvec, matmat=self._rmatmat
        )

    def _rmatvec(self, x: np.ndarray) -> np.ndarray:
        return self._rmatmat(np.asarray(x).reshape(-1, 1)).ravel()

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self._matmat(np.asarray(x).reshape(-1, 1)).ravel()


class MatrixFactor(Factor):
    """A factor given by an explicit dense or sparse matrix (strategies, explicit query lists)."""

    def __init__(self, matrix: np.ndarray | sp.spmatrix | sp.sparray) -> None:
        if sp.issparse(matrix):
            self.matrix = sp.csr_array(matrix, dtype=np.float64)
        else:
            self.matrix = np.atleast_2d(np.asarray(matrix, dtype=np.float64))
        if self.matrix.ndim != 2:
            raise ValueError(f"a factor matrix must be 2-D, got shape {self.matrix.shape}")
        super().__init__(shape=self.matrix.shape)

    def dense(self) -> np.ndarray:
        if sp.issparse(self.matrix):
            return self.matrix.toarray()
        return np.array(self.matrix)

    def gram(self) -> np.ndarray:
        product = self.matrix.T @ self.matrix  # O(nnz · n) sparse
        return product.toarray() if sp.issparse(product) else np.asarray(product)

    def column_norms(self, *, norm: int) -> np.ndarray:
        _check_norm(norm)
        if sp.issparse(self.matrix):
            values = abs(self.matrix).power(norm).sum(axis=0)
        else:
            values = (np.abs(self.matrix) ** norm).sum(axis=0)
        values = np.asarray(values).ravel()
        return values if norm == 1 else np.sqrt(values)

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix @ x)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix.T @ x)


class Identity(Factor):
    """One query per cell."""

    def __init__(self, n: int) -> None:
        super().__init__(shape=(n, n))

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, dtype=np.float64)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, dtype=np.float64)

    def gram(self) -> np.ndarray:
        return np.eye(self.n)

    def column_norms(self, *, norm: int) -> np.ndarray:
        return np.ones(self.n)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        return np.diag(covariance).copy()


class Total(Factor):
    """The single query that sums all cells (the attribute is summed out)."""

    def __init__(self, n: int) -> None:
        super().__init__(shape=(1, n))

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64).sum(axis=0, keepdims=True)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.repeat(np.asarray(x, dtype=np.float64), self.n, axis=0)

    def gram(self) -> np.ndarray:
        return np.ones((self.n, self.n))

    def column_norms(self, *, norm: int) -> np.ndarray:
        return np.ones(self.n)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        return np.array([covariance.sum()])


class Prefix(Factor):
    """Prefix sums (the empirical CDF): query ``i`` sums cells ``0..i``."""

    def __init__(self, n: int) -> None:
        super().__init__(shape=(n, n))

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.cumsum(np.asarray(x, dtype=np.float64), axis=0)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.cumsum(np.asarray(x, dtype=np.float64)[::-1], axis=0)[::-1]

    def gram(self) -> np.ndarray:
        # (PᵀP)_{jk} = #{i : i >= max(j, k)} = n - max(j, k)
        idx = np.arange(self.n)
        return (self.n - np.maximum.outer(idx, idx)).astype(np.float64)

    def column_norms(self, *, norm: int) -> np.ndarray:
        counts = np.arange(self.n, 0, -1, dtype=np.float64)  # column j appears in n - j queries
        return counts if norm == 1 else np.sqrt(counts)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        # Var(prefix i) = sum_{j,k <= i} M_jk: diagonal of the 2-D cumulative sum. O(n²)
        return np.diag(np.cumsum(np.cumsum(covariance, axis=0), axis=1)).copy()


class Ranges(Factor):
    """Interval queries ``[lo_k, hi_k]`` (inclusive cell indices), answered through prefix sums."""

    def __init__(self, n: int, lo: Sequence[int] | np.ndarray, hi: Sequence[int] | np.ndarray):
        lo_arr = np.asarray(lo, dtype=np.int64).ravel()
        hi_arr = np.asarray(hi, dtype=np.int64).ravel()
        if lo_arr.shape != hi_arr.shape or lo_arr.size == 0:
            raise ValueError(
                f"ranges need matching, non-empty lo/hi arrays (got {lo_arr.size} and {hi_arr.size})"
            )
        bad = (lo_arr < 0) | (hi_arr >= n) | (lo_arr > hi_arr)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"range {k} = [{lo_arr[k]}, {hi_arr[k]}] must satisfy 0 <= lo <= hi < n={n}"
            )
        self.lo, self.hi = lo_arr, hi_arr
        super().__init__(shape=(lo_arr.size, n))

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        cumulative = np.vstack([np.zeros((1, x.shape[1])), np.cumsum(x, axis=0)])  # O(n k)
        return cumulative[self.hi + 1] - cumulative[self.lo]

    def _rmatmat(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        diff = np.zeros((self.n + 1, y.shape[1]))
        np.add.at(diff, self.lo, y)
        np.add.at(diff, self.hi + 1, -y)
        return np.cumsum(diff, axis=0)[:-1]

    def gram(self) -> np.ndarray:
        # (WᵀW)_{jk} = #{queries covering both j and k}; O(m + n²) via a 2-D difference table.
        table = np.zeros((self.n + 1, self.n + 1))
        np.add.at(table, (self.lo, self.lo), 1.0)
        np.add.at(table, (self.lo, self.hi + 1), -1.0)
        np.add.at(table, (self.hi + 1, self.lo), -1.0)
        np.add.at(table, (self.hi + 1, self.hi + 1), 1.0)
        # the 2-D cumsum at (j, k) is Σ_q [lo_q <= j <= hi_q][lo_q <= k <= hi_q]
        return np.cumsum(np.cumsum(table, axis=0), axis=1)[:-1, :-1]

    def column_norms(self, *, norm: int) -> np.ndarray:
        diff = np.zeros(self.n + 1)
        np.add.at(diff, self.lo, 1.0)
        np.add.at(diff, self.hi + 1, -1.0)
        counts = np.cumsum(diff)[:-1]
        return counts if norm == 1 else np.sqrt(counts)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        # Var([lo, hi]) = S[hi+1, hi+1] - S[lo, hi+1] - S[hi+1, lo] + S[lo, lo], S = padded 2-D cumsum
        s = np.zeros((self.n + 1, self.n + 1))
        s[1:, 1:] = np.cumsum(np.cumsum(covariance, axis=0), axis=1)  # O(n²)
        a, b = self.lo, self.hi + 1
        return s[b, b] - s[a, b] - s[b, a] + s[a, a]


class AllRanges(Ranges):
    """All ``n(n+1)/2`` intervals, ordered by (lo, hi); Gram and column norms in closed form."""

    def __init__(self, n: int) -> None:
        lo, hi = np.triu_indices(n)
        super().__init__(n, lo, hi)

    def gram(self) -> np.ndarray:
        # (WᵀW)_{jk} = (min(j,k) + 1) (n - max(j,k)) with 0-based j, k
        idx = np.arange(self.n)
        return ((np.minimum.outer(idx, idx) + 1) * (self.n - np.maximum.outer(idx, idx))).astype(
            np.float64
        )

    def column_norms(self, *, norm: int) -> np.ndarray:
        idx = np.arange(self.n)
        counts = ((idx + 1) * (self.n - idx)).astype(np.float64)
        return counts if norm == 1 else np.sqrt(counts)


def _check_norm(norm: int) -> None:
    if norm not in (1, 2):
        raise ValueError(f"norm ({norm}) must be 1 (L1, Laplace) or 2 (L2, Gaussian)")


# --- Kronecker products over a domain -------------------------------------------------------------


def apply_along_axis(operator: LinearOperator, tensor: np.ndarray, axis: int) -> np.ndarray:
    """Apply ``operator`` to ``tensor`` along ``axis`` (one factor of a Kronecker product).

    O(cost of operator on n_axis × (size / n_axis) columns).
    """
    moved = np.moveaxis(tensor, axis, 0)
    rest = moved.shape[1:]
    flat = moved.reshape(moved.shape[0], -1)
    result = (
        np.asarray(operator.matmat(flat)) if flat.shape[1] else np.zeros((operator.shape[0], 0))
    )
    return np.moveaxis(result.reshape((result.shape[0], *rest)), 0, axis)


def kron_apply(factors: Sequence[LinearOperator], x: np.ndarray) -> np.ndarray:
    """``(F_1 ⊗ … ⊗ F_d) x`` for a row-major flattened ``x``; never forms the product.

    O(Σ_i cost(F_i) · N / n_i) for N cells.
    """
    shape = tuple(int(f.shape[1]) for f in factors)
    tensor = np.asarray(x, dtype=np.float64).reshape(shape)
    for axis, factor in enumerate(factors):
        tensor = apply_along_axis(factor, tensor, axis)
    return tensor.ravel()


def kron_apply_transpose(factors: Sequence[LinearOperator], y: np.ndarray) -> np.ndarray:
    """``(F_1 ⊗ … ⊗ F_d)ᵀ y``."""
    return kron_apply([f.T for f in factors], y)


def kron_matrices(matrices: Sequence[np.ndarray]) -> np.ndarray:
    """``M_1 ⊗ … ⊗ M_d`` as a dense array (``[[1]]`` for none). O(Π sizes): small products only."""
    result = np.ones((1, 1))
    for matrix in matrices:
        result = np.kron(result, matrix)
    return result


def kron_dense(factors: Sequence[Factor]) -> np.ndarray:
    """The explicit product matrix (tests only: it is exponentially large in general)."""
    return kron_matrices([factor.dense() for factor in factors])
