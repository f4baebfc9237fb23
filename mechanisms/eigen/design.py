"""Eigen-Design: data-independent strategy selection for the matrix mechanism, and its SVD bound.

Given a workload of linear counting queries W (m x n), the matrix mechanism answers a *strategy*
A (p x n) with noise and derives the workload answers from it.  Its expected total squared error
is ``P * sensitivity(A)^2 * trace(G (A^T A)^+)`` with ``G = W^T W``, so everything here works on
the Gram matrix G (or on its eigen-decomposition).  This module provides

* Eigen-Design (Program 5.1.2 of Li's thesis): weight the eigenvectors of G by a convex program,
  then complete deficient columns; an L2 variant (Gaussian noise: rho-zCDP or (eps, delta)) and an
  L1 variant (Laplace noise, eps-DP; Program 5.1.3 with its L1 constraint corrected);
* the singular value bound (SVDB), the lower bound on the total error of every L2 strategy, of
  the input Gram and of its minimised workload.

The section 5.2.2 speed-ups and exact error evaluation of any strategy are reference code in
``tests/reference/eigen.py``.  This module reads only the public workload: it draws no noise and
spends no privacy budget.

Conventions.  ``P`` is the noise variance per unit sensitivity (``1 / (2 rho)`` for rho-zCDP,
``2 / eps^2`` for Laplace, ``(sigma / Delta)^2`` for (eps, delta)); every total error here is
for ``P = 1``, and the expected total error of a calibrated mechanism is
``mechanism.variance * trace(G (A^T A)^+)``.  Cells are in C order.

References: C. Li, *Optimizing Linear Queries Under Differential Privacy*, PhD thesis, UMass Amherst, 2013,
chapters 4-5 (also Li & Miklau, PVLDB 5(6), 2012 and ICDT 2013).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.linalg

from dprelease.mechanisms.primitives.linalg import read_only
from dprelease.mechanisms.primitives.lower_bound import svd_bound_gram, validate_gram
from dprelease.mechanisms.primitives.noise import NoiseKind, validate_noise

StrategySource = Literal["eigen_design", "svd_bound"]

DEFAULT_EIGENVALUE_RTOL = 1e-8
"""Eigenvalues of G at or below this fraction of the largest are treated as zero (thesis 5.2.1)."""

DEFAULT_DUPLICATE_RTOL = 1e-10
"""Columns j, k of W are merged when ``|w_j - w_k|^2 <= rtol * max_j |w_j|^2`` (Def 2.6)."""

_SINGULAR_RCOND = 1e-12
_SUPPORT_RTOL = 1e-8


@dataclass(frozen=True, kw_only=True, eq=False)  # array fields: compare by identity
class WorkloadSpectrum:
    """The non-zero part of the eigen-decomposition ``G = Q diag(eigenvalues) Q^T`` of a Gram matrix.

    Eigenvalues are sorted in decreasing order; zero (or negligible) ones are omitted, so
    ``eigenvectors`` is ``n_cells x rank`` with orthonormal columns.
    """

    eigenvalues: np.ndarray
    """Positive eigenvalues sigma_1 >= ... >= sigma_r of G."""
    eigenvectors: np.ndarray
    """``n_cells x r``; column i is the eigen-query q_i (thesis Def 5.1)."""

    def __post_init__(self) -> None:
        eigenvalues = np.asarray(self.eigenvalues, dtype=np.float64)
        eigenvectors = np.asarray(self.eigenvectors, dtype=np.float64)
        if eigenvalues.ndim != 1 or eigenvalues.size == 0:
            raise ValueError(
                f"eigenvalues (shape {eigenvalues.shape}) must be a non-empty 1-D array"
            )
        if eigenvectors.ndim != 2 or eigenvectors.shape[1] != eigenvalues.size:
            raise ValueError(
                f"eigenvectors (shape {eigenvectors.shape}) must be n_cells x {eigenvalues.size}"
            )
        if not (np.all(np.isfinite(eigenvalues)) and np.all(eigenvalues > 0)):
            raise ValueError("eigenvalues must be finite and > 0 (drop zero eigenvalues first)")
        if np.any(np.diff(eigenvalues) > 0):
            raise ValueError("eigenvalues must be sorted in decreasing order")
        if not np.all(np.isfinite(eigenvectors)):
            raise ValueError("eigenvectors must be finite")
        object.__setattr__(self, "eigenvalues", read_only(eigenvalues, np.float64))
        object.__setattr__(self, "eigenvectors", read_only(eigenvectors, np.float64))

    @property
    def n_cells(self) -> int:
        return int(self.eigenvectors.shape[0])

    @property
    def rank(self) -> int:
        return int(self.eigenvalues.size)


@dataclass(frozen=True, kw_only=True, eq=False)  # array fields: compare by identity
class MinimizedWorkload:
    """A workload with duplicate columns merged and zero columns dropped (thesis Def 2.6).

    Original cell ``j`` maps to column ``column_of_cell[j]`` of the minimised workload, or to -1 if
    no query reads it.  A strategy ``A_min`` on the minimised columns becomes a strategy on the
    original cells as ``A_min[:, column_of_cell]`` with zero columns for the dropped cells; the
    sensitivity and the total error are unchanged (Prop 5.1).
    """

    gram: np.ndarray
    """``n_min x n_min`` Gram matrix of the minimised workload."""
    column_of_cell: np.ndarray
    """Length n (original cells), values in ``-1 .. n_min - 1``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gram", read_only(self.gram, np.float64))
        object.__setattr__(self, "column_of_cell", read_only(self.column_of_cell, np.intp))

    def expand_strategy(self, strategy_on_columns: np.ndarray) -> np.ndarray:
        """Lift a ``p x n_min`` strategy to the ``p x n`` original cells (O(p n))."""
        expanded = np.zeros((strategy_on_columns.shape[0], self.column_of_cell.size))
        kept = self.column_of_cell >= 0
        expanded[:, kept] = strategy_on_columns[:, self.column_of_cell[kept]]
        return expanded


