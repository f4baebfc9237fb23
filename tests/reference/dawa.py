"""DAWA end to end on a raw vector (Li thesis ch. 6), outside the product.

:func:`dawa` runs the thesis's three steps with a sampler passed in: private partition, GreedyH
measurement (:func:`measure_buckets` adds Laplace noise to ``A·B(x)`` without the choke point or the
ledger) and uniform expansion.  Also the noiseless least-cost partition of Problem 6.1 and the
bucket deviations it minimises.  The product (:mod:`mechanisms.dawa`) runs Step 1 through
``ProtectedCells.select`` and Step 2 through ``ProtectedCells.measure``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

import numpy as np
import scipy.sparse as sp

from dprelease.mechanisms.dawa.greedy_h import HierarchicalStrategy, _local_error, greedy_h_strategy
from dprelease.mechanisms.dawa.partition import (
    IntervalFamily,
    IntervalWorkload,
    Partition,
    PartitionSelector,
    ScaleRule,
    _as_cells,
    _check_all_intervals_size,
    _check_choice,
    _DeviationOracle,
    _least_cost_partition,
    split_budget,
)
from dprelease.mechanisms.primitives.linalg import read_only
from dprelease.mechanisms.primitives.noise import NoiseSampler
from dprelease.mechanisms.primitives.privacy import check_epsilon


def laplace_scale(strategy: HierarchicalStrategy, *, epsilon: float) -> float:
    """Laplace scale ``Δ₁(A)/ε₂`` that makes the measurement ε₂-DP (Theorem 6.3)."""
    return strategy.sensitivity(norm=1) / check_epsilon(epsilon)


def greedy_h_local_error(
    lam: np.ndarray | float,
    *,
    e: np.ndarray | float,
    a: np.ndarray | float,
    a_prime: np.ndarray | float,
    d: np.ndarray | float,
    mu: np.ndarray | float,
) -> np.ndarray:
    """Eq. (6.11): the bias-corrected local error (6.10) of node ``q`` for root fraction ``λ``.

    ``(e − (μa + (1−μ)a′)·λ² / ((1−λ)² + λ²d)) / (1−λ)²`` with ``e = Σ tr(Ĝ_{ii} M_i⁻¹)``,
    ``a = uᵀĜ_{qq}u``, ``a′ = Σ u_iᵀĜ_{ii}u_i``, ``d = 𝟏ᵀu`` over the children ``i`` of ``q``
    (``u = blkdiag(M_i⁻¹)𝟏``) and ``μ = t^{−l/2}``.  O(1) per λ; valid for ``0 ≤ λ < 1``.

    References: Li thesis §6.4.3, eqs. (6.10)–(6.11) (the printed ``t^{−1/2}`` is ``t^{−l/2}``)."""
    lam = np.asarray(lam, dtype=np.float64)
    mixed = mu * np.asarray(a) + (1.0 - np.asarray(mu)) * np.asarray(a_prime)
    return _local_error(lam, e=np.asarray(e), mixed=mixed, d=np.asarray(d))


def window_deviations(x: np.ndarray, *, length: int) -> np.ndarray:
    """``dev(x, [i, i+length))`` (eq. 6.2) for every offset ``i = 0 … n−length``.

    ``dev(x, b) = Σ_{j∈b} |x_j − mean_b(x)|``, the L1 distance of the bucket from its uniform
    expansion.  Not private: the input and the output are confidential.  O(n log n).
    """
    cells = _as_cells(x)
    if not 1 <= length <= cells.size:
        raise ValueError(f"length ({length}) must lie in [1, {cells.size}]")
    return next(_DeviationOracle(cells).windows([length]))


def bucket_deviations(x: np.ndarray, partition: Partition) -> np.ndarray:
    """``dev(x, b_i)`` of every bucket of ``partition`` (Example 6.2).  Confidential.  O(n)."""
    cells = _as_cells(x)
    partition._check_cells(cells.size, "x")
    means = partition.bucket_totals(cells) / partition.sizes
    return np.add.reduceat(np.abs(cells - np.repeat(means, partition.sizes)), partition.starts)


def partition_cost(x: np.ndarray, partition: Partition, *, measurement_epsilon: float) -> float:
    """``pcost(x, B) = Σ dev(x, b_i) + k/ε₂`` (Definition 6.2).  Confidential.  O(n)."""
    measurement_epsilon = check_epsilon(measurement_epsilon, name="measurement_epsilon")
    deviations = bucket_deviations(x, partition)
    return float(deviations.sum() + partition.n_buckets / measurement_epsilon)


def least_cost_partition(
    x: np.ndarray, *, measurement_epsilon: float, intervals: IntervalFamily = "all"
) -> Partition:
    """The exact solution of Problem 6.1 (no noise): the partition with least ``pcost``.

    Not differentially private; for analysis and tests (Table 6.1, Fig. 6.4 "Optimal").  Ties go to
    the shortest last bucket.  O(n log² n) for ``"dyadic"``, O(n² log n) for ``"all"``.

    Examples
    --------
    >>> x = np.array([2, 3, 8, 1, 0, 2, 0, 4, 2, 4])
    >>> best = least_cost_partition(x, measurement_epsilon=0.1)
    >>> best.n_buckets, round(partition_cost(x, best, measurement_epsilon=0.1), 6)
    (1, 27.2)
    """
    cells = _as_cells(x)
    measurement_epsilon = check_epsilon(measurement_epsilon, name="measurement_epsilon")
    _check_choice("intervals", intervals, get_args(IntervalFamily))
    _check_all_intervals_size(cells.size, intervals)
    return _least_cost_partition(
        cells,
        penalty=1.0 / measurement_epsilon,
        intervals=intervals,
        perturb=lambda costs, _length: costs,
    )


def private_partition(
    x: np.ndarray,
    *,
    epsilon: float,
    measurement_epsilon: float,
    sampler: NoiseSampler,
    intervals: IntervalFamily = "dyadic",
    scale_rule: ScaleRule = "per_interval",
    contribution_bound: int = 1,
    noise_offset: float = 0.0,
) -> Partition:
    """Step 1 of DAWA: ``PartitionSelector(...).select(x, sampler=sampler)``.  ε₁-DP.

    Privacy
    -------
    Spends ``epsilon`` (ε₁); see :class:`PartitionSelector`.

    References
    ----------
    Li thesis §6.3.2, Program 6.3.1.
    """
    selector = PartitionSelector(
        epsilon=epsilon,
        measurement_epsilon=measurement_epsilon,
        intervals=intervals,
        scale_rule=scale_rule,
        contribution_bound=contribution_bound,
        noise_offset=noise_offset,
    )
    return selector.select(x, sampler=sampler)


def measure_buckets(
    x: np.ndarray, strategy: HierarchicalStrategy, *, epsilon: float, sampler: NoiseSampler
) -> np.ndarray:
    """Step 2's private step: ``A·B(x) + Laplace(Δ(A)/ε₂)`` (public once ``epsilon`` is charged).

    Privacy
    -------
    ε₂-DP for ``epsilon`` = ε₂ under add/remove-one-record neighbours (Theorem 6.3).  For a
    contribution bound ``c``, measure through a session (it multiplies the sensitivity by ``c``).

    References
    ----------
    Li thesis Program 6.4.1 (last two lines).
    """
    scale = laplace_scale(strategy, epsilon=epsilon)
    answers = strategy.apply(x)
    return np.asarray(sampler.add_laplace(answers, scale=scale), dtype=np.float64)


def measure_and_reconstruct(
    x: np.ndarray, strategy: HierarchicalStrategy, *, epsilon: float, sampler: NoiseSampler
) -> np.ndarray:
    """Steps 2–3: measure (spends ``epsilon`` = ε₂), least squares, uniform expansion to cells."""
    return strategy.partition.expand(
        strategy.least_squares(measure_buckets(x, strategy, epsilon=epsilon, sampler=sampler))
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class DawaResult:
    """Public output of :func:`dawa`."""

    estimate: np.ndarray
    """``x̂``: the cell estimates (answer any query as ``W x̂``)."""
    bucket_estimates: np.ndarray
    """``ŝ``: the least-squares bucket counts."""
    noisy_answers: np.ndarray
    """The released noisy tree answers ``y``."""
    partition: Partition
    """Step 1's private partition."""
    strategy: HierarchicalStrategy
    """Step 2's weighted tree."""
    partition_epsilon: float
    """ε₁ spent by Step 1."""
    measurement_epsilon: float
    """ε₂ spent by Step 2."""
    measurement_scale: float
    """Laplace scale of Step 2."""

    def __post_init__(self) -> None:
        for name in ("estimate", "bucket_estimates", "noisy_answers"):
            object.__setattr__(self, name, read_only(getattr(self, name)))

    @property
    def epsilon(self) -> float:
        """Total ε spent (sequential composition of the two steps)."""
        return self.partition_epsilon + self.measurement_epsilon


