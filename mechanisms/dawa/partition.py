"""DAWA's Step 1 (Li thesis ch. 6): buckets, interval workloads and the private least-cost partition.

Step 1 (spends ε₁ = ratio·ε, :class:`PartitionSelector`): every candidate interval ``b`` gets the
cost ``dev(x, b) + 1/ε₂`` plus its own Laplace draw; a dynamic program returns the partition with
the least total *noisy* cost, and only the partition is released.  Step 2 (ε₂,
:mod:`mechanisms.dawa.greedy_h`) measures the buckets; Step 3 is uniform expansion
(:meth:`Partition.expand`, error in :mod:`mechanisms.dawa.uncertainty`).  Each step's cost is
charged before its noise is drawn (:meth:`PartitionSelector.noise_scales`,
:meth:`HierarchicalStrategy.sensitivity`).

Neighbouring relation (thesis L423): add or remove one record, i.e. one cell of ``x`` changes by
one.  A privacy unit that contributes up to ``c`` records is covered by ``contribution_bound=c``
(Step 1, group privacy) and by multiplying Step 2's sensitivity by ``c`` (the session does this).

Step-1 choices where the thesis leaves a point open:

- Noise follows the thesis's Remark (see :class:`PartitionSelector`).  The reference code's
  halved, singleton-free, floored noise is *not* offered: the thesis's proof does not cover it.
- Candidate intervals are every interval (``"all"``) or every interval whose length is a power of
  two, at every offset (``"dyadic"``, the thesis's default).
- ``noise_offset`` κ (default 0, the thesis) centres each candidate's Laplace noise at κ·scale, a
  public constant (privacy unchanged): with κ = 0 the search favours many buckets whose noise
  happens to be negative; κ ≈ 3 recovers the thesis's sparse-data accuracy.

References: C. Li, *Optimizing Linear Queries Under Differential Privacy*, PhD thesis, UMass Amherst,
2013, ch. 6; C. Li, M. Hay, G. Miklau, Y. Wang, PVLDB 7(5), 2014."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from dprelease.mechanisms.primitives.linalg import read_only
from dprelease.mechanisms.primitives.noise import NoiseSampler
from dprelease.mechanisms.primitives.privacy import check_epsilon

IntervalFamily = Literal["dyadic", "all"]
"""Step-1 candidate intervals: power-of-two lengths at every offset, or every interval."""

ScaleRule = Literal["per_interval", "uniform"]
"""Step-1 Laplace scale: the thesis's Remark ``(Δ̄ + Δ_b)/ε₁`` or Program 6.3.1's ``2Δ̄/ε₁``."""

# "all" stores one noisy cost per interval: n(n+1)/2 floats, 268 MB at n = 8192.
ALL_INTERVALS_MAX_CELLS = 8192
# Windows up to this length get their deviation by direct summation (cheaper than the wavelet
# matrix's log2(#distinct values) passes).
_DIRECT_DEVIATION_MAX_LENGTH = 16
# Interval queries answered per wavelet-matrix build (bounds the working memory to ~100 MB).
_DEVIATION_QUERY_CHUNK = 1 << 21
# End positions per block of the dyadic dynamic program (lengths >= block are vectorised).
_DP_BLOCK = 64


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} ({value!r}) must be one of {allowed}")


def _as_cells(x: np.ndarray, *, name: str = "x") -> np.ndarray:
    cells = np.asarray(x, dtype=np.float64)
    if cells.ndim != 1 or cells.size == 0:
        raise ValueError(f"{name} (shape {cells.shape}) must be a non-empty 1-D array")
    if not np.all(np.isfinite(cells)):
        raise ValueError(f"{name} must contain only finite values")
    return cells


def _one_per(
    values: np.ndarray | Sequence[float], count: int, *, name: str, per: str
) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (count,):
        raise ValueError(f"{name} (shape {array.shape}) must have one entry per {per} ({count})")
    return array


@dataclass(frozen=True, kw_only=True, eq=False)
class Partition:
    """Contiguous buckets ``[boundaries[i], boundaries[i+1])`` covering cells ``0 … n−1``.

    The public output of Step 1: bucket boundaries only, no counts.

    Examples
    --------
    >>> p = Partition.from_starts([0, 2, 3, 7], n_cells=10)
    >>> p.n_buckets, p.sizes.tolist()
    (4, [2, 1, 4, 3])
    >>> p.expand([6.3, 7.1, 3.6, 8.4]).round(2).tolist()
    [3.15, 3.15, 7.1, 0.9, 0.9, 0.9, 0.9, 2.8, 2.8, 2.8]
    """

    boundaries: np.ndarray
    """Bucket starts followed by ``n``: strictly increasing integers, first entry 0 (read-only)."""

    def __post_init__(self) -> None:
        bounds = np.asarray(self.boundaries)
        if bounds.ndim != 1 or bounds.size < 2:
            raise ValueError(
                f"boundaries (shape {bounds.shape}) must be 1-D with at least 2 entries"
            )
        if not np.issubdtype(bounds.dtype, np.integer):
            raise ValueError(f"boundaries (dtype {bounds.dtype}) must be integers")
        if bounds[0] != 0:
            raise ValueError(f"boundaries[0] ({bounds[0]}) must be 0")
        if np.any(np.diff(bounds) <= 0):
            raise ValueError("boundaries must be strictly increasing (no empty buckets)")
        object.__setattr__(self, "boundaries", read_only(bounds.astype(np.int64)))

    @classmethod
    def from_starts(cls, starts: Sequence[int] | np.ndarray, *, n_cells: int) -> Partition:
        """The partition whose buckets start at ``starts`` (0-based, increasing, first 0)."""
        return cls(boundaries=np.append(np.asarray(starts, dtype=np.int64), n_cells))

    @classmethod
    def singletons(cls, n_cells: int) -> Partition:
        """One bucket per cell (DAWA's Step 2 alone is then a data-independent mechanism)."""
        if n_cells < 1:
            raise ValueError(f"n_cells ({n_cells}) must be >= 1")
        return cls(boundaries=np.arange(n_cells + 1))

    @property
    def n_cells(self) -> int:
        return int(self.boundaries[-1])

    @property
    def n_buckets(self) -> int:
        return int(self.boundaries.size - 1)

    @property
    def starts(self) -> np.ndarray:
        return self.boundaries[:-1]

    @property
    def sizes(self) -> np.ndarray:
        """``|b_i|``, the number of cells in each bucket."""
        return np.diff(self.boundaries)

    def bucket_of_cell(self) -> np.ndarray:
        """``t(j)`` of Definition 6.1: the bucket index of every cell."""
        return np.repeat(np.arange(self.n_buckets), self.sizes)

    def bucket_totals(self, x: np.ndarray) -> np.ndarray:
        """``B(x)``: the count of each bucket.  ``x`` is confidential, so is the result."""
        cells = _as_cells(x)
        self._check_cells(cells.size, "x")
        return np.add.reduceat(cells, self.starts)

    def expand(self, bucket_values: np.ndarray | Sequence[float]) -> np.ndarray:
        """Uniform expansion (Definition 6.1): cell ``j`` gets ``s_{t(j)} / |b_{t(j)}|``."""
        values = _one_per(bucket_values, self.n_buckets, name="bucket_values", per="bucket")
        return np.repeat(values / self.sizes, self.sizes)

    def _check_cells(self, n_cells: int, name: str) -> None:
        if n_cells != self.n_cells:
            raise ValueError(f"{name} has {n_cells} cells but the partition covers {self.n_cells}")


@dataclass(frozen=True, kw_only=True, eq=False)
class IntervalWorkload:
    """Linear queries whose rows are weighted sums of cell intervals ("pieces").

    Row ``r`` is ``Σ_{p: row[p] = r} weight[p] · 1[lo[p] ≤ j ≤ hi[p]]``; pieces of one row must not
    overlap.  A 1-D range query is one piece of weight 1; a rectangle over a Hilbert-ordered grid is
    one piece per run of consecutive positions.  Public.
    """

    n_cells: int
    n_rows: int
    """Number of queries ``m``."""
    row: np.ndarray
    """Query index of each piece."""
    lo: np.ndarray
    """First cell of each piece (inclusive)."""
    hi: np.ndarray
    """Last cell of each piece (inclusive)."""
    weight: np.ndarray
    """Coefficient of the piece's cells in its query."""

    def __post_init__(self) -> None:
        if self.n_cells < 1:
            raise ValueError(f"n_cells ({self.n_cells}) must be >= 1")
        if self.n_rows < 1:
            raise ValueError(f"n_rows ({self.n_rows}) must be >= 1")
        arrays = {name: np.asarray(getattr(self, name)) for name in ("row", "lo", "hi", "weight")}
        sizes = {arr.shape for arr in arrays.values()}
        if len(sizes) != 1 or arrays["row"].ndim != 1:
            raise ValueError(f"row, lo, hi and weight must be 1-D of one length (got {sizes})")
        for name in ("row", "lo", "hi"):
            if arrays[name].size and not np.issubdtype(arrays[name].dtype, np.integer):
                raise ValueError(f"{name} (dtype {arrays[name].dtype}) must be integers")
        row, lo, hi = (arrays[name].astype(np.int64) for name in ("row", "lo", "hi"))
        weight = arrays["weight"].astype(np.float64)
        if np.any((row < 0) | (row >= self.n_rows)):
            raise ValueError(f"row entries must lie in [0, n_rows) = [0, {self.n_rows})")
        if np.any((lo < 0) | (hi >= self.n_cells)):
            raise ValueError(f"lo and hi must lie in [0, n_cells) = [0, {self.n_cells})")
        if np.any(lo > hi):
            raise ValueError("every piece needs lo <= hi")
        if not np.all(np.isfinite(weight)):
            raise ValueError("weight must contain only finite values")
        order = np.lexsort((lo, row))
        same_row = row[order][1:] == row[order][:-1]
        if np.any(same_row & (lo[order][1:] <= hi[order][:-1])):
            raise ValueError("pieces of one row must not overlap")
        for name, value in (("row", row), ("lo", lo), ("hi", hi), ("weight", weight)):
            object.__setattr__(self, name, read_only(value))


def _count_and_sum_at_least(
    ranks: np.ndarray,
    value_of_rank: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    threshold: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """For each query: count and sum of ``value_of_rank[ranks[j]]`` over ``lo ≤ j < hi`` with
    ``ranks[j] ≥ threshold``.

    A wavelet matrix over the ranks, built level by level while all queries descend it together.
    O((n + Q) · log2(#ranks)) time, O(n + Q) memory."""
    n = ranks.size
    n_levels = max(1, int(value_of_rank.size - 1).bit_length())
    values = value_of_rank[ranks]
    count = np.zeros(lo.size, dtype=np.int64)
    total = np.zeros(lo.size)
    lo = lo.astype(np.int64, copy=True)
    hi = hi.astype(np.int64, copy=True)
    zeros_before = np.zeros(n + 1, dtype=np.int64)
    ones_sum_before = np.zeros(n + 1)
    for level in range(n_levels - 1, -1, -1):
        bit = ((ranks >> level) & 1).astype(bool)
        np.cumsum(~bit, out=zeros_before[1:])
        np.cumsum(np.where(bit, values, 0.0), out=ones_sum_before[1:])
        lo_zeros, hi_zeros = zeros_before[lo], zeros_before[hi]
        follow_ones = ((threshold >> level) & 1).astype(bool)
        # Threshold bit 0: every element with bit 1 (same higher bits) lies above the threshold.
        above = ~follow_ones
        count += np.where(above, (hi - lo) - (hi_zeros - lo_zeros), 0)
        total += np.where(above, ones_sum_before[hi] - ones_sum_before[lo], 0.0)
        n_zeros = zeros_before[-1]
        lo = np.where(follow_ones, n_zeros + lo - lo_zeros, lo_zeros)
        hi = np.where(follow_ones, n_zeros + hi - hi_zeros, hi_zeros)
        if level:
            order = np.concatenate((np.flatnonzero(~bit), np.flatnonzero(bit)))
            ranks, values = ranks[order], values[order]
    # What remains in [lo, hi) has rank == threshold exactly.
    return count + (hi - lo), total + (hi - lo) * value_of_rank[threshold]


class _DeviationOracle:
    """``dev(x, b)`` (eq. 6.2) for many intervals ``b`` via ``dev = 2 Σ_{x_j ≥ mean} (x_j − mean)``.

    Thesis §6.3.2.3 uses a balanced BST slid along x; here a wavelet matrix over the ranks of the
    distinct values answers a batch of intervals at once (same O(log n) per interval).
    """

    def __init__(self, x: np.ndarray) -> None:
        self._x = x
        self._prefix = np.concatenate(([0.0], np.cumsum(x)))
        self._distinct, inverse = np.unique(x, return_inverse=True)
        self._ranks = inverse.astype(np.int64).ravel()

    def windows(self, lengths: Sequence[int]) -> Iterator[np.ndarray]:
        """Yield, for each length ``L`` in order, dev of every window ``[i, i+L)``, ``i = 0 … n−L``."""
        n = self._x.size
        batch: list[int] = []
        for length in lengths:
            if length <= _DIRECT_DEVIATION_MAX_LENGTH:
                yield from self._wavelet_batch(batch)
                batch = []
                yield self._direct(length)
                continue
            batch.append(length)
            if sum(n - b + 1 for b in batch) >= _DEVIATION_QUERY_CHUNK:
                yield from self._wavelet_batch(batch)
                batch = []
        yield from self._wavelet_batch(batch)

    def _means(self, starts: np.ndarray, length: int | np.ndarray) -> np.ndarray:
        return (self._prefix[starts + length] - self._prefix[starts]) / length

    def _direct(self, length: int) -> np.ndarray:
        # O(n · length)
        n_windows = self._x.size - length + 1
        mean = self._means(np.arange(n_windows), length)
        deviation = np.zeros(n_windows)
        for offset in range(length):
            deviation += np.abs(self._x[offset : offset + n_windows] - mean)
        return deviation

    def _wavelet_batch(self, lengths: list[int]) -> Iterator[np.ndarray]:
        if not lengths:
            return
        n = self._x.size
        counts = [n - length + 1 for length in lengths]
        starts = np.concatenate([np.arange(c) for c in counts])
        length_of = np.repeat(np.asarray(lengths, dtype=np.int64), counts)
        mean = self._means(starts, length_of)
        # x_j >= mean  <=>  rank_j >= #(distinct values < mean).  Clipping only matters when
        # rounding puts the mean a hair above the maximum; those terms are ~0 either way.
        threshold = np.minimum(
            np.searchsorted(self._distinct, mean, side="left"), self._distinct.size - 1
        )
        count, total = _count_and_sum_at_least(
            self._ranks, self._distinct, starts, starts + length_of, threshold
        )
        deviation = np.maximum(2.0 * (total - count * mean), 0.0)
        yield from np.split(deviation, np.cumsum(counts)[:-1])


def _candidate_lengths(n_cells: int, intervals: IntervalFamily) -> np.ndarray:
    if intervals == "all":
        return np.arange(1, n_cells + 1, dtype=np.int64)
    return 1 << np.arange(n_cells.bit_length(), dtype=np.int64)


def _backtrack(last_length: np.ndarray) -> np.ndarray:
    starts = []
    end = last_length.size - 1
    while end > 0:
        end -= int(last_length[end])
        starts.append(end)
    return np.asarray(starts[::-1], dtype=np.int64)


def _least_cost_dyadic(costs: np.ndarray) -> np.ndarray:
    """Starts of the least-cost partition; ``costs[k, i]`` is the cost of cells ``[i, i + 2^k)``.

    ``C[e] = min_k C[e − 2^k] + costs[k, e − 2^k]``; ties go to the shortest last bucket.  Blocks of
    ``_DP_BLOCK`` end positions: candidates at least a block long start before the block and are
    vectorised; shorter ones are a Python loop.  O(n log n) time.
    """
    n_lengths, n_cells = costs.shape
    lengths = 1 << np.arange(n_lengths, dtype=np.int64)
    n_short = min(n_lengths, _DP_BLOCK.bit_length() - 1)
    short_lengths = [int(length) for length in lengths[:n_short]]
    long_rows = np.arange(n_short, n_lengths)[:, None]
    long_lengths = lengths[n_short:, None]
    best = np.empty(n_cells + 1)
    best[0] = 0.0
    last_length = np.zeros(n_cells + 1, dtype=np.int64)
    for block_start in range(1, n_cells + 1, _DP_BLOCK):
        ends = np.arange(block_start, min(block_start + _DP_BLOCK, n_cells + 1))
        long_best = np.full(ends.size, np.inf)
        long_length = np.zeros(ends.size, dtype=np.int64)
        if long_lengths.size:
            starts = ends[None, :] - long_lengths  # O(block · log n)
            valid = starts >= 0
            safe = np.where(valid, starts, 0)
            candidate = np.where(valid, best[safe] + costs[long_rows, safe], np.inf)
            pick = np.argmin(candidate, axis=0)
            long_best = candidate[pick, np.arange(ends.size)]
            long_length = long_lengths[pick, 0]
        first = max(0, block_start - short_lengths[-1])
        local_best = best[first:block_start].tolist()
        short_candidates = [
            (length, costs[k, first : ends[-1]].tolist()) for k, length in enumerate(short_lengths)
        ]
        block_length = []
        for end, long_value, long_size in zip(  # O(block · log block) Python steps
            ends.tolist(), long_best.tolist(), long_length.tolist(), strict=True
        ):
            value, length = math.inf, 0
            relative_end = end - first
            for candidate_length, cost_from in short_candidates:
                if candidate_length > end:
                    break
                total = (
                    local_best[relative_end - candidate_length]
                    + cost_from[relative_end - candidate_length]
                )
                if total < value:
                    value, length = total, candidate_length
            if long_value < value:
                value, length = long_value, long_size
            local_best.append(value)
            block_length.append(length)
        best[ends] = local_best[-ends.size :]
        last_length[ends] = block_length
    return _backtrack(last_length)


def _least_cost_all(packed_costs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Starts of the least-cost partition over all intervals.  O(n²) time.

    ``packed_costs[offsets[L] + i]`` is the cost of cells ``[i, i + L)``; ties go to the shortest
    last bucket.
    """
    n_cells = offsets.size - 2
    best = np.empty(n_cells + 1)
    best[0] = 0.0
    last_length = np.zeros(n_cells + 1, dtype=np.int64)
    all_lengths = np.arange(1, n_cells + 1)
    for end in range(1, n_cells + 1):
        lengths = all_lengths[:end]
        starts = end - lengths
        candidate = best[starts] + packed_costs[offsets[lengths] + starts]
        pick = int(np.argmin(candidate))
        best[end] = candidate[pick]
        last_length[end] = pick + 1
    return _backtrack(last_length)


def _least_cost_partition(
    cells: np.ndarray,
    *,
    penalty: float,
    intervals: IntervalFamily,
    perturb: Callable[[np.ndarray, int], np.ndarray],
) -> Partition:
    """Least ``Σ perturb(dev + penalty)`` partition; ``perturb(costs, L)`` sees all length-L costs."""
    n = cells.size
    lengths = _candidate_lengths(n, intervals)
    deviations = _DeviationOracle(cells).windows(lengths.tolist())
    by_length = zip(lengths.tolist(), deviations, strict=True)
    if intervals == "dyadic":
        costs = np.full((lengths.size, n), np.inf)
        for k, (length, deviation) in enumerate(by_length):
            costs[k, : n - length + 1] = perturb(deviation + penalty, length)
        starts = _least_cost_dyadic(costs)
    else:
        counts = n - lengths + 1
        offsets = np.concatenate(([0, 0], np.cumsum(counts)))  # offsets[L] for L = 1 … n
        packed = np.empty(int(counts.sum()))
        for length, deviation in by_length:
            packed[offsets[length] : offsets[length + 1]] = perturb(deviation + penalty, length)
        starts = _least_cost_all(packed, offsets)
    return Partition.from_starts(starts, n_cells=n)


def _check_all_intervals_size(n_cells: int, intervals: IntervalFamily) -> None:
    if intervals == "all" and n_cells > ALL_INTERVALS_MAX_CELLS:
        raise ValueError(
            f"intervals='all' stores n(n+1)/2 costs; n_cells ({n_cells}) must be <= "
            f"{ALL_INTERVALS_MAX_CELLS} (use intervals='dyadic')"
        )


@dataclass(frozen=True, kw_only=True)
class PartitionSelector:
    """Step 1 of DAWA (Program 6.3.1): a private least-cost partition.  Spends ``epsilon`` (ε₁).

    Call :meth:`select` (or the instance itself, ``selector(x, sampler)``, the form a session's
    ``select`` uses) after charging ``epsilon``; :meth:`noise_scales` is public and data-free.

    Privacy:
    ε₁-DP under add/remove-one-record neighbours (Theorem 6.1 with the Remark).  Each candidate
    interval gets one independent Laplace draw; a bucket of length L has cost sensitivity
    ``Δ_b = 2 − 2/L`` and ``Δ̄`` is the largest among the candidates, so the proof of Theorem 6.1
    needs scale ``(Δ̄ + Δ_b)/ε₁`` (``"per_interval"``; ``2Δ̄/ε₁`` for ``"uniform"``).  Scales are
    multiplied by ``contribution_bound`` (group privacy).  Only the argmin partition is released;
    the noisy costs never leave this object.

    References: Li thesis §6.3.2 (Program 6.3.1, Theorem 6.1 and the Remark after it)."""

    epsilon: float
    """ε₁, the budget of this step."""
    measurement_epsilon: float
    """ε₂, the budget Step 2 will spend; sets the per-bucket penalty ``1/ε₂`` (public)."""
    intervals: IntervalFamily = "dyadic"
    """Candidate intervals."""
    scale_rule: ScaleRule = "per_interval"
    """Laplace scale per candidate interval."""
    contribution_bound: int = 1
    """Most records one privacy unit contributes; multiplies every scale."""
    noise_offset: float = 0.0
    """Location of every candidate's Laplace noise, in units of its scale (0 = the thesis); a
    public constant, so privacy is unchanged (Lemma 4 is translation-invariant)."""

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_epsilon(self.measurement_epsilon, name="measurement_epsilon")
        _check_choice("intervals", self.intervals, get_args(IntervalFamily))
        _check_choice("scale_rule", self.scale_rule, get_args(ScaleRule))
        if not isinstance(self.contribution_bound, int | np.integer) or self.contribution_bound < 1:
            raise ValueError(
                f"contribution_bound ({self.contribution_bound}) must be an integer >= 1"
            )
        if not (math.isfinite(self.noise_offset) and self.noise_offset >= 0):
            raise ValueError(f"noise_offset ({self.noise_offset}) must be finite and >= 0")

    def noise_scales(self, n_cells: int) -> np.ndarray:
        """Laplace scale of each candidate length (ascending; each length at every offset).
        ``(Δ̄ + Δ_b)·c/ε₁`` or ``2Δ̄·c/ε₁`` with ``Δ_b = 2 − 2/|b|``, ``Δ̄ = 2 − 2/L_max``.
        All zero when ``n_cells == 1`` (only one partition exists; nothing is drawn)."""
        if n_cells < 1:
            raise ValueError(f"n_cells ({n_cells}) must be >= 1")
        lengths = _candidate_lengths(n_cells, self.intervals)
        bucket_sensitivity = 2.0 - 2.0 / lengths
        max_sensitivity = 2.0 - 2.0 / lengths[-1]
        if self.scale_rule == "per_interval":
            numerator = max_sensitivity + bucket_sensitivity
        else:
            numerator = np.full(lengths.size, 2.0 * max_sensitivity)
        return numerator * self.contribution_bound / self.epsilon

    def select(self, x: np.ndarray, *, sampler: NoiseSampler) -> Partition:
        """Run Program 6.3.1 on the confidential ``x``; charge ``epsilon`` first.

        O(n log² n) for ``"dyadic"``; O(n² log n) time and O(n²) memory for ``"all"``.
        """
        cells = _as_cells(x)
        _check_all_intervals_size(cells.size, self.intervals)
        if cells.size == 1:
            return Partition.singletons(1)
        lengths = _candidate_lengths(cells.size, self.intervals).tolist()
        scales = dict(zip(lengths, self.noise_scales(cells.size).tolist(), strict=True))

        def perturb(costs: np.ndarray, length: int) -> np.ndarray:
            # privacy: one independent Laplace draw per candidate interval (Theorem 6.1)
            scale = scales[length]
            noisy = np.asarray(sampler.add_laplace(costs, scale=scale), dtype=np.float64)
            return noisy + self.noise_offset * scale

        return _least_cost_partition(
            cells,
            penalty=1.0 / self.measurement_epsilon,
            intervals=self.intervals,
            perturb=perturb,
        )

    def __call__(self, cells: np.ndarray, sampler: NoiseSampler) -> Partition:
        """``select(cells, sampler=sampler)``, in the positional form a session calls selectors."""
        return self.select(cells, sampler=sampler)


def split_budget(epsilon: float, *, ratio: float = 0.25) -> tuple[float, float]:
    """``(ε₁, ε₂) = (ratio·ε, ε − ratio·ε)`` (§6.5.1 uses ratio 0.25)."""
    epsilon = check_epsilon(epsilon)
    if not (isinstance(ratio, int | float | np.floating) and 0 < ratio < 1):
        raise ValueError(f"ratio ({ratio}) must lie strictly between 0 and 1")
    partition_epsilon = ratio * epsilon
    return partition_epsilon, epsilon - partition_epsilon
