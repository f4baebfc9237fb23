"""DAWA end to end on a raw vector (Li thesis ch. 6), outside the product.

:func:`dawa` runs the thesis's three steps with a sampler passed in: private partition, GreedyH
measurement (:func:`measure_buckets` adds Laplace noise to ``A·B(x)`` without the choke point or the
ledger) and uniform expansion.  Also the noiseless least-cost partition of Problem 6.1 and the
bucket deviations it minimises.  The product (:mod:`mechanisms.dawa`) runs Step 1 through
``ProtectedCells.select`` and Step 2 through ``ProtectedCells.measure``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import numpy as np

from mechanisms.checks import check_epsilon
from mechanisms.dawa.greedy_h import HierarchicalStrategy, greedy_h_strategy
from mechanisms.dawa.partition import (
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
    _readonly,
    split_budget,
)
from mechanisms.noise import NoiseSampler


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
    scale = strategy.laplace_scale(epsilon=epsilon)
    answers = strategy.apply(x)
    return np.asarray(sampler.add_laplace(answers, scale=scale), dtype=np.float64)


def measure_and_reconstruct(
    x: np.ndarray, strategy: HierarchicalStrategy, *, epsilon: float, sampler: NoiseSampler
) -> np.ndarray:
    """Steps 2–3: measure (spends ``epsilon`` = ε₂), least squares, uniform expansion to cells."""
    return strategy.reconstruct(measure_buckets(x, strategy, epsilon=epsilon, sampler=sampler))


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
            object.__setattr__(self, name, _readonly(getattr(self, name)))

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
        measurement_scale=strategy.laplace_scale(epsilon=measurement_epsilon),
    )