def dawa(
    x: np.ndarray,
    workload: IntervalWorkload,
    *,
    epsilon: float,
    sampler: NoiseSampler,
    ratio: float = 0.25,
    intervals: IntervalFamily = "dyadic",
    scale_rule: ScaleRule = "per_interval",
    noise_offset: float = 0.0,
    branching: int = 2,
) -> DawaResult:
    """DAWA end to end: private partition, GreedyH measurement, least squares, uniform expansion.

    For use outside a session (benchmarks, tests); a session charges ε₁ before
    :class:`PartitionSelector` and ε₂ before :func:`measure_buckets` itself.

    Privacy
    -------
    ε-DP under add/remove-one-record neighbours: Step 1 is ε₁-DP (Theorem 6.1), Step 2 is ε₂-DP
    (Theorem 6.3) given the public partition and workload, Step 3 is post-processing; sequential
    composition gives ε₁ + ε₂ = ε.

    References
    ----------
    Li thesis §6.2 (Fig. 6.1), Programs 6.3.1 and 6.4.1.
    """
    partition_epsilon, measurement_epsilon = split_budget(epsilon, ratio=ratio)
    selector = PartitionSelector(
        epsilon=partition_epsilon,
        measurement_epsilon=measurement_epsilon,
        intervals=intervals,
        scale_rule=scale_rule,
        noise_offset=noise_offset,
    )
    partition = selector.select(x, sampler=sampler)
    strategy = greedy_h_strategy(workload, partition, branching=branching)
    noisy = measure_buckets(x, strategy, epsilon=measurement_epsilon, sampler=sampler)
    bucket_estimates = strategy.least_squares(noisy)
    return DawaResult(
        estimate=partition.expand(bucket_estimates),
        bucket_estimates=bucket_estimates,
        noisy_answers=noisy,
        partition=partition,
        strategy=strategy,
        partition_epsilon=partition_epsilon,
        measurement_epsilon=measurement_epsilon,
        measurement_scale=laplace_scale(strategy, epsilon=measurement_epsilon),
    )