@dataclass(frozen=True, kw_only=True, eq=False)  # array fields: compare by identity
class EigenDesignStrategy:
    """A strategy chosen by Eigen-Design, with what is needed to audit and reproduce it.

    *Privacy*: ``A`` depends only on the (public) workload; its sensitivity for ``noise`` is 1.
    """

    A: np.ndarray
    """Dense ``p x n`` strategy on the original cells: weighted eigen-queries, then completion rows."""
    weights: np.ndarray
    """Row weights lambda_i of the kept eigen-queries (rows ``lambda_i q_i`` of A), length r."""
    eigenvalues_kept: np.ndarray
    """The eigenvalues sigma_i of the (minimised) Gram matrix that were kept, decreasing."""
    completion_weights: np.ndarray
    """d_j per minimised column (zero where no completion row was added), length n_min."""
    noise: NoiseKind
    source: StrategySource
    """Which candidate was returned: the optimised weights, or the SVD-bound weights (completed)."""
    gram: np.ndarray
    """The input Gram G (public), for :attr:`total_error` and :attr:`svd_bound` on demand."""
    total_error_before_completion: float
    """The same for the weighted eigen-queries alone (steps 1-3 of Program 5.1.2)."""
    alternative_total_error: float
    """Completed error of the candidate not returned (``nan`` if it was not evaluated)."""
    solver_iterations: int
    """L-BFGS-B iterations summed over all weighting programs solved."""
    solver_relative_gap: float
    """Largest relative primal-dual gap over the weighting programs solved (optimality certificate)."""
    column_of_cell: np.ndarray
    """Original cell -> minimised column (-1: no query reads the cell); see MinimizedWorkload."""

    def __post_init__(self) -> None:
        for field_name in ("A", "weights", "eigenvalues_kept", "completion_weights"):
            object.__setattr__(self, field_name, read_only(getattr(self, field_name), np.float64))
        object.__setattr__(self, "column_of_cell", read_only(self.column_of_cell, np.intp))
        gram = np.asarray(self.gram, dtype=np.float64).view()  # no O(n^2) copy
        gram.setflags(write=False)
        object.__setattr__(self, "gram", gram)

    @functools.cached_property
    def _representatives(self) -> np.ndarray:
        """The first cell of each minimised column (the columns ``A`` was expanded from)."""
        _, first = np.unique(self.column_of_cell, return_index=True)
        return first[self.column_of_cell[first] >= 0]

    @functools.cached_property
    def total_error(self) -> float:
        """``sensitivity(A)^2 * trace(G (A^T A)^+)`` for the input Gram (noise variance P = 1),
        evaluated against the whole minimised Gram, not only its kept eigenvalues.  O(n^3) on
        first access; a plan never reads it."""
        cells = self._representatives
        strategy = self.A[:, cells]
        return _trace_gram_pinv(strategy.T @ strategy, gram=self.gram[np.ix_(cells, cells)])

    @functools.cached_property
    def svd_bound(self) -> float:
        """Lower bound on :attr:`total_error` under L2 (Thm 4.1): max(SVDB, SVDB+) of the input
        Gram.  O(n^3) on first access; a plan never reads it."""
        cells = self._representatives
        return max(svd_bound_gram(self.gram), svd_bound_gram(self.gram[np.ix_(cells, cells)]))


