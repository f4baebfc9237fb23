"""The singular value (SVD) lower bound on the total error of every matrix-mechanism strategy.

``SVDB(W) = (Σ_i √λ_i(WᵀW))² / N`` (Li thesis §4.2.1, Def 4.3, Prop 4.3): no
strategy ``A`` has ``Δ₂(A)² · tr(WᵀW (AᵀA)⁺)`` below it (Thm 4.1), so ``P · SVDB`` bounds the total
squared error at noise variance ``P`` per unit L2 sensitivity.  Since ``Δ₁ ≥ Δ₂`` it also bounds
Laplace strategies at their variance per unit L1 sensitivity.

This module is the project's one implementation, Gram-first (WᵀW is never formed from W):

* :func:`svd_bound_gram`: a dense Gram, O(N³);
* :func:`svd_bound`: a :class:`~mechanisms.primitives.workload.Workload` (closed-form factor spectra);
* :func:`svd_bound_from_eigenvalues`: from a known spectrum.

A union of items is exact through the split of the ``a·I + b·J`` ("marginal-like") attributes into
the mean direction (eigenvalue ``a + b·n``, multiplicity 1) and its complement (``a``, multiplicity
``n − 1``): with k such attributes the spectrum is the union over 2^k blocks of the eigenvalues of
``Σ_t (Π scalars) ⊗_dense G_{t,i}``, identical blocks computed once.  Pure marginal workloads are the
closed form ``(Σ_T r_T √λ_T)² / N`` over attribute subsets T
(:mod:`mechanisms.primitives.marginal_strategies`).
"""

from __future__ import annotations

import math

import numpy as np

from dprelease.mechanisms.primitives.marginal_strategies import (
    eigenspace_multiplicities,
    ij_subset_eigenvalues,
    subset_workload,
)
from dprelease.mechanisms.primitives.operators import kron_matrices
from dprelease.mechanisms.primitives.workload import Workload, item_subset

DENSE_BOUND_LIMIT = 4096
"""Largest product of the sizes of the attributes that are not ``a·I + b·J`` (eigendecomposed)."""

MAX_SPLIT_ATTRIBUTES = 20
"""Largest number of ``a·I + b·J`` attributes (2^k eigenspace blocks)."""

IJParts = tuple[float, float]
AttributePart = IJParts | np.ndarray | None
"""Per term and attribute: ``(a, b)`` for ``a·I + b·J``, a dense Gram, or None (not needed)."""


def validate_gram(gram: np.ndarray, *, name: str = "gram", nonzero: bool = False) -> np.ndarray:
    """``gram`` as float64, symmetrised, after checking it is a square, finite, symmetric Gram with
    no negative diagonal entry (and, with ``nonzero``, not all zero)."""
    array = np.asarray(gram, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] != array.shape[1] or array.shape[0] < 1:
        raise ValueError(f"{name} (shape {array.shape}) must be a non-empty square matrix")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    scale = float(np.abs(array).max())
    asymmetry = float(np.abs(array - array.T).max())
    # Grams built here are exactly symmetric (sums of Kronecker products of symmetric factors) or
    # symmetric to round-off (~N·eps·max|G|, 2e-12 relative at N = 8192): 1e-9 relative keeps a
    # thousandfold margin and still refuses a transposed or mis-assembled Gram (off by O(max|G|)).
    if asymmetry > 1e-9 * scale:
        raise ValueError(f"{name} must be symmetric (max |G - G^T| = {asymmetry:.3g})")
    if np.any(np.diag(array) < -1e-12 * scale):
        raise ValueError(f"{name} must be positive semidefinite (it has a negative diagonal entry)")
    if nonzero and scale == 0.0:
        raise ValueError(f"{name} must not be all zero (the workload has no non-zero query)")
    return (array + array.T) / 2


def svd_bound_from_eigenvalues(
    eigenvalues: np.ndarray, num_cells: float, *, multiplicities: np.ndarray | None = None
) -> float:
    """``(Σ_i mult_i √λ_i)² / N`` for a known spectrum (negative values count as 0). O(r)."""
    values = np.asarray(eigenvalues, dtype=np.float64)
    if values.size == 0 or not num_cells >= 1:
        raise ValueError(f"need eigenvalues and num_cells >= 1 (got {values.size}, {num_cells})")
    roots = np.sqrt(np.clip(values, 0.0, None))
    if multiplicities is not None:
        roots = roots * np.asarray(multiplicities, dtype=np.float64)
    return float(roots.sum()) ** 2 / float(num_cells)


def root_eigen_sum(gram: np.ndarray) -> float:
    """``Σ √λ_i(G)`` of a PSD Gram (round-off eigenvalues count as 0). O(n³)."""
    eigenvalues = np.linalg.eigvalsh((gram + gram.T) / 2)
    noise_level = gram.shape[0] * np.finfo(np.float64).eps * max(float(eigenvalues.max()), 0.0)
    return float(np.sqrt(np.where(eigenvalues > noise_level, eigenvalues, 0.0)).sum())


