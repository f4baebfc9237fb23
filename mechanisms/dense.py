"""Explicit strategies over the whole (small) cell vector: Eigen-Design and Low-Rank outputs.

A :class:`DenseStrategy` is a ``p × N`` matrix over the flattened domain with the same interface
as the Kronecker and union strategies (measure, least squares, per-query variances, support), so
the pipeline treats every data-independent mechanism alike.  It is meant for domains of at most a
few thousand cells: the cell covariance ``(AᵀA)⁺`` is formed densely (O(N³)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mechanisms.error import dense_support_residual
from mechanisms.operators import kron_query_variances
from mechanisms.protocol import LeastSquaresAnswers
from mechanisms.strategies import psd_pinv
from mechanisms.workload import Workload, WorkloadItem

MAX_DENSE_CELLS = 8192


def _check_cells(n_cells: int) -> None:
    if n_cells > MAX_DENSE_CELLS:
        raise ValueError(
            f"an explicit strategy needs the domain to have at most {MAX_DENSE_CELLS} cells "
            f"(got {n_cells})"
        )


@dataclass(frozen=True, kw_only=True)
class DenseStrategy(LeastSquaresAnswers):
    """Strategy ``A`` (p × N) measured as ``A x + noise`` and answered by least squares."""

    name: str
    matrix: np.ndarray
    parameters: dict[str, object] = field(default_factory=dict)
    _covariance: list[np.ndarray] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        matrix = np.asarray(self.matrix, dtype=np.float64)
        if matrix.ndim != 2 or not np.all(np.isfinite(matrix)):
            raise ValueError(f"strategy matrix must be a finite 2-D array (shape {matrix.shape})")
        _check_cells(matrix.shape[1])
        object.__setattr__(self, "matrix", matrix)

    @property
    def num_queries(self) -> int:
        return int(self.matrix.shape[0])

    def sensitivity(self, *, norm: int) -> float:
        if norm == 1:
            return float(np.abs(self.matrix).sum(axis=0).max())
        if norm == 2:
            return float(np.sqrt((self.matrix**2).sum(axis=0)).max())
        raise ValueError(f"norm ({norm}) must be 1 or 2")

    def apply(self, x: np.ndarray) -> np.ndarray:
        return self.matrix @ np.asarray(x, dtype=np.float64)  # O(p N)

    def covariance(self) -> np.ndarray:
        """``(AᵀA)⁺`` (unit noise), cached. O(p N² + N³)."""
        if not self._covariance:
            self._covariance.append(psd_pinv(self.matrix.T @ self.matrix))
        return self._covariance[0]

    def least_squares(self, y: np.ndarray, workload: Workload | None = None) -> np.ndarray:
        return self.covariance() @ (self.matrix.T @ np.asarray(y, dtype=np.float64))

    def item_unit_variances(
        self, item: WorkloadItem, workload: Workload | None = None
    ) -> np.ndarray:
        # Gram-first: never the item's m × N query matrix (2 M × 2,048 for all ranges of 2,048)
        return kron_query_variances(item.factors, self.covariance())

    def item_unit_total(self, item: WorkloadItem, workload: Workload | None = None) -> float:
        return float(np.sum(item.dense_gram() * self.covariance()))  # tr(WᵀW (AᵀA)⁺), O(N²)

    def support_residual(self, workload: Workload) -> float:
        projector = self.covariance() @ (self.matrix.T @ self.matrix)  # (AᵀA)⁺AᵀA, O(p N² + N³)
        return dense_support_residual(workload, projector)


@dataclass(frozen=True, kw_only=True)
class FactorizationStrategy:
    """The Low-Rank Mechanism's ``W ≈ B·L``: measure ``L x + noise``, answer ``B·(L x + noise)``.

    ``item_rows`` gives each workload item's slice of the rows of ``B`` (items stacked in order).
    The estimator is LRM's own ``B y`` (Yuan et al. 2012), whose variance per unit noise is the
    squared row norm of ``B``; its bias ``(W − BL)x`` is bounded by ``bias_sq · ‖x‖²`` and reported
    separately (it depends on the data).
    """

    name: str
    B: np.ndarray
    L: np.ndarray
    item_rows: dict[str, tuple[int, int]]
    bias_sq: float
    parameters: dict[str, object] = field(default_factory=dict)

    @property
    def num_queries(self) -> int:
        return int(self.L.shape[0])

    def sensitivity(self, *, norm: int) -> float:
        return DenseStrategy(name=self.name, matrix=self.L).sensitivity(norm=norm)

    def apply(self, x: np.ndarray) -> np.ndarray:
        return self.L @ np.asarray(x, dtype=np.float64)  # O(r N)

    def answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        """LRM's own estimator ``B·y`` (not least squares): each item's rows of ``B``."""
        values = np.asarray(y, dtype=np.float64)
        answers = {}
        for item in workload.items:
            start, stop = self.item_rows[item.name]
            answers[item.name] = self.B[start:stop] @ values
        return answers

    def item_unit_variances(
        self, item: WorkloadItem, workload: Workload | None = None
    ) -> np.ndarray:
        start, stop = self.item_rows[item.name]
        return (self.B[start:stop] ** 2).sum(axis=1)

    def item_unit_total(self, item: WorkloadItem, workload: Workload | None = None) -> float:
        return float(self.item_unit_variances(item).sum())

    def support_residual(self, workload: Workload) -> float:
        """0: the relaxed factorisation answers every query by construction (with the reported
        bias ``bias_sq``), so support is not the right test for it."""
        return 0.0
