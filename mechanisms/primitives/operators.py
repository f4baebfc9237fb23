"""Implicit query matrices over one attribute ("factors") and their Kronecker products over a domain.

Every workload item and data-independent strategy is a Kronecker product ``F_1 ⊗ … ⊗ F_d`` of
per-attribute factors.  Each factor is a :class:`scipy.sparse.linalg.LinearOperator` that also
knows, in closed form where one exists, its Gram ``FᵀF`` (``Ranges`` in O(m + n²),
``AllRanges``/``Prefix``/``Identity``/``Total`` in O(n²)), the Gram's trace and sum, whether it is
``a·I + b·J``, its column norms and the variances ``diag(F M Fᵀ)`` under a cell covariance ``M``.
Nothing here forms the ``m × N`` matrix of a product; per-attribute matrices are at most ``n × n``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dprelease.mechanisms.primitives.linalg import psd_inverse, symmetric_from_lower

IJ_CHECK_MAX_CELLS = 4096
"""Largest ``n`` whose Gram a generic factor forms to test for the ``a·I + b·J`` structure."""


class Factor(LinearOperator):
    """A query matrix over one attribute with ``n`` cells (rows are queries)."""

    closed_form_spectrum: ClassVar[bool] = False
    """True when :meth:`gram_eigenvalues` needs no eigensolver (any n)."""

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

    def gram_inverse(self) -> tuple[np.ndarray, bool]:
        """``((FᵀF)⁺, full rank?)``: :func:`~mechanisms.primitives.linalg.psd_inverse` of the dense Gram,
        O(n³); factors with structure override it."""
        return psd_inverse(self.gram())

    def gram_trace(self) -> float:
        """``tr(FᵀF)`` (the sum of squared entries) from the column norms, never the Gram."""
        return float(np.sum(self.column_norms(norm=2) ** 2))

    def gram_sum(self) -> float:
        """``1ᵀFᵀF1 = ‖F1‖²`` (squared row sums). O(cost of one product)."""
        row_sums = np.asarray(self.matvec(np.ones(self.n)), dtype=np.float64)
        return float(row_sums @ row_sums)

    def gram_ij(self) -> tuple[float, float] | None:
        """``(a, b)`` with ``FᵀF = a·I + b·J`` (J all-ones), or None: such attributes are diagonal
        in the split ``span{1} ⊕ 1^⊥`` (the marginals algebra).  Generic factors form their Gram
        (O(n²)) only up to ``IJ_CHECK_MAX_CELLS`` cells."""
        if self.n > IJ_CHECK_MAX_CELLS:
            return None
        return gram_ij_parts(self.gram())

    def max_abs(self) -> float:
        """Largest ``|F_qj|``. O(m n) generic; closed form for the structured factors."""
        return float(np.abs(self.dense()).max())

    def row_norms_squared(self) -> np.ndarray:
        """``diag(F Fᵀ)``: each query's squared L2 norm. O(m n) generic; O(m) for 0/1 factors."""
        dense = self.dense()
        return np.einsum("ij,ij->i", dense, dense)

    def gram_eigenvalues(self) -> np.ndarray:
        """Eigenvalues of ``FᵀF`` (any order, clipped at 0): closed form where known, else a
        dense ``eigvalsh`` of the Gram (O(n³))."""
        parts = self.gram_ij()
        if parts is not None:
            a, b = parts
            return np.clip(np.append(np.full(self.n - 1, a), a + b * self.n), 0.0, None)
        gram = self.gram()
        return np.clip(np.linalg.eigvalsh((gram + gram.T) / 2), 0.0, None)

    def column_norms(self, *, norm: int) -> np.ndarray:
        """Per-column L1 (``norm=1``) or L2 (``norm=2``) norms."""
        if norm == 2:
            return np.sqrt(np.diag(self.gram()))
        return np.abs(self.dense()).sum(axis=0)

    def sensitivity(self, *, norm: int) -> float:
        """Largest column norm: the L1 / L2 sensitivity of the query set to one cell's count."""
        check_norm(norm)
        return float(self.column_norms(norm=norm).max())

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        """``diag(F M Fᵀ)`` for a symmetric ``n × n`` cell covariance ``M``, O(m n²) generic; with
        trailing batch axes ``(n, n, *batch)`` the result is ``(m, *batch)`` (one per index)."""
        dense = self.dense()
        return np.einsum("ij,jk...,ik->i...", dense, covariance, dense)

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

    def row_norms_squared(self) -> np.ndarray:
        squared = self.matrix.multiply(self.matrix) if sp.issparse(self.matrix) else self.matrix**2
        return np.asarray(squared.sum(axis=1), dtype=np.float64).ravel()

    def max_abs(self) -> float:
        if sp.issparse(self.matrix):
            return float(abs(self.matrix).max()) if self.matrix.nnz else 0.0
        return float(np.abs(self.matrix).max())

    def column_norms(self, *, norm: int) -> np.ndarray:
        check_norm(norm)
        if sp.issparse(self.matrix):  # O(nnz), no copy of the matrix (10^8-cell identities)
            stored = np.abs(self.matrix.data)
            values = np.bincount(
                self.matrix.indices, weights=stored if norm == 1 else stored**2, minlength=self.n
            )
        else:
            values = (np.abs(self.matrix) ** norm).sum(axis=0)
        values = np.asarray(values).ravel()
        return values if norm == 1 else np.sqrt(values)

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix @ x)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix.T @ x)


