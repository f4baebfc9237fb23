"""Data-independent measurement strategies: per-attribute factors and their Kronecker products.

A strategy ``A`` is measured as ``A·x + noise`` and the workload is answered from the least-squares
cell estimate ``x̂ = (AᵀA)⁺Aᵀŷ`` (matrix mechanism, Li thesis §3.1).  For a
product domain the pipeline uses ``A = A_1 ⊗ … ⊗ A_d``, one factor per attribute, so sensitivity,
Gram, pseudo-inverse and error all factor: ``Δ(A) = Π Δ(A_i)`` (column norms of a Kronecker
product multiply) and ``(AᵀA)⁺ = ⊗ (A_iᵀA_i)⁺``.

Per-attribute families: ``identity``, ``total`` (one query, for attributes every workload item sums
out), ``hierarchical`` (b-ary tree over any n, Hay et al.) and ``wavelet`` (unnormalised Haar,
Privelet; n that is not a power of two is padded with empty cells whose columns are dropped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from dprelease.mechanisms.primitives.intervals import kron_single_term_rows
from dprelease.mechanisms.primitives.noise import SENSITIVITY_NORM, NoiseKind
from dprelease.mechanisms.primitives.operators import (
    Factor,
    MatrixFactor,
    kron_apply,
    kron_apply_transpose,
)
from dprelease.mechanisms.primitives.protocol import (
    LeastSquaresAnswers,
    MatrixMechanism,
    PlanRequest,
    StrategyCache,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem, cell_vector_reason


def identity_strategy(n: int) -> MatrixFactor:
    """``I_n``: one query per cell. L1 = L2 sensitivity = 1."""
    return MatrixFactor(sp.identity(n, format="csr"))


def total_strategy(n: int) -> MatrixFactor:
    """The single total query (supports only workloads that sum the attribute out)."""
    return MatrixFactor(sp.csr_array(np.ones((1, n))))


def hierarchical_strategy(n: int, *, branching: int = 2) -> MatrixFactor:
    """A ``branching``-ary tree of interval counts over ``n`` cells (any n, not only b^k).

    Each node's interval is split into ``branching`` near-equal children (``numpy.array_split``)
    down to single cells; rows are nodes in level order.  For n = b^k this is H_n of the thesis:
    L1 sensitivity 1 + log_b n, L2 sensitivity √(1 + log_b n).  O(n log_b n) non-zeros.
    """
    if n < 1:
        raise ValueError(f"n ({n}) must be >= 1")
    if branching < 2:
        raise ValueError(f"branching ({branching}) must be >= 2")
    rows: list[tuple[int, int]] = []
    level = [(0, n)]
    while level:
        rows.extend(level)
        children: list[tuple[int, int]] = []
        for start, stop in level:
            if stop - start > 1:
                for part in np.array_split(np.arange(start, stop), min(branching, stop - start)):
                    children.append((int(part[0]), int(part[-1]) + 1))
        level = children
    lengths = np.array([stop - start for start, stop in rows])
    row_index = np.repeat(np.arange(len(rows)), lengths)
    col_index = np.concatenate([np.arange(start, stop) for start, stop in rows])
    matrix = sp.csr_array((np.ones(col_index.size), (row_index, col_index)), shape=(len(rows), n))
    return MatrixFactor(matrix)


def wavelet_strategy(n: int) -> MatrixFactor:
    """Unnormalised Haar wavelet ``Y`` (Privelet, Xiao et al.): total row plus left-minus-right rows.

    Built by ``Y_1 = [1]``, ``Y_2k = [Y_k ⊗ [1 1]; I_k ⊗ [1 −1]]`` on the next power of two ≥ n; the
    columns of the padding cells are dropped (full column rank is kept because Y is invertible) and
    rows left empty are removed.  L1 sensitivity 1 + log₂ n for n = 2^k.
    """
    if n < 1:
        raise ValueError(f"n ({n}) must be >= 1")
    size = 1
    matrix = sp.csr_array(np.ones((1, 1)))
    while size < n:
        matrix = sp.vstack(
            [
                sp.kron(matrix, sp.csr_array([[1.0, 1.0]])),
                sp.kron(sp.identity(size), sp.csr_array([[1.0, -1.0]])),
            ],
            format="csr",
        )
        size *= 2
    matrix = sp.csr_array(matrix[:, :n])
    keep = np.flatnonzero(np.diff(matrix.indptr) > 0)
    return MatrixFactor(matrix[keep])


@dataclass(frozen=True, kw_only=True)
class KronStrategy(LeastSquaresAnswers):
    """``A = A_1 ⊗ … ⊗ A_d`` with cached per-factor ``(A_iᵀA_i)⁺``.

    Public: built from the workload and domain only.
    """

    name: str
    factors: tuple[Factor, ...]
    parameters: dict[str, object] = field(default_factory=dict)

    @property
    def domain_shape(self) -> tuple[int, ...]:
        return tuple(f.n for f in self.factors)

    @property
    def num_queries(self) -> int:
        return math.prod(f.m for f in self.factors)

    def sensitivity(self, *, noise: NoiseKind) -> float:
        """Δ(⊗A_i) = Π Δ(A_i) for both L1 and L2 (column norms of a Kronecker product multiply)."""
        norm = SENSITIVITY_NORM[noise]
        return float(np.prod([f.sensitivity(norm=norm) for f in self.factors]))

    @cached_property
    def _gram_inverses(self) -> tuple[tuple[np.ndarray, bool], ...]:
        """Per factor ``((A_iᵀA_i)⁺, full rank?)`` (:meth:`Factor.gram_inverse`): O(Σ n_i³) for
        dense factors, once."""
        return tuple(factor.gram_inverse() for factor in self.factors)

    def gram_pinvs(self) -> list[np.ndarray]:
        """Per-factor ``(A_iᵀA_i)⁺``."""
        return [pinv for pinv, _ in self._gram_inverses]

    def apply(self, x: np.ndarray) -> np.ndarray:
        """A·x. O(N Σ nnz(A_i)/n_i)."""
        return kron_apply(self.factors, x)

    def least_squares(self, y: np.ndarray, workload: Workload | None = None) -> np.ndarray:
        """x̂ = (AᵀA)⁺Aᵀy = ⊗((A_iᵀA_i)⁺A_iᵀ) y, never forming a dense pseudo-inverse of A."""
        back = kron_apply_transpose(self.factors, y)
        return kron_apply([MatrixFactor(m) for m in self.gram_pinvs()], back)

    def item_unit_variances(
        self, item: WorkloadItem, workload: Workload | None = None
    ) -> np.ndarray:
        """``diag(W (AᵀA)⁺ Wᵀ)`` for one item: outer product of per-attribute terms.

        O(Σ n_i³ + m_item).
        """
        result = np.ones(1)
        for factor, pinv in zip(item.factors, self.gram_pinvs(), strict=True):
            result = np.multiply.outer(result, factor.query_variances(pinv)).ravel()
        return result

    def item_unit_total(self, item: WorkloadItem, workload: Workload | None = None) -> float:
        """``tr(WᵀW (AᵀA)⁺) = Π_i tr(W_iᵀW_i M_i)``. O(Σ n_i²) after the Grams."""
        total = 1.0
        for factor, pinv in zip(item.factors, self.gram_pinvs(), strict=True):
            total *= float(np.sum(factor.gram() * pinv))
        return total

    def single_answer_rows(self, item: WorkloadItem) -> np.ndarray:
        """Per query of ``item``: its least-squares answer uses one measured answer only (so its
        error is one noise draw).  O(Σ m_i n_i p_i)."""
        return kron_single_term_rows(item.factors, self.factors, self.gram_pinvs())

    def support_residual(self, workload: Workload) -> float:
        """Largest ‖W_iᵀW_i (I − M_i A_iᵀA_i)‖ (relative) over items and attributes; ≈ 0 iff A
        supports W.  An unsupported item would be answered with bias (Li thesis §3.1, Prop 3.1)."""
        worst = 0.0
        for item in workload.items:
            for factor, a_factor, (pinv, full_rank) in zip(
                item.factors, self.factors, self._gram_inverses, strict=True
            ):
                if full_rank:  # M AᵀA = I (Cholesky succeeded far from singular): residual 0
                    continue
                gram_w = factor.gram()  # O(n³) below
                residual = gram_w - gram_w @ (pinv @ a_factor.gram())
                scale = max(1.0, float(np.abs(gram_w).max()))
                worst = max(worst, float(np.abs(residual).max()) / scale)
        return worst


FAMILIES = ("identity", "hierarchical", "wavelet")


def build_kron_strategy(
    family: str,
    *,
    attribute_roles: Sequence[tuple[int, str]],
    branching: int = 2,
) -> KronStrategy:
    """A product strategy for a workload, one factor per attribute.

    ``attribute_roles`` gives, per attribute, its number of cells and its role in the workload:
    ``"total"`` (every item sums it out: a single total query suffices), ``"categorical"``
    (identity: no order to exploit) or ``"ordered"`` (the family's factor).
    """
    if family not in FAMILIES:
        raise ValueError(f"strategy family ({family!r}) must be one of {FAMILIES}")
    factors = tuple(
        family_factor(family, role, n, branching=branching) for n, role in attribute_roles
    )
    parameters: dict[str, object] = {"branching": branching} if family == "hierarchical" else {}
    return KronStrategy(name=family, factors=factors, parameters=parameters)


def family_factor(family: str, role: str, n: int, *, branching: int = 2) -> MatrixFactor:
    """The factor of ``family`` for an attribute of ``n`` cells and ``role`` (see
    :func:`build_kron_strategy`)."""
    if role == "total":
        return total_strategy(n)
    if role == "categorical" or family == "identity":
        return identity_strategy(n)
    if family == "hierarchical":
        return hierarchical_strategy(n, branching=branching)
    return wavelet_strategy(n)


class KronFamily(MatrixMechanism):
    """A data-independent mechanism measuring one product strategy built by ``family``.

    Attributes every item sums out get a single total query; categorical attributes get identity;
    ordered ones get the family's factor.  Planning is O(Σ n_i³) (per-factor pseudo-inverses).
    """

    family: ClassVar[str]

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        # its evaluation walks every item's factors: refused from sizes past int64 cell indices
        return cell_vector_reason(request.workload)

    def branching(self, request: PlanRequest) -> int:
        return 2

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> KronStrategy:
        return build_kron_strategy(
            self.family,
            attribute_roles=request.workload.attribute_roles(request.ordered),
            branching=self.branching(request),
        )
