"""Closed-form expected error of a workload under a strategy.

For the matrix mechanism with i.i.d. noise of variance ``v`` on ``A·x`` (``v`` already includes the
strategy's sensitivity), the least-squares answer to query ``w`` has variance
``v · w (AᵀA)⁺ wᵀ`` (Li thesis §3.2.1, Prop 3.4).  With ``A`` and every item
Kronecker products, ``w (AᵀA)⁺ wᵀ`` over an item is the outer product of per-attribute terms
``diag(W_i M_i W_iᵀ)`` with ``M_i = (A_iᵀA_i)⁺``, and its sum is ``Π_i tr(W_iᵀW_i M_i)``.

The SVD lower bound lives in :mod:`mechanisms.lower_bound`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mechanisms.strategies import KronStrategy
from mechanisms.workload import Workload, WorkloadItem


@dataclass(frozen=True, kw_only=True)
class ErrorReport:
    """Expected squared error of every workload query (unbiased: error = variance)."""

    total_variance: float
    num_queries: int
    item_total_variance: dict[str, float]

    @property
    def rmse(self) -> float:
        """√(mean per-query variance) over all queries of all items, unweighted."""
        return float(np.sqrt(self.total_variance / self.num_queries))


class Strategy(Protocol):
    """What error analysis needs from a strategy (Kronecker products and unions both provide it)."""

    def item_unit_variances(self, item: WorkloadItem, workload: Workload) -> np.ndarray: ...

    def item_unit_total(self, item: WorkloadItem, workload: Workload) -> float: ...

    def support_residual(self, workload: Workload) -> float: ...


def item_unit_variances(item: WorkloadItem, strategy: KronStrategy) -> np.ndarray:
    """``diag(W (AᵀA)⁺ Wᵀ)`` for one item under a Kronecker strategy (row-major query order)."""
    return strategy.item_unit_variances(item)


def item_unit_total(item: WorkloadItem, strategy: KronStrategy) -> float:
    """``tr(WᵀW (AᵀA)⁺)`` for one item under a Kronecker strategy."""
    return strategy.item_unit_total(item)


def expected_error(workload: Workload, strategy: Strategy, *, noise_variance: float) -> ErrorReport:
    """Expected total and per-item error when each strategy answer gets noise of ``noise_variance``."""
    if not noise_variance > 0:
        raise ValueError(f"noise_variance ({noise_variance}) must be > 0")
    per_item = {
        item.name: noise_variance * strategy.item_unit_total(item, workload)
        for item in workload.items
    }
    return ErrorReport(
        total_variance=float(sum(per_item.values())),
        num_queries=workload.num_queries,
        item_total_variance=per_item,
    )


def support_residual(workload: Workload, strategy: Strategy) -> float:
    """≈ 0 iff the strategy supports every workload query (see the strategy's own method)."""
    return strategy.support_residual(workload)


def dense_support_residual(workload: Workload, projector: np.ndarray) -> float:
    """Support check of a dense strategy from Grams only; ≈ 0 iff ``A`` supports every item.

    ``projector`` is ``P = (AᵀA)⁺AᵀA`` (N × N).  Per item, the largest column norm of ``W(I − P)``,
    ``√max_j ((I − P)ᵀ WᵀW (I − P))_jj``, relative to ``max(1, max|W|)``: it bounds every entry
    of the residual ``W − WP`` (the previous, W-based measure) from above.  O(N³) per item with
    ``WᵀW`` from closed-form factor Grams; the item's ``m × N`` matrix is never formed.
    """
    complement = np.eye(projector.shape[0]) - projector
    worst = 0.0
    for item in workload.items:
        columns = np.einsum("kj,kj->j", complement, item.dense_gram() @ complement)
        scale = max(1.0, math.prod(factor.max_abs() for factor in item.factors))
        worst = max(worst, math.sqrt(max(float(columns.max()), 0.0)) / scale)
    return worst
