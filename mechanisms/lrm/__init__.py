"""``lrm``: the Low-Rank Mechanism (Yuan et al., VLDB 2012): ``W ≈ B·L``, measure ``L·x``.

ε-DP (Laplace) only.  Factors the explicit stacked workload matrix, so it is limited to small
workloads.

Answering rule (honest uncertainty).  The paper answers ``B·(L·x + η)``, which is biased by
``(B·L − W)·x`` whenever the relaxed decomposition stops before ``B·L = W`` (γ, the time limit or
the iteration cap).  That bias cannot be bounded from public values: ``|(W − BL)_i·x|`` is only
bounded by the row's L1 norm times the largest cell count (or its L2 norm times ``‖x‖₂``), both
confidential, so a ``noise+bias`` figure would have to read the data.  The release therefore
keeps LRM's optimised ``L`` as the *strategy* and answers ``W·x̂`` with ``x̂ = (AᵀA)⁺Aᵀy`` the
least-squares estimate from the noisy measurements (option (a) of the issue), where ``A`` is ``L``
plus the few rows that put ``W`` in its row space (:func:`supported_measurement`; none when ``L``
already supports ``W``).  Then ``E[W·x̂] = W·x`` exactly, the per-row variance ``σ²·(W(AᵀA)⁺Wᵀ)_ii``
is the whole error, rows are labelled ``uncertainty: noise``, and the plan's predicted error
(``evaluate``) is the sum of the same variances.  ``B`` is only used by the decomposition; for a
fixed ``A``, least squares has the smallest variance of all unbiased linear answers, so this is
never worse than ``B·y`` with an exact ``B``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dprelease.mechanisms.lrm.decomposition import (
    SupportedMeasurement,
    decompose,
    predict_seconds,
    supported_measurement,
)
from dprelease.mechanisms.primitives.dense import DenseStrategy
from dprelease.mechanisms.primitives.linalg import l1_sensitivity
from dprelease.mechanisms.primitives.operators import kron_dense
from dprelease.mechanisms.primitives.protocol import (
    CandidateUnavailable,
    Evaluation,
    MatrixMechanism,
    PlanRequest,
    StoredStrategy,
    Strategy,
    StrategyCache,
    cache_key,
    require_available,
)
from dprelease.mechanisms.primitives.threads import single_threaded_blas
from dprelease.mechanisms.primitives.workload import (
    Workload,
    WorkloadItem,
    cell_vector_reason,
    magnitude,
)

MAX_CELLS = 4096
MAX_QUERIES = 4096
AUTO_MAX = 1024  # auto considers LRM only on small workloads (a decomposition costs seconds)
# Largest entry of the released estimator's bias matrix ``W − W·A⁺·A`` (relative to
# ``max(1, max|W|)``) accepted for an unbiased answer; the appended rows leave round-off (~1e-15).
UNBIASED_TOLERANCE = 1e-8


class LowRankMechanism(MatrixMechanism):
    name = "lrm"
    summary = "Low-Rank Mechanism: W ≈ B·L, measure L·x with Laplace noise (Yuan et al. 2012)"

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        workload = request.workload
        if request.noise != "laplace":
            return "the Low-Rank Mechanism is an epsilon-DP (Laplace) mechanism: give privacy as {epsilon}"
        if workload.num_cells > MAX_CELLS or workload.num_queries > MAX_QUERIES:
            return (
                f"LRM factors the explicit workload matrix: at most {MAX_QUERIES} queries over "
                f"{MAX_CELLS} cells (this one is {magnitude(workload.num_queries)} × "
                f"{magnitude(workload.num_cells)})"
            )
        if not request.requested and max(workload.num_cells, workload.num_queries) > AUTO_MAX:
            return f"skipped by auto above {AUTO_MAX} cells or queries (ask for it with mechanism: {self.name})"
        return None

    def predicted_seconds(self, request: PlanRequest) -> float:
        if cell_vector_reason(request.workload) is not None:  # refused; m·N² overflows float64
            return math.inf
        return predict_seconds(request.workload.num_queries, request.workload.num_cells)

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> LowRankStrategy:
        require_available(self, request)
        workload = request.workload
        # "least-squares": strategies stored before the unbiased answering rule hold B, not A.
        key = cache_key("lrm", "least-squares", request.workload_fingerprint)
        stored = cache.load(key)
        if stored is None:
            # O(m N); refused past its size limit. Rows × √weight: the decomposition and the
            # choice of measurement minimise the weighted total; W's row space is unchanged
            matrix = workload.dense_matrix(weighted=True)
            with single_threaded_blas():
                decomposition = decompose(
                    matrix,
                    rng=np.random.default_rng(request.seed),
                    time_limit=request.time_limit,
                    progress=request.progress,
                )
                supported = _least_variance_measurement(matrix, decomposition.L)
            stored = StoredStrategy(
                parameters={
                    "template": "lrm",
                    "rank": decomposition.rank,
                    "iterations": decomposition.iterations,
                    "converged": decomposition.converged,
                    "bias_sq": decomposition.bias_sq,  # of the paper's B·L, not of the release
                    "stopped_early": decomposition.stopped_early,
                    "appended_rows": supported.appended,
                    "appended_scale": supported.scale,
                    "answer": "least squares from [L; appended rows]",
                    "seed": request.seed,
                },
                arrays={"A": supported.matrix},
            )
            cache.save(key, stored)
        strategy = LowRankStrategy(
            name=self.name, matrix=stored.arrays["A"], parameters=stored.parameters
        )
        residual = strategy.support_residual(workload)  # O(m N p), kept for the planner's check
        if residual > UNBIASED_TOLERANCE:
            raise CandidateUnavailable(
                f"the LRM strategy leaves a support residual of {residual:.2e} (limit "
                f"{UNBIASED_TOLERANCE:g}): its least-squares answers would be biased"
            )
        return strategy

    def evaluate(self, strategy: Strategy, request: PlanRequest) -> Evaluation:
        evaluation = super().evaluate(strategy, request)
        parameters = strategy.parameters
        note = (
            f"rank {parameters.get('rank')}, {parameters.get('appended_rows')} rows appended for "
            "support; least-squares answers, unbiased (rmse is the whole error)"
        )
        return dataclasses.replace(evaluation, note=note)


@dataclass(frozen=True, kw_only=True)
class LowRankStrategy(DenseStrategy):
    """LRM's measured matrix ``A = [L; c·D]``, answered by least squares (see the module text).

    ``x̂ = A⁺·y`` with ``A⁺ = V·S⁻¹·Uᵀ`` from the thin SVD of ``A`` itself, never through the Gram:
    LRM's ``L`` keeps a few near-dead rows (singular values ~1e-4 of the largest), and both
    ``pinvh(AᵀA)`` and ``(AᵀA)⁺·Aᵀ`` square their condition number, which leaves a relative bias
    ~1e-7 in the answers; the SVD route leaves round-off (~1e-15).
    """

    def pseudo_inverse(self) -> np.ndarray:
        """``A⁺`` (N × p), computed once."""
        return self._pseudo_inverse

    @cached_property
    def _pseudo_inverse(self) -> np.ndarray:
        left, singular, right = np.linalg.svd(self.matrix, full_matrices=False)  # O(p N min(p, N))
        keep = singular > singular[0] * max(self.matrix.shape) * np.finfo(np.float64).eps
        return (right[keep].T / singular[keep]) @ left[:, keep].T

    @cached_property
    def _unit_covariance(self) -> np.ndarray:
        """``(AᵀA)⁺ = A⁺·A⁺ᵀ`` (unit noise), once. O(N² p)."""
        pinv = self.pseudo_inverse()
        return pinv @ pinv.T

    def least_squares(self, y: np.ndarray, workload: Workload | None = None) -> np.ndarray:
        return self.pseudo_inverse() @ np.asarray(y, dtype=np.float64)  # O(N p)

    def item_unit_variances(
        self, item: WorkloadItem, workload: Workload | None = None
    ) -> np.ndarray:
        """Squared row norms of ``W_item·A⁺``: never negative.  ``diag(W (AᵀA)⁺ Wᵀ)`` through the
        covariance cancels catastrophically when ``A`` has near-dead directions (σ_min ~ 1e-11
        gave variances of −10⁶).  O(m N p) with the item's explicit m × N matrix (LRM sizes)."""
        rows = kron_dense(item.factors) @ self.pseudo_inverse()
        return np.einsum("ij,ij->i", rows, rows)

    def item_unit_total(self, item: WorkloadItem, workload: Workload | None = None) -> float:
        return float(self.item_unit_variances(item).sum())

    def support_residual(self, workload: Workload) -> float:
        """The planner's support check, entry-wise from ``A⁺`` (see :meth:`estimator_bias`).

        Kept per workload object: ``plan``'s bias guard and the planner's support check ask for
        the same workload, and each evaluation is O(m N) to form W plus O(m N p)."""
        seen = self._support_memo.get(id(workload))
        if seen is None or seen[0] is not workload:
            seen = (workload, self.estimator_bias(workload.dense_matrix()))
            self._support_memo[id(workload)] = seen  # holds the workload, so its id stays unique
        return seen[1]

    @cached_property
    def _support_memo(self) -> dict[int, tuple[Workload, float]]:
        return {}

    def estimator_bias(self, workload: np.ndarray) -> float:
        """Largest entry of ``W − W·A⁺·A``, the bias matrix of the answers this strategy gives,
        relative to ``max(1, max|W|)``.  Entry-wise rather than Gram-based (a Gram-based norm
        cannot resolve below √eps).  O(m N p)."""
        bias = workload - (workload @ self.pseudo_inverse()) @ self.matrix
        return float(np.abs(bias).max()) / max(1.0, float(np.abs(workload).max()))