def _check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} ({value}) must be an integer >= 1")
    return int(value)


def _check_unit_interval(name: str, value: float, *, include_one: bool) -> float:
    upper_ok = value <= 1.0 if include_one else value < 1.0
    if not (math.isfinite(value) and value > 0.0 and upper_ok):
        bound = "<= 1" if include_one else "< 1"
        raise ValueError(f"{name} ({value}) must be > 0 and {bound}")
    return float(value)


def workload_spectrum(gram: np.ndarray) -> WorkloadSpectrum:
    """Dense eigen-decomposition of G, dropping eigenvalues ``<= DEFAULT_EIGENVALUE_RTOL * max``
    (O(n^3))."""
    gram = validate_gram(gram, nonzero=True)
    eigenvalues, eigenvectors = np.linalg.eigh(gram)  # O(n^3)
    order = np.argsort(eigenvalues)[::-1]
    eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
    if eigenvalues[0] <= 0:
        raise ValueError("gram has no positive eigenvalue")
    kept = eigenvalues > DEFAULT_EIGENVALUE_RTOL * eigenvalues[0]
    return WorkloadSpectrum(eigenvalues=eigenvalues[kept], eigenvectors=eigenvectors[:, kept])


def minimize_workload(gram: np.ndarray) -> MinimizedWorkload:
    """Merge duplicate columns and drop zero columns of W, using only G (Def 2.6, O(n n_min)).

    Columns j and k of W are equal iff ``G_jj + G_kk - 2 G_jk = |w_j - w_k|^2 = 0``; column j is
    zero iff ``G_jj = 0``.  Both tests use the tolerance ``DEFAULT_DUPLICATE_RTOL * max_j G_jj``.
    Each merged group keeps its lowest-index cell as representative.
    """
    gram = validate_gram(gram, nonzero=True)
    diagonal = np.diag(gram)
    tolerance = DEFAULT_DUPLICATE_RTOL * float(diagonal.max())
    if diagonal.max() <= 0:
        raise ValueError("gram must have a positive diagonal entry (some query reads a cell)")
    column_of_cell = np.full(gram.shape[0], -1, dtype=np.intp)
    unassigned = diagonal > tolerance
    representatives: list[int] = []
    for cell in np.flatnonzero(unassigned):
        if not unassigned[cell]:
            continue
        squared_distance = diagonal[cell] + diagonal - 2.0 * gram[cell]  # O(n)
        group = unassigned & (squared_distance <= tolerance)
        group[cell] = True
        column_of_cell[group] = len(representatives)
        unassigned &= ~group
        representatives.append(int(cell))
    kept = np.asarray(representatives, dtype=np.intp)
    return MinimizedWorkload(gram=gram[np.ix_(kept, kept)], column_of_cell=column_of_cell)