class _Square(Factor):
    """An ``n × n`` factor whose Gram spectrum has a closed form."""

    closed_form_spectrum: ClassVar[bool] = True

    def __init__(self, n: int) -> None:
        super().__init__(shape=(n, n))


class Identity(_Square):
    """One query per cell."""

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, dtype=np.float64)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, dtype=np.float64)

    def gram(self) -> np.ndarray:
        return np.eye(self.n)

    def gram_ij(self) -> tuple[float, float] | None:
        return 1.0, 0.0

    def max_abs(self) -> float:
        return 1.0

    def row_norms_squared(self) -> np.ndarray:
        return np.ones(self.n)

    def column_norms(self, *, norm: int) -> np.ndarray:
        return np.ones(self.n)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        return _leading_diagonal(covariance)


class Total(Factor):
    """The single query that sums all cells (the attribute is summed out)."""

    closed_form_spectrum: ClassVar[bool] = True

    def __init__(self, n: int) -> None:
        super().__init__(shape=(1, n))

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64).sum(axis=0, keepdims=True)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.repeat(np.asarray(x, dtype=np.float64), self.n, axis=0)

    def gram(self) -> np.ndarray:
        return np.ones((self.n, self.n))

    def gram_ij(self) -> tuple[float, float] | None:
        return 0.0, 1.0

    def max_abs(self) -> float:
        return 1.0

    def row_norms_squared(self) -> np.ndarray:
        return np.array([float(self.n)])

    def column_norms(self, *, norm: int) -> np.ndarray:
        return np.ones(self.n)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        return np.asarray(covariance, dtype=np.float64).sum(axis=(0, 1))[np.newaxis]


class Centring(_Square):
    """``C = I − J/n``: every cell minus the attribute's mean (rank n − 1, ``CᵀC = C``).

    Measuring ``C ⊗ …`` measures the centred part of a marginal, the per-attribute "centred"
    eigenspace of every ``a·I + b·J`` Gram (the marginals algebra).
    """

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return x - x.mean(axis=0, keepdims=True)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return self._matmat(x)

    def gram(self) -> np.ndarray:
        return np.eye(self.n) - 1.0 / self.n

    def gram_ij(self) -> tuple[float, float] | None:
        return 1.0, -1.0 / self.n

    def max_abs(self) -> float:
        return 1.0 - 1.0 / self.n if self.n > 1 else 0.0

    def row_norms_squared(self) -> np.ndarray:
        return np.full(self.n, 1.0 - 1.0 / self.n)

    def column_norms(self, *, norm: int) -> np.ndarray:
        check_norm(norm)
        n = self.n
        value = 2.0 * (n - 1) / n if norm == 1 else math.sqrt((n - 1) / n)
        return np.full(n, value)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        # Var(x_i − mean) = M_ii − 2 (M 1)_i / n + 1ᵀM1 / n². O(n² · batch)
        covariance = np.asarray(covariance, dtype=np.float64)
        n = self.n
        row_means = covariance.sum(axis=1) / n  # (n, *batch)
        return _leading_diagonal(covariance) - 2.0 * row_means + row_means.sum(axis=0) / n


