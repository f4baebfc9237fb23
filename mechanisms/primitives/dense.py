"""Explicit strategies over the whole (small) cell vector: Eigen-Design and Low-Rank outputs.

A :class:`DenseStrategy` is a ``p × N`` matrix over the flattened domain with the same interface
as the Kronecker and union strategies (measure, least squares, per-query variances, support), so
the pipeline treats every data-independent mechanism alike.  It is meant for domains of at most a
few thousand cells: the cell covariance ``(AᵀA)⁺`` is formed densely (O(N³)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from dprelease.mechanisms.primitives.linalg import l1_sensitivity, psd_pinv
from dprelease.mechanisms.primitives.noise import NoiseKind, validate_noise
from dprelease.mechanisms.primitives.operators import kron_query_variances
from dprelease.mechanisms.primitives.protocol import LeastSquaresAnswers
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

MAX_DENSE_CELLS = 8192


@dataclass(frozen=True, kw_only=True)
class DenseStrategy(LeastSquaresAnswers):
    """Strategy ``A`` (p × N) measured as ``A x + noise`` and answered by least squares."""

    name: str
    matrix: np.ndarray
    parameters: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        matrix = np.asarray(self.matrix, dtype=np.float64)
        if matrix.ndim != 2 or not np.all(np.isfinite(matrix)):
            raise ValueError(f"strategy matrix must be a finite 2-D array (shape {matrix.shape})")
        if matrix.shape[1] > MAX_DENSE_CELLS:
            raise ValueError(
                f"an explicit strategy needs the domain to have at most {MAX_DENSE_CELLS} cells "
                f"(got {matrix.shape[1]})"
            )
        object.__setattr__(self, "matrix", matrix)

    @property
    def num_queries(self) -> int:
        return int(self.matrix.shape[0])

    def sensitivity(self, *, noise: NoiseKind) -> float:
        validate_noise(noise)
        if noise == "laplace":
            return l1_sensitivity(self.matrix)
        return float(np.sqrt((self.matrix**2).sum(axis=0)).max())

    def apply(self, x: np.ndarray) -> np.ndarray:
        return self.matrix @ np.asarray(x, dtype=np.float64)  # O(p N)

    def covariance(self) -> np.ndarray:
        """``(AᵀA)⁺`` (unit noise), computed once."""
        return self._unit_covariance

    @cached_property
    def _unit_covariance(self) -> np.ndarray:
        return psd_pinv(self.matrix.T @ self.matrix)  # O(p N² + N³)

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


def dense_support_residual(workload: Workload, projector: np.ndarray) -> float:
    """≈ 0 iff the strategy ``A`` supports every item, from Grams only.

    A least-squares answer ``W·x̂`` is unbiased iff ``W`` lies in the row space of ``A`` (Li thesis
    §3.2.1).  ``projector`` is ``P = (AᵀA)⁺AᵀA`` (N × N).  Per item, the largest column norm of
    ``W(I − P)``, ``√max_j ((I − P)ᵀ WᵀW (I − P))_jj``, relative to ``max(1, max|W|)``: it bounds
    every entry of the residual ``W − WP`` from above.  O(N³) per item with ``WᵀW`` from
    closed-form factor Grams; the item's ``m × N`` matrix is never formed.
    """
    complement = np.eye(projector.shape[0]) - projector
    worst = 0.0
    for item in workload.items:
        columns = np.einsum("kj,kj->j", complement, item.dense_gram() @ complement)
        scale = max(1.0, math.prod(factor.max_abs() for factor in item.factors))
        worst = max(worst, math.sqrt(max(float(columns.max()), 0.0)) / scale)
    return worst
