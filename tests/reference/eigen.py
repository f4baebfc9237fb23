"""Eigen-Design's research helpers (Li thesis ch. 4-5), outside the product.

Dense Gram builders for the thesis's workloads (ranges, prefixes, marginals), their closed-form
spectra, the section 5.2.2 speed-ups for large n (eigen-query separation, principal vectors),
Eigen-Design from a known spectrum (the thesis's n = 8192 cases), the cell-simplified SVD bound and
exact total-error evaluation of any dense strategy.  The product
(:mod:`mechanisms.eigen`) builds the Gram from the workload and runs :func:`eigen_design`.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.fft

from dprelease.mechanisms.eigen.design import (
    DEFAULT_EIGENVALUE_RTOL,
    EigenDesignStrategy,
    Weighting,
    WorkloadSpectrum,
    _check_positive_int,
    _check_unit_interval,
    _design,
    _solve_weighting,
    _strategy_matrix,
    _trace_gram_pinv,
    _validated_design_options,
    _WeightingSolution,
    eigen_design,
    minimize_workload,
    weights_full,
)
from dprelease.mechanisms.primitives.linalg import l1_sensitivity
from dprelease.mechanisms.primitives.lower_bound import (
    svd_bound_from_eigenvalues,
    svd_bound_gram,
    validate_gram,
)
from dprelease.mechanisms.primitives.noise import NoiseKind, validate_noise
from dprelease.mechanisms.primitives.operators import AllRanges, Identity, Prefix, Total
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem


def _validated_strategy(strategy: np.ndarray, n_cells: int | None = None) -> np.ndarray:
    strategy = np.asarray(strategy, dtype=np.float64)
    if strategy.ndim != 2 or strategy.size == 0:
        raise ValueError(f"strategy (shape {strategy.shape}) must be a non-empty 2-D matrix")
    if n_cells is not None and strategy.shape[1] != n_cells:
        raise ValueError(
            f"strategy has {strategy.shape[1]} columns but the workload has {n_cells} cells"
        )
    if not np.all(np.isfinite(strategy)):
        raise ValueError("strategy must be finite")
    return strategy


def l2_sensitivity(strategy: np.ndarray) -> float:
    """Largest column L2 norm of A (Prop 2.3): the L2 sensitivity for one record (O(p n))."""
    strategy = _validated_strategy(strategy)
    return float(np.sqrt(np.max(np.sum(strategy**2, axis=0))))


@dataclass(frozen=True)
class MeasurableDesign:
    """An Eigen-Design result measured directly (``name``, ``num_queries``, ``sensitivity``,
    ``apply``, ``least_squares``), as the thesis's experiments do; the product measures ``A`` as a
    :class:`~mechanisms.primitives.dense.DenseStrategy`."""

    design: EigenDesignStrategy
    name: str = "eigen_design"

    @property
    def num_queries(self) -> int:
        """Number of strategy rows p."""
        return int(self.design.A.shape[0])

    def sensitivity(self, *, noise: NoiseKind) -> float:
        """Largest column L1 (Laplace) or L2 (Gaussian) norm of A, for one record."""
        validate_noise(noise)
        if noise == "laplace":
            return l1_sensitivity(_validated_strategy(self.design.A))
        return l2_sensitivity(self.design.A)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``A x`` (O(p n)); confidential until the session adds noise."""
        return self.design.A @ np.asarray(x, dtype=np.float64)

    def least_squares(self, y: np.ndarray) -> np.ndarray:
        """``x_hat = A^+ y`` (O(p n^2)): post-processing; zero on cells no query reads."""
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (self.num_queries,):
            raise ValueError(f"y (shape {y.shape}) must have length {self.num_queries}")
        estimate, *_ = np.linalg.lstsq(self.design.A, y, rcond=None)
        return estimate