class Prefix(_Square):
    """Prefix sums (the empirical CDF): query ``i`` sums cells ``0..i``."""

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return np.cumsum(np.asarray(x, dtype=np.float64), axis=0)

    def _rmatmat(self, x: np.ndarray) -> np.ndarray:
        return np.cumsum(np.asarray(x, dtype=np.float64)[::-1], axis=0)[::-1]

    def gram(self) -> np.ndarray:
        # (PᵀP)_{jk} = #{i : i >= max(j, k)} = n - max(j, k)
        return _min_max_gram(np.ones(self.n), self.n - np.arange(self.n, dtype=np.float64))

    def gram_ij(self) -> tuple[float, float] | None:
        return (1.0, 0.0) if self.n == 1 else None

    def gram_eigenvalues(self) -> np.ndarray:
        # (PᵀP)_{jk} = n - max(j, k) is the reversed min(j, k) matrix: eigenvalues
        # 1 / (4 sin²((2k - 1) π / (4n + 2))), k = 1..n.  O(n)
        k = np.arange(1, self.n + 1, dtype=np.float64)
        return 1.0 / (4.0 * np.sin((2.0 * k - 1.0) * np.pi / (4.0 * self.n + 2.0)) ** 2)

    def max_abs(self) -> float:
        return 1.0

    def row_norms_squared(self) -> np.ndarray:
        return np.arange(1, self.n + 1, dtype=np.float64)

    def column_norms(self, *, norm: int) -> np.ndarray:
        counts = np.arange(self.n, 0, -1, dtype=np.float64)  # column j appears in n - j queries
        return counts if norm == 1 else np.sqrt(counts)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        # Var(prefix i) = sum_{j,k <= i} M_jk: diagonal of the 2-D cumulative sum. O(n²)
        return _leading_diagonal(np.cumsum(np.cumsum(covariance, axis=0), axis=1))


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

    def max_abs(self) -> float:
        return 1.0

    def row_norms_squared(self) -> np.ndarray:
        return (self.hi - self.lo + 1).astype(np.float64)

    def column_norms(self, *, norm: int) -> np.ndarray:
        diff = np.zeros(self.n + 1)
        np.add.at(diff, self.lo, 1.0)
        np.add.at(diff, self.hi + 1, -1.0)
        counts = np.cumsum(diff)[:-1]
        return counts if norm == 1 else np.sqrt(counts)

    def query_variances(self, covariance: np.ndarray) -> np.ndarray:
        # Var([lo, hi]) = S[hi+1, hi+1] - S[lo, hi+1] - S[hi+1, lo] + S[lo, lo], S = padded 2-D cumsum
        covariance = np.asarray(covariance, dtype=np.float64)
        s = np.zeros((self.n + 1, self.n + 1, *covariance.shape[2:]))
        s[1:, 1:] = np.cumsum(np.cumsum(covariance, axis=0), axis=1)  # O(n² · batch)
        a, b = self.lo, self.hi + 1
        return s[b, b] - s[a, b] - s[b, a] + s[a, a]  # O(m · batch)


