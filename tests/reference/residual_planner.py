"""ResidualPlanner's optimum for marginal workloads under Gaussian noise: a reference for tests.

Xiao, He, Toksoz, Ding, Zhang, Kifer, "An Optimal and Scalable Matrix Mechanism for Noisy
Marginals under Convex Loss Functions" (NeurIPS 2023; arXiv 2305.08175), Section 4 and Thm 1-4.
Written from the paper's formulas, in the paper's terms, so that the product's marginal
planners (and issue 28's objectives) can be checked against an independent computation.

Attribute ``i`` has ``n_i`` values.  For every attribute set ``A`` in the downward closure of the
workload's marginals, the residual query ``R_A`` is measured with Gaussian noise of scale
``σ²_A`` (covariance ``σ²_A · (Sub Subᵀ)^{⊗A}``).  With ``x_A = σ²_A``:

* privacy cost ``pcost(x) = Σ_A p_A / x_A`` with ``p_A = Π_{i∈A} (n_i − 1)/n_i`` (pcost = 2ρ);
* every cell of the marginal on ``S`` has variance ``Var_S(x) = Σ_{A⊆S} c_{S,A} x_A`` with
  ``c_{S,A} = Π_{i∈A} (n_i − 1)/n_i · Π_{j∈S∖A} 1/n_j²``.

Both objectives below are stated at pcost 1 (ρ = 0.5); variances scale as ``1/pcost``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse


@dataclass(frozen=True)
class ResidualProgram:
    """The residual sets of a marginal workload and the coefficients of its two objectives."""

    sizes: tuple[int, ...]
    tables: tuple[tuple[int, ...], ...]  # the workload's marginals, attribute indices ascending
    residuals: tuple[tuple[int, ...], ...]  # their downward closure
    privacy_weights: np.ndarray  # p_A, one per residual set
    variance_coefficients: sparse.csr_array  # c_{S,A}: tables × residual sets (0 where A ⊄ S)
    cells: np.ndarray  # cells of each table

    @classmethod
    def for_marginals(
        cls, sizes: Sequence[int], tables: Sequence[Sequence[int]]
    ) -> ResidualProgram:
        """The program for the marginals ``tables`` over attributes of ``sizes``.  O(T · 2^k · k)
        for T tables of at most k attributes."""
        sizes = tuple(int(n) for n in sizes)
        tables = tuple(tuple(sorted(int(i) for i in table)) for table in tables)
        pairs = [
            (row, subset)
            for row, table in enumerate(tables)
            for k in range(len(table) + 1)
            for subset in itertools.combinations(table, k)
        ]  # (table, residual set A ⊆ it)
        closure = sorted({subset for _, subset in pairs}, key=lambda subset: (len(subset), subset))
        index = {subset: column for column, subset in enumerate(closure)}
        fraction = [(n - 1) / n for n in sizes]
        privacy_weights = np.array([math.prod(fraction[i] for i in subset) for subset in closure])
        values = [
            math.prod(fraction[i] for i in subset)
            / math.prod(sizes[j] ** 2 for j in tables[row] if j not in subset)
            for row, subset in pairs
        ]
        coefficients = sparse.csr_array(
            (values, ([row for row, _ in pairs], [index[subset] for _, subset in pairs])),
            shape=(len(tables), len(closure)),
        )
        cells = np.array([math.prod(sizes[i] for i in table) for table in tables], dtype=float)
        return cls(sizes, tables, tuple(closure), privacy_weights, coefficients, cells)

    def table_variances(self, scales: np.ndarray) -> np.ndarray:
        """``Var_S`` of every table for the noise variances ``scales`` (one per residual set)."""
        return self.variance_coefficients @ scales

    def privacy_cost(self, scales: np.ndarray) -> float:
        """``pcost = Σ p_A / σ²_A`` (= 2ρ under zCDP)."""
        return float(np.sum(self.privacy_weights / scales))

    def total_variance_optimum(self) -> tuple[float, np.ndarray]:
        """Least sum of variances over all released cells at pcost 1, and its noise variances.

        Cauchy–Schwarz: with ``v_A = Σ_S cells(S) c_{S,A}``, the optimum is
        ``(Σ_A √(v_A p_A))²`` at ``σ²_A = √(p_A / v_A) · Σ_B √(v_B p_B)``.
        """
        weights = self.cells @ self.variance_coefficients
        root = np.sqrt(weights * self.privacy_weights)
        scales = np.sqrt(self.privacy_weights / weights) * root.sum()
        return float(root.sum() ** 2), scales

    def rmse(self, total: float) -> float:
        """Root mean squared error per released cell of a sum of variances ``total``."""
        return math.sqrt(total / float(self.cells.sum()))

    def max_variance_optimum(
        self, *, gap: float = 1e-6, iterations: int = 10_000
    ) -> tuple[float, np.ndarray]:
        """Least largest cell variance over the tables at pcost 1, and its noise variances.

        The program ``min_x max_S Var_S(x)`` subject to ``pcost(x) ≤ 1`` is solved through its
        dual: for table weights ``λ`` on the simplex, ``min_x Σ_S λ_S Var_S(x)`` has the closed
        form above with ``v = Cᵀλ``, a lower bound on the optimum that is concave in ``λ``; its
        minimiser ``x(λ)`` is feasible, and its largest variance an upper bound.  Exponentiated
        gradient steps on ``λ`` (the gradient is ``Var(x(λ))``) until the bounds agree within
        ``gap`` (relative), so the value returned is certified.  O(iterations · T · 2^k).
        """
        coefficients, weights = self.variance_coefficients, self.privacy_weights
        table_weights = np.full(len(self.tables), 1.0 / len(self.tables))
        lower, upper, best = 0.0, math.inf, np.empty(0)
        for _ in range(iterations):
            root = np.sqrt(weights * (coefficients.T @ table_weights))
            scales = weights / root * root.sum()  # √(p/v) · Σ√(pv): pcost(scales) = 1
            variances = self.table_variances(scales)
            lower = max(lower, float(root.sum() ** 2))
            if variances.max() < upper:
                upper, best = float(variances.max()), scales
            if upper <= lower * (1.0 + gap):
                return upper, best
            table_weights = table_weights * np.exp(2.0 * (variances / variances.max() - 1.0))
            table_weights /= table_weights.sum()
        raise RuntimeError(f"no certified optimum in {iterations} steps: {lower} <= opt <= {upper}")


def all_marginals(d: int, degrees: Sequence[int]) -> list[tuple[int, ...]]:
    """Every marginal on ``k`` of ``d`` attributes, for each ``k`` in ``degrees``."""
    return [table for k in degrees for table in itertools.combinations(range(d), k)]
