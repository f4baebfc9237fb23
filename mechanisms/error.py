"""Closed-form expected error of a workload under a strategy, and the SVD lower bound.

For the matrix mechanism with i.i.d. noise of variance ``v`` on ``A·x`` (``v`` already includes the
strategy's sensitivity), the least-squares answer to query ``w`` has variance
``v · w (AᵀA)⁺ wᵀ`` (Li thesis Prop 3.4; ``seed-mm.md`` §3.2).  With ``A`` and every item
Kronecker products, ``w (AᵀA)⁺ wᵀ`` over an item is the outer product of per-attribute terms
``diag(W_i M_i W_iᵀ)`` with ``M_i = (A_iᵀA_i)⁺``, and its sum is ``Π_i tr(W_iᵀW_i M_i)``.

The SVD bound (Li thesis Def 4.3, Prop 4.3; ``seed-eigen.md`` §1) is
``SVDB(W) = (Σ √λ_i(WᵀW))² / N``: no matrix-mechanism strategy has total squared error below
``P · SVDB(W)`` with ``P`` the noise variance per unit L2 sensitivity; it also bounds ε-DP
strategies with the Laplace ``P`` (§1.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mechanisms.operators import Identity, Total, kron_matrices
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


DENSE_BOUND_LIMIT = 4096
MAX_BLOCKS = 1 << 16


def svd_bound(workload: Workload) -> float | None:
    """``SVDB(W) = (Σ√λ(WᵀW))² / N`` exactly, or None when the domain is too large for the method.

    ``WᵀW = Σ_items ⊗_i G_{item,i}``.  Attributes on which every item is ``Identity`` or ``Total``
    (Grams ``I`` and ``J = 11ᵀ``) are split exactly into the span of ``1`` (where I→1, J→n) and its
    complement (I→1, J→0, multiplicity n−1); the remaining ("dense") attributes keep their Grams.
    The spectrum is then the union over the 2^k blocks of the eigenvalues of
    ``Σ_items (Π scalars) ⊗_dense G``, which is exact.  Pure marginal workloads reduce to scalars;
    a single Kronecker item uses the factor spectra directly.  Cost O(2^k · D³) with D the product
    of the dense attributes' sizes (limited to ``DENSE_BOUND_LIMIT``).
    """
    if len(workload.items) == 1:
        root_sum = 1.0
        for gram in workload.items[0].gram_factors():
            root_sum *= _root_eigen_sum(gram)
        return root_sum**2 / workload.num_cells
    shape = workload.domain_shape
    identity_total = [
        all(isinstance(item.factors[axis], Identity | Total) for item in workload.items)
        for axis in range(len(shape))
    ]
    split_axes = [axis for axis, flag in enumerate(identity_total) if flag]
    dense_axes = [axis for axis, flag in enumerate(identity_total) if not flag]
    dense_size = math.prod(shape[axis] for axis in dense_axes)
    if dense_size > DENSE_BOUND_LIMIT or 2 ** len(split_axes) > MAX_BLOCKS:
        return None
    terms = [
        tuple(
            item.factors[axis].gram() if axis in dense_axes else None for axis in range(len(shape))
        )
        for item in workload.items
    ]
    dense_grams = [[gram for axis, gram in enumerate(term) if axis in dense_axes] for term in terms]
    dense_products = [kron_matrices(grams) for grams in dense_grams]
    # Per block (bit j of the block index: 0 = span of 1, 1 = complement on split axis j) and per
    # item, the scalar its split factors contribute: Identity → 1 on both parts; Total → n on the
    # span of 1 and 0 on the complement.  O(2^k · items · k), vectorised.
    blocks = np.arange(2 ** len(split_axes))
    scalars = np.ones((blocks.size, len(terms)))
    multiplicity = np.ones(blocks.size)
    for j, axis in enumerate(split_axes):
        n = shape[axis]
        complement = ((blocks >> j) & 1).astype(bool)
        is_total = np.array([isinstance(item.factors[axis], Total) for item in workload.items])
        on_span = np.where(is_total, float(n), 1.0)
        on_complement = np.where(is_total, 0.0, 1.0)
        scalars *= np.where(complement[:, None], on_complement[None, :], on_span[None, :])
        multiplicity *= np.where(complement, n - 1, 1)
    root_sum = 0.0
    for block_scalars, count in zip(scalars, multiplicity, strict=True):
        if count == 0 or not block_scalars.any():
            continue
        if dense_size == 1:
            root_sum += count * float(np.sqrt(max(float(block_scalars.sum()), 0.0)))
            continue
        block = sum(
            w * product for w, product in zip(block_scalars, dense_products, strict=True) if w
        )
        root_sum += count * _root_eigen_sum(block)
    return root_sum**2 / workload.num_cells


def _root_eigen_sum(gram: np.ndarray) -> float:
    eigenvalues = np.linalg.eigvalsh((gram + gram.T) / 2)
    return float(np.sqrt(np.clip(eigenvalues, 0.0, None)).sum())