def ranges_workload(
    lo: np.ndarray | Sequence[int], hi: np.ndarray | Sequence[int], *, n_cells: int
) -> IntervalWorkload:
    """Range queries ``Σ_{lo[i] ≤ j ≤ hi[i]} x_j`` (inclusive, 0-based cell indices)."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    if lo.ndim != 1 or lo.shape != hi.shape:
        raise ValueError(
            f"lo (shape {lo.shape}) and hi (shape {hi.shape}) must be 1-D of one length"
        )
    return IntervalWorkload(
        n_cells=n_cells,
        n_rows=max(int(lo.size), 1),
        row=np.arange(lo.size),
        lo=lo,
        hi=hi,
        weight=np.ones(lo.size),
    )


def matrix_workload(matrix: np.ndarray | sp.sparray | sp.spmatrix) -> IntervalWorkload:
    """Any ``m × n`` query matrix, one piece per run of equal consecutive non-zeros in a row."""
    coo = sp.coo_array(matrix)
    coo.sum_duplicates()
    keep = coo.data != 0
    row, col, value = coo.row[keep], coo.col[keep], coo.data[keep].astype(np.float64)
    order = np.lexsort((col, row))
    row, col, value = row[order], col[order], value[order]
    starts_run = np.ones(row.size, dtype=bool)
    starts_run[1:] = (row[1:] != row[:-1]) | (col[1:] != col[:-1] + 1) | (value[1:] != value[:-1])
    first = np.flatnonzero(starts_run)
    last = np.append(first[1:], row.size) - 1
    return IntervalWorkload(
        n_cells=int(coo.shape[1]),
        n_rows=int(coo.shape[0]),
        row=row[first],
        lo=col[first],
        hi=col[last],
        weight=value[first],
    )


def answer(workload: IntervalWorkload, x: np.ndarray) -> np.ndarray:
    """``W x`` for every query.  O(n + pieces)."""
    cells = _as_cells(x)
    if cells.size != workload.n_cells:
        raise ValueError(f"x has {cells.size} cells but the workload has {workload.n_cells}")
    prefix = np.concatenate(([0.0], np.cumsum(cells)))
    piece_sums = workload.weight * (prefix[workload.hi + 1] - prefix[workload.lo])
    return np.bincount(workload.row, weights=piece_sums, minlength=workload.n_rows)


def query_matrix(workload: IntervalWorkload) -> sp.csr_array:
    """The ``m × n`` query matrix (sparse).  O(Σ piece lengths)."""
    lengths = workload.hi - workload.lo + 1
    piece = np.repeat(np.arange(workload.row.size), lengths)
    col = workload.lo[piece] + (
        np.arange(piece.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    )
    return sp.csr_array(
        (workload.weight[piece], (workload.row[piece], col)),
        shape=(workload.n_rows, workload.n_cells),
    )


def query_cells(strategy: HierarchicalStrategy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lo, hi, weight)`` of every measured query over cells, ``lo``/``hi`` inclusive."""
    lo, hi, weight = strategy.query_buckets()
    bounds = strategy.partition.boundaries
    return bounds[lo], bounds[hi] - 1, weight


def expected_squared_error(strategy: HierarchicalStrategy, *, epsilon: float) -> float:
    """Expected ``‖Ŵŝ − Ŵ B(x)‖²`` summed over the workload: ``2·scale²·error_trace``.

    Perturbation error of Step 2 only (the uniformity bias of the buckets is data-dependent).
    """
    return 2.0 * laplace_scale(strategy, epsilon=epsilon) ** 2 * strategy.error_trace