def _trace_gram_pinv(
    normal_matrix: np.ndarray,
    *,
    gram: np.ndarray | None = None,
    gram_factor: np.ndarray | None = None,
) -> float:
    """``trace(G X^+)`` for ``X = A^T A``, with G given densely or as ``F`` with ``G = F F^T``.

    Well-conditioned X: Cholesky (O(n^3)).  Singular X (rank-deficient workloads, strategies
    without completion): pivoted Cholesky ``X = P L L^T P^T`` with L of full column rank k; if
    ``F = P L Y`` (A supports W) then ``trace(F^T X^+ F) = |Y|_F^2`` (O(n^2 (k + r))).  An
    eigen-decomposition (O(n^3)) settles the cases the pivoted factorisation cannot.
    """
    try:
        factor, lower = scipy.linalg.cho_factor(normal_matrix, lower=True)  # O(n^3 / 3)
        norm_1 = float(np.max(np.sum(np.abs(normal_matrix), axis=0)))
        rcond, info = scipy.linalg.lapack.dpocon(factor, norm_1, uplo="L")
        well_conditioned = info == 0 and rcond > _SINGULAR_RCOND
    except np.linalg.LinAlgError:
        well_conditioned = False
    if well_conditioned:
        if gram_factor is not None:
            solved = scipy.linalg.solve_triangular(factor, gram_factor, lower=True)  # O(n^2 r)
            return float(np.sum(solved**2))
        return float(np.trace(scipy.linalg.cho_solve((factor, lower), gram)))  # O(n^3)
    if gram_factor is None:
        gram_factor = _psd_factor(gram)
    strategy_factor, pivots = _pivoted_cholesky(normal_matrix)  # O(n^2 k)
    rank = strategy_factor.shape[1]
    permuted = gram_factor[pivots]
    coefficients = scipy.linalg.solve_triangular(
        strategy_factor[:rank], permuted[:rank], lower=True
    )  # O(k^2 r)
    residual = permuted[rank:] - strategy_factor[rank:] @ coefficients  # O(n k r)
    if np.sum(residual**2) <= _SUPPORT_RTOL * np.sum(gram_factor**2):
        return float(np.sum(coefficients**2))
    return _trace_gram_pinv_eigh(normal_matrix, gram_factor @ gram_factor.T)