def all_range_gram(n: int) -> np.ndarray:
    """Gram matrix of ALLRANGE(n), all n(n+1)/2 intervals of a 1-D domain (O(n^2)).

    ``G_ij = min(i, j) * (n - max(i, j) + 1)`` for 1-indexed cells: the number of intervals that
    contain both cells.

    Examples
    --------
    >>> all_range_gram(3)
    array([[3., 2., 1.],
           [2., 4., 2.],
           [1., 2., 3.]])
    """
    return AllRanges(_check_positive_int("n", n)).gram()


def all_range_gram_nd(shape: Sequence[int]) -> np.ndarray:
    """Gram matrix of all axis-aligned (hyper-)rectangles on ``shape`` (Kronecker product, O(n^2)).

    ALLRANGE(n1, n2, ...) is the cross product of 1-D ALLRANGE workloads (thesis Def 4.12).
    """
    shape = _validated_shape(shape)
    item = WorkloadItem(name="ranges", factors=tuple(AllRanges(size) for size in shape))
    return item.dense_gram()


def prefix_gram(n: int) -> np.ndarray:
    """Gram matrix of the prefix (CDF) workload ``[1, i]``, i = 1..n: ``G_ij = n - max(i, j) + 1``."""
    return Prefix(_check_positive_int("n", n)).gram()


def k_way_cliques(n_attributes: int, k: int) -> list[tuple[int, ...]]:
    """All k-subsets of ``range(n_attributes)``, the cliques of the k-way marginal workload."""
    n_attributes = _check_positive_int("n_attributes", n_attributes)
    k = _check_positive_int("k", k)
    if k > n_attributes:
        raise ValueError(f"k ({k}) must be <= n_attributes ({n_attributes})")
    return list(itertools.combinations(range(n_attributes), k))


def marginals_gram(shape: Sequence[int], cliques: Sequence[Sequence[int]]) -> np.ndarray:
    """Gram matrix of the marginals on ``cliques`` over a domain of ``shape`` (O(|cliques| n^2)).

    The marginal on clique C is ``kron_a (I if a in C else 1^T)``; its Gram is
    ``kron_a (I if a in C else J)``.
    """
    shape = _validated_shape(shape)
    cliques = _validated_cliques(cliques, len(shape))
    items = tuple(
        WorkloadItem(
            name=str(sorted(clique)),
            factors=tuple(Identity(n) if a in clique else Total(n) for a, n in enumerate(shape)),
        )
        for clique in cliques
    )
    return Workload(domain_shape=shape, items=items).dense_gram()