def svd_bound_gram(gram: np.ndarray) -> float:
    """SVDB of a dense Gram ``G = WᵀW`` (N × N): ``(Σ √λ_i(G))² / N``. O(N³).

    Examples
    --------
    >>> from dprelease.mechanisms.primitives.operators import AllRanges
    >>> round(svd_bound_gram(AllRanges(16).gram()), 4)
    404.4829
    """
    gram = validate_gram(gram, nonzero=True)
    return root_eigen_sum(gram) ** 2 / gram.shape[0]


def svd_bound(workload: Workload) -> float | None:
    """SVDB of a workload from its factors' closed-form Grams and spectra, or None when the exact
    method does not fit (:data:`DENSE_BOUND_LIMIT`, :data:`MAX_SPLIT_ATTRIBUTES`).

    One item: ``Π_i (Σ √λ(W_iᵀW_i))² / N`` with closed-form factor spectra (identity, total, prefix,
    all ranges) or a per-factor ``eigvalsh``.  A union: the split method of the module docstring.
    """
    sizes = workload.domain_shape
    items = workload.items
    if all(item_subset(item) is not None for item in items):
        # marginals: diagonal in subset space, the bound on the downward closure of the tables
        # (any number of attributes), O(items + Σ 2^|R|)
        subset = subset_workload(workload)
        return float(np.sqrt(subset.projections * subset.multiplicities()).sum()) ** 2 / (
            subset.num_cells
        )
    if len(items) == 1:
        root = 1.0
        for factor in items[0].factors:
            closed = factor.closed_form_spectrum or factor.gram_ij() is not None
            if not closed and factor.n > DENSE_BOUND_LIMIT:
                return None
            root *= float(np.sqrt(factor.gram_eigenvalues()).sum())
        return root**2 / workload.num_cells
    parts = [[item.factors[i].gram_ij() for item in items] for i in range(len(sizes))]
    try:
        return _svd_bound(parts, sizes, dense_grams=lambda t, i: items[t].factors[i].gram())
    except ValueError:
        return None


def _svd_bound(
    parts: list[list[AttributePart]],
    sizes: tuple[int, ...],
    *,
    dense_grams,  # (term, attribute) -> dense Gram; called only within the size limit
) -> float:
    """The split method over ``parts[i][t]`` (attribute i, term t)."""
    d = len(sizes)
    split = [i for i in range(d) if all(isinstance(p, tuple) for p in parts[i])]
    dense = [i for i in range(d) if i not in split]
    dense_size = math.prod(sizes[i] for i in dense)
    if dense_size > DENSE_BOUND_LIMIT:
        raise ValueError(
            f"the attributes that are not a·I + b·J have {dense_size} cells together; the exact "
            f"SVD bound is limited to {DENSE_BOUND_LIMIT}"
        )
    if len(split) > MAX_SPLIT_ATTRIBUTES:
        raise ValueError(
            f"{len(split)} marginal-like attributes exceed {MAX_SPLIT_ATTRIBUTES} (2^k blocks)"
        )
    num_terms = len(parts[0]) if parts else 0
    split_sizes = [sizes[i] for i in split]
    multiplicity = eigenspace_multiplicities(split_sizes)  # Π_{k∈U} (n_k − 1), O(2^k)
    cells = float(math.prod(sizes))

    def scalars(t: int) -> np.ndarray:
        # term t's eigenvalue on each split eigenspace U (bit k ⇔ complement of split[k])
        return ij_subset_eigenvalues([parts[i][t] for i in split], split_sizes)  # type: ignore[misc]

    if not dense:  # pure marginal-like workload: closed form, O(T 2^k)
        eigenvalues = np.zeros(multiplicity.size)
        for t in range(num_terms):
            eigenvalues += scalars(t)
        return svd_bound_from_eigenvalues(eigenvalues, cells, multiplicities=multiplicity)
    table = np.array([scalars(t) for t in range(num_terms)])  # (terms, 2^k)
    blocks = [kron_matrices([dense_grams(t, i) for i in dense]) for t in range(num_terms)]  # O(D²)
    columns, inverse = np.unique(table.T, axis=0, return_inverse=True)
    root_sums = np.zeros(columns.shape[0])
    for index, column in enumerate(columns):
        if not np.any(multiplicity[inverse.ravel() == index] > 0) or not column.any():
            continue
        matrix = sum(s * block for s, block in zip(column, blocks, strict=True) if s != 0)
        root_sums[index] = root_eigen_sum(np.asarray(matrix))  # O(D³) per distinct block
    root = float(np.sum(multiplicity * root_sums[inverse.ravel()]))
    return root**2 / cells