def _pivoted_cholesky(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``matrix[p][:, p] = L L^T`` with L (n x k) lower trapezoidal of full column rank (O(n^2 k));
    pivots below ``_SINGULAR_RCOND * max(diag)`` end the factorisation (numerical rank k)."""
    tolerance = _SINGULAR_RCOND * float(np.max(np.diag(matrix)))
    factor, pivots, rank, info = scipy.linalg.lapack.dpstrf(matrix, tol=tolerance, lower=1)
    if info < 0:
        raise np.linalg.LinAlgError(f"dpstrf failed (info {info})")
    return np.tril(factor)[:, :rank], pivots - 1


def _psd_factor(gram: np.ndarray) -> np.ndarray:
    """F with ``G = F F^T`` (up to round-off) for a PSD Gram matrix (O(n^2 rank))."""
    factor, pivots = _pivoted_cholesky(gram)
    unpermuted = np.empty_like(factor)
    unpermuted[pivots] = factor
    return unpermuted


def _trace_gram_pinv_eigh(normal_matrix: np.ndarray, gram: np.ndarray) -> float:
    """``trace(G X^+)`` from an eigen-decomposition of X, checking support first (O(n^3))."""
    eigenvalues, eigenvectors = np.linalg.eigh(normal_matrix)  # O(n^3)
    kept = eigenvalues > _SINGULAR_RCOND * max(float(eigenvalues.max()), 0.0)
    basis = eigenvectors[:, kept]
    projected = basis.T @ gram @ basis  # O(n^2 k)
    captured = float(np.trace(projected))
    total = float(np.trace(gram))
    if total - captured > _SUPPORT_RTOL * total:
        raise ValueError(
            "strategy does not support the workload: "
            f"{(total - captured) / total:.3g} of trace(G) lies outside the row space of A"
        )
    return float(np.sum(np.diag(projected) / eigenvalues[kept]))


@dataclass(frozen=True, kw_only=True)
class _WeightingSolution:
    variables: np.ndarray
    """Feasible weights (largest constraint exactly 1)."""
    primal: float
    """Objective at ``variables`` (an upper bound on the optimum)."""
    dual: float
    """Best dual value found (a lower bound on the optimum)."""
    iterations: int
    multipliers: np.ndarray
    """Final cell multipliers mu (a warm start for a larger working set)."""

    @property
    def relative_gap(self) -> float:
        return (self.primal - self.dual) / self.primal


def _solve_weighting(
    costs: np.ndarray,
    constraint: np.ndarray,
    *,
    power: int,
    rtol: float,
    max_iterations: int,
) -> _WeightingSolution:
    """Minimise ``sum_i c_i / x_i^power`` subject to ``constraint @ x <= 1``, ``x > 0``.

    L2 (Program 5.1.1): x_i = lambda_i^2, power 1, ``constraint = Q o Q`` (squared column norms).
    L1 (Program 5.1.3, whose printed ``Q o Q`` is read as the L1 constraint): x_i = lambda_i,
    power 2, ``constraint = |Q|`` (column L1 norms).

    With many more cells than variables, the dual is solved on a working set of cells grown by
    the most violated ones (constraint generation); a restricted dual is still a lower bound, so
    the gap remains a certificate.  O(n k) per round outside the restricted solves."""
    n_cells, n_variables = constraint.shape
    if n_cells <= 4 * n_variables:
        return _solve_weighting_dual(
            costs, constraint, power=power, rtol=rtol, max_iterations=max_iterations
        )
    # The dual's starting point over all cells is already optimal for tight workloads (SVDB).
    start = _solve_weighting_dual(costs, constraint, power=power, rtol=rtol, max_iterations=0)
    if start.relative_gap <= rtol:
        return start
    best_primal, best_variables, lower_bound = start.primal, start.variables, start.dual
    # Work on the most loaded cells, plus each variable's largest entry so none is unbounded.
    initial_loads = constraint @ costs ** (1.0 / (power + 1))  # SVD-bound-like weights, O(n k)
    working = np.union1d(
        np.argsort(-initial_loads)[: 2 * n_variables], np.argmax(constraint, axis=0)
    )
    iterations = 0
    multipliers = None
    while True:
        restricted = _solve_weighting_dual(
            costs,
            constraint[working],
            power=power,
            rtol=rtol,
            max_iterations=max(max_iterations - iterations, 1),
            initial_multipliers=multipliers,
        )
        iterations += restricted.iterations
        lower_bound = max(lower_bound, restricted.dual)
        loads = constraint @ restricted.variables  # O(n k)
        peak = float(loads.max())
        primal = float(costs @ (restricted.variables / peak) ** (-power))
        if primal < best_primal:
            best_primal, best_variables = primal, restricted.variables / peak
        violated = np.flatnonzero(loads > 1.0 + 1e-12)
        gap = (best_primal - lower_bound) / best_primal
        if gap <= rtol or violated.size == 0 or iterations >= max_iterations:
            return _WeightingSolution(
                variables=best_variables,
                primal=best_primal,
                dual=lower_bound,
                iterations=iterations,
                multipliers=restricted.multipliers,
            )
        worst_first = violated[np.argsort(-loads[violated])]
        enlarged = np.union1d(working, worst_first[: 2 * n_variables])
        multipliers = np.zeros(enlarged.size)  # new cells start at their bound mu = 0
        multipliers[np.searchsorted(enlarged, working)] = restricted.multipliers
        working = enlarged


def _solve_weighting_dual(
    costs: np.ndarray,
    constraint: np.ndarray,
    *,
    power: int,
    rtol: float,
    max_iterations: int,
    initial_multipliers: np.ndarray | None = None,
) -> _WeightingSolution:
    """:func:`_solve_weighting` through its concave dual over cell multipliers mu >= 0.

    With s = constraint^T mu: ``x_i(mu) = (p c_i / s_i)^(1/(p+1))`` and
    ``D(mu) = kappa_p sum_i c_i^(1/(p+1)) s_i^(p/(p+1)) - sum_j mu_j`` whose gradient is
    ``constraint @ x(mu) - 1``.  L-BFGS-B maximises D; every evaluation also yields a feasible
    primal point (x rescaled so its largest constraint is 1), and the solve stops when the
    relative primal-dual gap is ``<= rtol``.  Each evaluation is O(n k).  ``initial_multipliers``
    are in the units of the original costs.
    """
    import scipy.optimize  # imported here: 0.2 s that planning from the strategy store never needs

    scale = float(costs.max())
    normalised_costs = costs / scale
    exponent = 1.0 / (power + 1)
    kappa = power ** (-power * exponent) + power**exponent
    cost_roots = normalised_costs**exponent
    n_constraints = constraint.shape[0]
    state = {"primal": math.inf, "dual": -math.inf, "best": None}

    def primal_point(dual_slack: np.ndarray) -> np.ndarray:
        floor = max(1e-14 * float(dual_slack.max()), np.finfo(np.float64).tiny)
        return (power * normalised_costs / np.maximum(dual_slack, floor)) ** exponent

    def negative_dual(multipliers: np.ndarray) -> tuple[float, np.ndarray]:
        dual_slack = constraint.T @ multipliers  # O(n k)
        value = kappa * cost_roots @ np.maximum(dual_slack, 0.0) ** (power * exponent)
        value -= multipliers.sum()
        variables = primal_point(dual_slack)
        loads = constraint @ variables  # O(n k)
        peak = float(loads.max())
        primal = float(normalised_costs @ variables ** (-power)) * peak**power
        if primal < state["primal"]:
            state["primal"], state["best"] = primal, variables / peak
        state["dual"] = max(state["dual"], float(value))
        return -float(value), 1.0 - loads

    def relative_gap() -> float:
        return (state["primal"] - state["dual"]) / state["primal"]

    def stop_when_certified(intermediate_result: scipy.optimize.OptimizeResult) -> None:
        if relative_gap() <= rtol:
            raise StopIteration

    if initial_multipliers is None:
        # The best multiple of mu = 1 (the dual value there is SVDB for eigen-queries).
        uniform_slack = constraint.T @ np.ones(n_constraints)
        level = cost_roots @ uniform_slack ** (power * exponent)
        start = (kappa * level * power * exponent / n_constraints) ** (power + 1)
        multipliers = np.full(n_constraints, start)
    else:
        multipliers = initial_multipliers / scale
    negative_dual(multipliers)
    iterations = 0
    # L-BFGS-B can stall while it drives most multipliers to their bound 0 (often only a few cells
    # are tight at the optimum); restarting from the stall point with a fresh memory resolves it.
    while relative_gap() > rtol and iterations < max_iterations:
        dual_before = state["dual"]
        result = scipy.optimize.minimize(
            negative_dual,
            multipliers,
            jac=True,
            method="L-BFGS-B",
            bounds=scipy.optimize.Bounds(0.0, np.inf),
            callback=stop_when_certified,
            options={
                "maxiter": max_iterations - iterations,
                "maxcor": 20,
                "ftol": 0.0,
                "gtol": 0.0,
            },
        )
        iterations += max(int(result.nit), 1)
        multipliers = result.x
        if state["dual"] <= dual_before:
            break  # no progress from a fresh start: the gap is at round-off level
    return _WeightingSolution(
        variables=np.asarray(state["best"]),
        primal=state["primal"] * scale,
        dual=state["dual"] * scale,
        iterations=iterations,
        multipliers=multipliers * scale,
    )


Weighting = Callable[..., tuple[np.ndarray, list[_WeightingSolution]]]
"""``(costs, constraint, *, power, rtol, max_iterations) -> (variables, solutions)``."""


def weights_full(
    costs: np.ndarray, constraint: np.ndarray, *, power: int, rtol: float, max_iterations: int
) -> tuple[np.ndarray, list[_WeightingSolution]]:
    """The weighting program (5.1.1 / 5.1.3) with every eigen-query's weight free."""
    solution = _solve_weighting(
        costs, constraint, power=power, rtol=rtol, max_iterations=max_iterations
    )
    return solution.variables, [solution]


@dataclass(frozen=True, kw_only=True)
class _Candidate:
    row_weights: np.ndarray
    completion_weights: np.ndarray
    total_error: float
    total_error_before_completion: float


def _candidate(
    spectrum: WorkloadSpectrum,
    variables: np.ndarray,
    constraint: np.ndarray,
    *,
    noise: NoiseKind,
    complete: bool,
) -> _Candidate:
    """Strategy rows ``lambda_i q_i`` plus completion (steps 3-5), with its exact error.

    ``variables`` are scaled so the largest column norm is 1.  Completion (Thm 3.11, in the form
    that reproduces Table 4.1) adds the row ``d_j e_j`` to every deficient column j:
    ``d_j = sqrt(1 - m_j^2)`` (L2) or ``d_j = 1 - m_j`` (L1), where m_j is the column norm; the
    sensitivity stays 1.
    """
    loads = constraint @ variables  # O(n r): squared L2 or L1 column norms
    peak = float(loads.max())
    variables = variables / peak
    loads = loads / peak
    deficit = 1.0 - loads
    deficit[deficit <= 1e-12] = 0.0  # columns already at the sensitivity get no completion row
    if noise == "gaussian":
        row_weights, completion = np.sqrt(variables), np.sqrt(deficit)
    else:
        row_weights, completion = variables, deficit
    before = after = float(np.sum(spectrum.eigenvalues / row_weights**2))
    if not complete:
        completion = np.zeros_like(completion)
    if np.any(completion > 0):
        eigenvectors = spectrum.eigenvectors
        weighted = eigenvectors * row_weights
        normal_matrix = weighted @ weighted.T  # O(n^2 r); numpy uses syrk for X @ X.T
        normal_matrix[np.diag_indices_from(normal_matrix)] += completion**2
        after = _trace_gram_pinv(
            normal_matrix, gram_factor=eigenvectors * np.sqrt(spectrum.eigenvalues)
        )
    return _Candidate(
        row_weights=row_weights,
        completion_weights=completion,
        total_error=after,
        total_error_before_completion=before,
    )


def _design(
    spectrum: WorkloadSpectrum,
    *,
    noise: NoiseKind,
    weighting: Weighting,
    complete: bool,
    compare_svd_bound: bool,
    solver_rtol: float,
    max_iterations: int,
) -> tuple[_Candidate, StrategySource, float, int, float]:
    eigenvectors = spectrum.eigenvectors
    if noise == "gaussian":
        constraint, power = eigenvectors**2, 1  # (Q o Q)^T u <= 1
    else:
        constraint, power = np.abs(eigenvectors), 2  # |Q|^T lambda <= 1 (printed as Q o Q)
    costs = spectrum.eigenvalues  # c_i = |W q_i|^2 = sigma_i for orthonormal eigen-queries
    variables, solutions = weighting(
        costs, constraint, power=power, rtol=solver_rtol, max_iterations=max_iterations
    )
    designed = _candidate(spectrum, variables, constraint, noise=noise, complete=complete)
    chosen, source, alternative = designed, "eigen_design", math.nan
    if compare_svd_bound:
        # SVD-bound strategy A_l: row weights sigma_i^(1/4) (Thm 4.10), then completion; this
        # comparison is not in the thesis.
        quarter_roots = spectrum.eigenvalues**0.25
        svd_variables = quarter_roots**2 if noise == "gaussian" else quarter_roots
        svd_candidate = _candidate(
            spectrum, svd_variables, constraint, noise=noise, complete=complete
        )
        if svd_candidate.total_error < designed.total_error:
            chosen, source, alternative = svd_candidate, "svd_bound", designed.total_error
        else:
            alternative = svd_candidate.total_error
    iterations = sum(solution.iterations for solution in solutions)
    gap = max(solution.relative_gap for solution in solutions)
    return chosen, source, alternative, iterations, gap


def _validated_design_options(noise: str, solver_rtol: float, max_iterations: int) -> None:
    validate_noise(noise)
    _check_unit_interval("solver_rtol", solver_rtol, include_one=False)
    _check_positive_int("max_iterations", max_iterations)


def _strategy_matrix(candidate: _Candidate, spectrum: WorkloadSpectrum) -> np.ndarray:
    """``[diag(lambda) Q^T ; d_j e_j for d_j > 0]`` on the minimised columns (O(n r))."""
    weighted = candidate.row_weights[:, None] * spectrum.eigenvectors.T
    completed_columns = np.flatnonzero(candidate.completion_weights > 0)
    completion_rows = np.zeros((completed_columns.size, spectrum.n_cells))
    completion_rows[np.arange(completed_columns.size), completed_columns] = (
        candidate.completion_weights[completed_columns]
    )
    return np.vstack([weighted, completion_rows])


def eigen_design(
    gram: np.ndarray,
    *,
    noise: NoiseKind = "gaussian",
    complete: bool = True,
    compare_svd_bound: bool = True,
    solver_rtol: float = 1e-7,
    max_iterations: int = 20_000,
    weighting: Weighting = weights_full,
) -> EigenDesignStrategy:
    """Choose a strategy for the workload with Gram matrix G by Eigen-Design (Program 5.1.2).

    1. Minimise the workload (merge duplicate columns, drop zero columns; Prop 5.1), so the result
       does not depend on how cells are represented; permuting cells permutes A's columns.
    2. Eigen-decompose the minimised G; drop eigenvalues ``<= DEFAULT_EIGENVALUE_RTOL * max``.
    3. Weight the eigen-queries by the convex program (5.1.1 for L2, 5.1.3 with the L1 constraint
       for L1), all weights free (``weighting``; the section 5.2.2 approximations that fix some
       weights are in ``tests/reference/eigen.py``).
    4. Complete deficient columns without raising the sensitivity (steps 4-5) if ``complete``.
    5. If ``compare_svd_bound``, also build the SVD-bound strategy (rows ``sigma_i^(1/4) q_i``)
       with completion and return whichever has the lower total error (not in the thesis, whose
       weights ignore what completion gains).

    ``gram`` is ``G = W^T W`` (n x n, PSD); ``noise`` ``"gaussian"`` (L2 sensitivity) or
    ``"laplace"`` (L1).  The weighting stops at a primal-dual gap ``<= solver_rtol`` or after
    ``max_iterations`` L-BFGS-B iterations.  ``A`` has sensitivity 1 in the chosen norm;
    ``total_error`` (on demand) is its exact error on G.  O(n^3) (eigen-decomposition, the
    completed candidates' errors), each weighting evaluation O(n r).  *Privacy*: reads only the public workload; spends no budget.
    """
    _validated_design_options(noise, solver_rtol, max_iterations)
    gram = validate_gram(gram, nonzero=True)
    minimized = minimize_workload(gram)
    spectrum = workload_spectrum(minimized.gram)
    candidate, source, alternative, iterations, gap = _design(
        spectrum,
        noise=noise,
        weighting=weighting,
        complete=complete,
        compare_svd_bound=compare_svd_bound,
        solver_rtol=solver_rtol,
        max_iterations=max_iterations,
    )
    return EigenDesignStrategy(
        A=minimized.expand_strategy(_strategy_matrix(candidate, spectrum)),
        weights=candidate.row_weights,
        eigenvalues_kept=spectrum.eigenvalues,
        completion_weights=candidate.completion_weights,
        noise=noise,
        source=source,
        gram=gram,
        total_error_before_completion=candidate.total_error_before_completion,
        alternative_total_error=alternative,
        solver_iterations=iterations,
        solver_relative_gap=gap,
        column_of_cell=minimized.column_of_cell,
    )