def _validated_shape(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    if not shape:
        raise ValueError("shape must have at least one attribute")
    for size in shape:
        _check_positive_int("attribute size", size)
    return tuple(int(size) for size in shape)


def _validated_cliques(cliques: Sequence[Sequence[int]], n_attributes: int) -> list[frozenset[int]]:
    if len(cliques) == 0:
        raise ValueError("cliques must contain at least one clique")
    validated = []
    for clique in cliques:
        members = frozenset(int(a) for a in clique)
        if len(members) != len(tuple(clique)) or not all(0 <= a < n_attributes for a in members):
            raise ValueError(
                f"clique {tuple(clique)} must list distinct attributes in 0..{n_attributes - 1}"
            )
        validated.append(members)
    return validated


def all_range_spectrum(n: int) -> WorkloadSpectrum:
    """Closed-form spectrum of ALLRANGE(n) (O(n^2), no eigen-solver).

    ``G = (n + 1) T^{-1}`` with T the tridiagonal second-difference matrix tridiag(-1, 2, -1), so
    the eigenvectors are the DST-I vectors ``sqrt(2/(n+1)) sin(pi i k / (n+1))`` and the
    eigenvalues are ``(n + 1) / (4 sin^2(pi k / (2 (n + 1))))``, k = 1..n.
    """
    n = _check_positive_int("n", n)
    index = np.arange(1, n + 1, dtype=np.float64)
    eigenvalues = AllRanges(n).gram_eigenvalues()  # decreasing in k
    eigenvectors = np.sqrt(2.0 / (n + 1)) * np.sin(np.pi * np.outer(index, index) / (n + 1))
    return WorkloadSpectrum(eigenvalues=eigenvalues, eigenvectors=eigenvectors)


def kronecker_spectrum(*factors: WorkloadSpectrum) -> WorkloadSpectrum:
    """Spectrum of ``G_1 kron G_2 kron ...`` from the factors' spectra (O(n^2), thesis Thm 4.13)."""
    if not factors:
        raise ValueError("kronecker_spectrum needs at least one factor")
    eigenvalues = np.ones(1)
    eigenvectors = np.ones((1, 1))
    for factor in factors:
        eigenvalues = np.multiply.outer(eigenvalues, factor.eigenvalues).ravel()
        eigenvectors = np.kron(eigenvectors, factor.eigenvectors)
    order = np.argsort(-eigenvalues, kind="stable")
    return WorkloadSpectrum(eigenvalues=eigenvalues[order], eigenvectors=eigenvectors[:, order])


def marginals_spectrum(shape: Sequence[int], cliques: Sequence[Sequence[int]]) -> WorkloadSpectrum:
    """Closed-form spectrum of :func:`marginals_gram` (O(n^2), no eigen-solver).

    Every ``I`` and ``J`` factor is diagonal in any orthonormal basis that contains the constant
    vector; we use the orthonormal DCT-II basis per attribute.  The eigenvalue of the basis vector
    with per-attribute frequencies ``k_a`` is ``sum_C prod_{a not in C} (n_a if k_a == 0 else 0)``.
    """
    shape = _validated_shape(shape)
    cliques = _validated_cliques(cliques, len(shape))
    frequencies = np.array(list(itertools.product(*(range(size) for size in shape))))
    eigenvalues = np.zeros(len(frequencies))
    for clique in cliques:
        term = np.ones(len(frequencies))
        for attribute, size in enumerate(shape):
            if attribute not in clique:
                term *= np.where(frequencies[:, attribute] == 0, float(size), 0.0)
        eigenvalues += term
    eigenvectors = np.ones((1, 1))
    for size in shape:
        basis = scipy.fft.dct(np.eye(size), type=2, norm="ortho", axis=0).T  # columns: DCT-II
        eigenvectors = np.kron(eigenvectors, basis)
    kept = eigenvalues > DEFAULT_EIGENVALUE_RTOL * eigenvalues.max()
    order = np.argsort(-eigenvalues[kept], kind="stable")
    return WorkloadSpectrum(
        eigenvalues=eigenvalues[kept][order], eigenvectors=eigenvectors[:, kept][:, order]
    )


def svd_bound_from_spectrum(spectrum: WorkloadSpectrum) -> float:
    """SVDB from a spectrum: ``(sum sqrt(sigma))^2 / n_cells`` (O(r))."""
    return svd_bound_from_eigenvalues(spectrum.eigenvalues, spectrum.n_cells)


def cell_simplified_svd_bound(gram: np.ndarray) -> float:
    """``SVDB+(W) = SVDB(W')`` for the minimised workload W' (Def 4.10, O(n^3)).

    Both SVDB and SVDB+ are valid lower bounds, so ``max(svd_bound, cell_simplified_svd_bound)``
    is too (Li thesis §4.5.1); the two are not ordered in general (Example 4.4).
    """
    return svd_bound_gram(minimize_workload(gram).gram)


def workload_variance_factor(gram: np.ndarray, strategy: np.ndarray) -> float:
    """``trace(G (A^T A)^+) = |W A^+|_F^2``: total error per unit noise variance (O(n^3)).

    The expected total squared error of the matrix mechanism that adds i.i.d. noise of variance
    v to ``A x`` is ``v * workload_variance_factor(G, A)`` (thesis Prop 3.4).

    Raises
    ------
    ValueError
        If A does not support the workload (the row space of G is not inside that of A).
    """
    gram = validate_gram(gram, nonzero=True)
    strategy = _validated_strategy(strategy, gram.shape[0])
    return _trace_gram_pinv(strategy.T @ strategy, gram=gram)


def total_error_l2(gram: np.ndarray, strategy: np.ndarray) -> float:
    """``l2_sensitivity(A)^2 * trace(G (A^T A)^+)``: Gaussian total error for P = 1 (O(n^3)).

    Multiply by P, the Gaussian noise variance per unit L2 sensitivity, for the expected total
    squared error (thesis Prop 3.4); divide by :func:`svd_bound` for the Table 4.1 ratios.
    """
    return l2_sensitivity(strategy) ** 2 * workload_variance_factor(gram, strategy)


def total_error_l1(gram: np.ndarray, strategy: np.ndarray) -> float:
    """``l1_sensitivity(A)^2 * trace(G (A^T A)^+)`` (eps-DP, Laplace; multiply by 2/eps^2)."""
    strategy = _validated_strategy(strategy)  # this module's messages before the shared helper's
    return l1_sensitivity(strategy) ** 2 * workload_variance_factor(gram, strategy)


def weights_separated(
    costs: np.ndarray,
    constraint: np.ndarray,
    *,
    group_size: int,
    power: int,
    rtol: float,
    max_iterations: int,
) -> tuple[np.ndarray, list[_WeightingSolution]]:
    """Eigen-query separation (thesis §5.2.2.1; the merge step, unspecified there, is ours).

    Groups of ``group_size`` consecutive eigen-queries (decreasing eigenvalue) are weighted
    independently, O(n g) per evaluation; then one factor per group is chosen by the same program
    with each group as a block (cost ``sum c_i / x_i^p``, column ``constraint_g @ x_g``),
    O(n^2 / g) per evaluation.
    """
    solutions: list[_WeightingSolution] = []
    inner: list[np.ndarray] = []
    block_costs = []
    block_columns = []
    for start in range(0, costs.size, group_size):
        group = slice(start, min(start + group_size, costs.size))
        solution = _solve_weighting(
            costs[group],
            constraint[:, group],
            power=power,
            rtol=rtol,
            max_iterations=max_iterations,
        )
        solutions.append(solution)
        inner.append(solution.variables)
        block_costs.append(float(costs[group] @ solution.variables ** (-power)))
        block_columns.append(constraint[:, group] @ solution.variables)
    merge = _solve_weighting(
        np.asarray(block_costs),
        np.column_stack(block_columns),
        power=power,
        rtol=rtol,
        max_iterations=max_iterations,
    )
    solutions.append(merge)
    variables = np.concatenate(
        [
            factor * group_variables
            for factor, group_variables in zip(merge.variables, inner, strict=True)
        ]
    )
    return variables, solutions


def weights_principal(
    costs: np.ndarray,
    constraint: np.ndarray,
    *,
    principal_fraction: float,
    power: int,
    rtol: float,
    max_iterations: int,
) -> tuple[np.ndarray, list[_WeightingSolution]]:
    """Principal vectors (thesis 5.2.2.2): the top ``principal_fraction`` of the eigen-queries
    (``k`` of them, at least one) get their own weights, all remaining ones share a single
    weight; O(n k) per evaluation.
    """
    n_principal = max(1, math.ceil(principal_fraction * costs.size))
    if n_principal >= costs.size:
        return weights_full(
            costs, constraint, power=power, rtol=rtol, max_iterations=max_iterations
        )
    block_costs = np.append(costs[:n_principal], costs[n_principal:].sum())
    block_constraint = np.column_stack(
        [constraint[:, :n_principal], constraint[:, n_principal:].sum(axis=1)]
    )
    solution = _solve_weighting(
        block_costs, block_constraint, power=power, rtol=rtol, max_iterations=max_iterations
    )
    shared = np.full(costs.size - n_principal, solution.variables[-1])
    return np.concatenate([solution.variables[:n_principal], shared]), [solution]


def weighting(method: str, *, group_size: int = 16, principal_fraction: float = 0.1) -> Weighting:
    """The weighting program of ``method``: ``"full"`` (all weights free), ``"separation"`` (groups
    of ``group_size``, then one factor per group; 5.2.2.1) or ``"principal"`` (the top
    ``principal_fraction`` of eigen-queries free, the rest one shared weight; 5.2.2.2)."""
    if method not in ("full", "separation", "principal"):
        raise ValueError(f"method ({method!r}) must be 'full', 'separation' or 'principal'")
    _check_positive_int("group_size", group_size)
    _check_unit_interval("principal_fraction", principal_fraction, include_one=True)
    if method == "separation":
        return functools.partial(weights_separated, group_size=group_size)
    if method == "principal":
        return functools.partial(weights_principal, principal_fraction=principal_fraction)
    return weights_full


def eigen_design_speedup(
    gram: np.ndarray,
    *,
    method: str = "full",
    group_size: int = 16,
    principal_fraction: float = 0.1,
    **options: Any,
) -> EigenDesignStrategy:
    """:func:`mechanisms.eigen.design.eigen_design` with a section 5.2.2 weighting (see
    :func:`weighting`).  Cost per weighting evaluation: O(n r) ("full"), O(n g) per group plus
    O(n^2 / g) to merge ("separation"), or O(n k) ("principal")."""
    program = weighting(method, group_size=group_size, principal_fraction=principal_fraction)
    return eigen_design(gram, weighting=program, **options)


def eigen_design_from_spectrum(
    spectrum: WorkloadSpectrum,
    *,
    noise: NoiseKind = "gaussian",
    method: str = "full",
    group_size: int = 16,
    principal_fraction: float = 0.1,
    complete: bool = True,
    compare_svd_bound: bool = True,
    solver_rtol: float = 1e-7,
    max_iterations: int = 20_000,
) -> EigenDesignStrategy:
    """Eigen-Design from a known spectrum (e.g. :func:`all_range_spectrum`), skipping ``eigh``.

    Same steps and options as :func:`eigen_design_speedup`, except that the caller guarantees the
    workload is already minimised (no duplicate or zero columns) and the error is evaluated against
    ``Q diag(sigma) Q^T``.  Cost O(n^2 r) beyond the weighting program; intended for large
    structured workloads (n = 8192) where a dense eigen-decomposition dominates.

    References
    ----------
    Li thesis, Program 5.1.2 and section 5.2.2.
    """
    _validated_design_options(noise, solver_rtol, max_iterations)
    program = weighting(method, group_size=group_size, principal_fraction=principal_fraction)
    candidate, source, alternative, iterations, gap = _design(
        spectrum,
        noise=noise,
        weighting=program,
        complete=complete,
        compare_svd_bound=compare_svd_bound,
        solver_rtol=solver_rtol,
        max_iterations=max_iterations,
    )
    return SpectrumDesign(
        A=_strategy_matrix(candidate, spectrum),
        weights=candidate.row_weights,
        eigenvalues_kept=spectrum.eigenvalues,
        completion_weights=candidate.completion_weights,
        noise=noise,
        source=source,
        spectrum_total_error=candidate.total_error,
        total_error_before_completion=candidate.total_error_before_completion,
        alternative_total_error=alternative,
        spectrum_svd_bound=svd_bound_from_spectrum(spectrum),
        solver_iterations=iterations,
        solver_relative_gap=gap,
        column_of_cell=np.arange(spectrum.n_cells),
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class SpectrumDesign(EigenDesignStrategy):
    """An Eigen-Design result from a known spectrum: no dense Gram is held; the total error (on
    ``Q diag(sigma) Q^T``) and the SVD bound come from the spectrum."""

    gram: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    spectrum_total_error: float
    spectrum_svd_bound: float

    @property
    def total_error(self) -> float:  # type: ignore[override]
        return self.spectrum_total_error

    @property
    def svd_bound(self) -> float:  # type: ignore[override]
        return self.spectrum_svd_bound


def spectrum_gram(spectrum: WorkloadSpectrum) -> np.ndarray:
    """The dense Gram matrix ``Q diag(sigma) Q^T`` of a spectrum (O(n^2 r))."""
    return (spectrum.eigenvectors * spectrum.eigenvalues) @ spectrum.eigenvectors.T