class AllRanges(Ranges):
    """All ``n(n+1)/2`` intervals, ordered by (lo, hi); Gram and column norms in closed form."""

    closed_form_spectrum: ClassVar[bool] = True

    def __init__(self, n: int) -> None:
        # no lo/hi arrays until a product needs them: 2 × 8.4M indices at n = 4096
        Factor.__init__(self, shape=(n * (n + 1) // 2, n))

    @functools.cached_property
    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = np.triu_indices(self.n)
        return lo, hi

    @property
    def lo(self) -> np.ndarray:  # type: ignore[override]
        return self._bounds[0]

    @property
    def hi(self) -> np.ndarray:  # type: ignore[override]
        return self._bounds[1]

    def gram(self) -> np.ndarray:
        # (WᵀW)_{jk} = (min(j,k) + 1) (n - max(j,k)) with 0-based j, k
        idx = np.arange(self.n, dtype=np.float64)
        return _min_max_gram(idx + 1.0, self.n - idx)

    def column_norms(self, *, norm: int) -> np.ndarray:
        idx = np.arange(self.n)
        counts = ((idx + 1) * (self.n - idx)).astype(np.float64)
        return counts if norm == 1 else np.sqrt(counts)

    def gram_ij(self) -> tuple[float, float] | None:
        return (1.0, 0.0) if self.n == 1 else None

    def gram_eigenvalues(self) -> np.ndarray:
        # WᵀW = (n + 1) T⁻¹ with T = tridiag(-1, 2, -1): eigenvalues
        # (n + 1) / (4 sin²(π k / (2 (n + 1)))), k = 1..n (Li thesis §4; DST-I eigenvectors).  O(n)
        k = np.arange(1, self.n + 1, dtype=np.float64)
        return (self.n + 1) / (4.0 * np.sin(np.pi * k / (2.0 * (self.n + 1))) ** 2)


def _min_max_gram(of_min: np.ndarray, of_max: np.ndarray) -> np.ndarray:
    """``G_jk = of_min[min(j, k)] · of_max[max(j, k)]`` (the prefix and all-range Grams). O(n²) in
    two passes over the matrix instead of six n × n numpy temporaries."""
    return symmetric_from_lower(np.outer(of_max, of_min))  # exact where j >= k


def check_norm(norm: int) -> None:
    if norm not in (1, 2):
        raise ValueError(f"norm ({norm}) must be 1 (L1, Laplace) or 2 (L2, Gaussian)")


def _leading_diagonal(matrix: np.ndarray) -> np.ndarray:
    """``M[i, i, ...]`` over the first two axes, as a new ``(n, *batch)`` array."""
    return np.moveaxis(np.diagonal(matrix, axis1=0, axis2=1), -1, 0).copy()


def gram_ij_parts(gram: np.ndarray, *, rtol: float = 1e-10) -> tuple[float, float] | None:
    """``(a, b)`` with ``gram = a·I + b·J`` to ``rtol`` of its largest entry, else None. O(n²)."""
    gram = np.asarray(gram, dtype=np.float64)
    n = gram.shape[0]
    b = float(gram[0, 1]) if n > 1 else 0.0
    a = float(gram[0, 0]) - b
    expected = np.full((n, n), b)
    expected[np.diag_indices(n)] += a
    scale = max(float(np.abs(gram).max()), np.finfo(np.float64).tiny)
    return (a, b) if float(np.abs(gram - expected).max()) <= rtol * scale else None


def kron_apply(factors: Sequence[LinearOperator], x: np.ndarray) -> np.ndarray:
    """``(F_1 ⊗ … ⊗ F_d) x`` for a row-major flattened ``x``, each factor applied along its axis;
    never forms the product.  O(Σ_i cost(F_i) · N / n_i) for N cells."""
    shape = tuple(int(f.shape[1]) for f in factors)
    tensor = np.asarray(x, dtype=np.float64).reshape(shape)
    for axis, factor in enumerate(factors):
        moved = np.moveaxis(tensor, axis, 0)
        flat = moved.reshape(moved.shape[0], -1)
        result = (
            np.asarray(factor.matmat(flat)) if flat.shape[1] else np.zeros((factor.shape[0], 0))
        )
        tensor = np.moveaxis(result.reshape((result.shape[0], *moved.shape[1:])), 0, axis)
    return tensor.ravel()


def kron_apply_transpose(factors: Sequence[LinearOperator], y: np.ndarray) -> np.ndarray:
    """``(F_1 ⊗ … ⊗ F_d)ᵀ y``."""
    return kron_apply([f.T for f in factors], y)


def kron_query_variances(factors: Sequence[Factor], covariance: np.ndarray) -> np.ndarray:
    """``diag(W M Wᵀ)`` for ``W = F_1 ⊗ … ⊗ F_d`` and a dense N × N cell covariance ``M``.

    Attribute by attribute: ``M`` as a tensor with axes ``(n_1, n_1', …, n_d, n_d')`` loses each
    pair to that factor's (batched) query variances, so W's ``m × N`` matrix is never formed.
    Cost O(Σ_i Π_{j<i} m_j · n_i² · Π_{j>i} n_j²); for one attribute it is the factor's own
    closed form (O(n² + m) for ranges).
    """
    shape = tuple(f.n for f in factors)
    cells = math.prod(shape)
    covariance = np.asarray(covariance, dtype=np.float64)
    if covariance.shape != (cells, cells):
        raise ValueError(f"covariance (shape {covariance.shape}) must be {cells} × {cells}")
    d = len(shape)
    tensor = covariance.reshape(shape + shape).transpose(
        [axis for i in range(d) for axis in (i, d + i)]
    )
    for factor in factors:
        tensor = np.moveaxis(factor.query_variances(tensor), 0, -1)
    return np.asarray(tensor).reshape(-1)


def kron_matrices(matrices: Sequence[np.ndarray]) -> np.ndarray:
    """``M_1 ⊗ … ⊗ M_d`` as a dense array (``[[1]]`` for none). O(Π sizes): small products only."""
    result = np.ones((1, 1))
    for matrix in matrices:
        result = np.kron(result, matrix)
    return result


def kron_dense(factors: Sequence[Factor]) -> np.ndarray:
    """The explicit product matrix (tests only: it is exponentially large in general)."""
    return kron_matrices([factor.dense() for factor in factors])