# Rows of L whose L1 norm is below this fraction of the largest are near-dead components (the
# optimiser's jitter/re-seeding); in the least-squares answer their tiny singular values multiply
# the variance (Example 2: 38.2 with them pruned, up to 1421 kept, depending on the seed).
DEAD_ROW_FRACTION = 1e-3


def _unit_total(workload: np.ndarray, strategy: np.ndarray) -> float:
    """``Δ(A)²·‖W·A⁺‖²_F``: the least-squares answers' total variance per unit noise. O(m N p)."""
    return l1_sensitivity(strategy) ** 2 * float(np.sum((workload @ np.linalg.pinv(strategy)) ** 2))


def _least_variance_measurement(workload: np.ndarray, factor: np.ndarray) -> SupportedMeasurement:
    """Of ``L`` as found, ``L`` without near-dead rows and the identity (a safe start), the
    supported measurement with the least total variance, so LRM is never worse than measuring the
    cells.  Public values only (W and the optimiser's output).  O(m N p) per candidate."""
    norms = np.abs(factor).sum(axis=1)
    pruned = factor[norms > DEAD_ROW_FRACTION * norms.max()]
    candidates = [supported_measurement(workload, factor)]
    if 0 < pruned.shape[0] < factor.shape[0]:
        candidates.append(supported_measurement(workload, pruned))
    candidates.append(supported_measurement(workload, np.eye(workload.shape[1])))
    return min(candidates, key=lambda c: _unit_total(workload, c.matrix))


MECHANISM = LowRankMechanism()
