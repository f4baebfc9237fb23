"""Closed-form expected error of a workload under a strategy, as a report (for tests).

For the matrix mechanism with i.i.d. noise of variance ``v`` on ``A·x`` (``v`` already includes the
strategy's sensitivity), the least-squares answer to query ``w`` has variance
``v · w (AᵀA)⁺ wᵀ`` (Li thesis §3.2.1, Prop 3.4).  The product asks each strategy for these terms
directly (``item_unit_variances``, ``item_unit_total``, ``support_residual``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dprelease.mechanisms.primitives.strategies import KronStrategy
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem


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
