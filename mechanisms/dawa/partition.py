"""DAWA: the data- and workload-aware ε-DP histogram estimator of Li's thesis, chapter 6.

DAWA answers a workload of (weighted) interval queries over a 1-D cell vector ``x`` in three steps:

1. **Private partition** (spends ε₁ = ratio·ε, :class:`PartitionSelector`): every candidate interval
   ``b`` gets the cost ``dev(x, b) + 1/ε₂`` plus its own Laplace draw, and a dynamic program returns
   the partition with the least total *noisy* cost.  Only the partition is released.
2. **Bucket counts** (spends ε₂ = ε − ε₁, :func:`greedy_h_strategy`, :func:`measure_buckets`): the
   workload is rewritten over the buckets (Prop. 6.2), GreedyH splits ε₂ over a binary tree of
   bucket intervals, the tree is measured with Laplace noise and combined by least squares.
3. **Uniform expansion** (post-processing, :meth:`Partition.expand`).

Steps 1 and 2 are separate public calls so a session can charge each cost before any noise is
drawn: :meth:`PartitionSelector.noise_scales` gives Step 1's Laplace scales and
:meth:`HierarchicalStrategy.sensitivity` / :meth:`HierarchicalStrategy.laplace_scale` give Step 2's.
:func:`dawa` composes the three steps.  2-D data goes through :mod:`mechanisms.dawa.hilbert` first.

Neighbouring relation (thesis L423): add or remove one record, i.e. one cell of ``x`` changes by
one.  A privacy unit that contributes up to ``c`` records is covered by ``contribution_bound=c``
(Step 1, group privacy) and by multiplying Step 2's sensitivity by ``c`` (the session does this).

Design notes (where the thesis leaves a point open, the choice made here):

- Step-1 noise follows the thesis's Remark: interval ``b`` gets scale ``(Δ̄ + Δ_b)/ε₁`` with
  ``Δ_b = 2 − 2/|b|`` and ``Δ̄`` the largest ``Δ_b`` among the candidates (``scale_rule=
  "per_interval"``); Program 6.3.1's single scale ``2Δ̄/ε₁`` is ``scale_rule="uniform"``.  The
  reference code's halved, singleton-free, floored noise is *not* offered: the thesis's proof does
  not cover it.
- Candidate intervals are every interval (``"all"``) or every interval whose length is a power of
  two, at every offset (``"dyadic"``, the thesis's default).
- ``noise_offset`` κ (default 0, the thesis) centres each candidate's Laplace noise at κ·scale; a
  public constant, so privacy is unchanged.  With κ = 0 the least-cost search favours partitions
  with many buckets whose noise happens to be negative (at ε = 0.1 about half of the cells start
  a bucket, even on all-zero data); κ ≈ 3 recovers the sparse-data accuracy the thesis reports
  (``benchmarks/dawa_bench.py``).
- GreedyH never forms a dense matrix: every quantity in eq. (6.11) is a vector recursion (the
  Sherman–Morrison update of ``M_q⁻¹𝟏``) plus per-node squared norms of the reduced workload, so
  allocation costs O((pieces + k) log k) instead of the thesis's O(mk log k + k²), and least squares
  applies ``M⁻¹`` in O(k log k).  A level's leftover single node is carried up unchanged instead of
  getting a duplicate parent.  λ is searched on a 100-point grid over [0, 0.99] and refined by
  golden section.
- Uncertainty (:func:`query_uncertainty`): a released answer's ``std_error`` combines the
  measurement noise with an estimate of the bias of uniform expansion inside the buckets the
  query cuts, computed from the released bucket estimates and the public partition only (cell
  counts vary around a linear trend fitted to the neighbouring buckets, with the larger of the
  Poisson variance and the roughness the neighbours show around that trend); queries whose
  bias cannot be estimated (a single bucket) are flagged noise-only, with no interval.
- Step 2 measures the budget-weighted tree ``A = diag(f)·Y`` (``f`` = budget fractions, every
  leaf-to-root path sums to 1) with one Laplace scale ``Δ(A)/ε₂``; this is the same mechanism as
  Laplace(1/(f_q ε₂)) per query, and ordinary least squares on ``A`` is the weighted least squares
  of Program 6.4.1.

References: C. Li, *Optimizing Linear Queries Under Differential Privacy*, PhD thesis, UMass Amherst,
2013, ch. 6; C. Li, M. Hay, G. Miklau, Y. Wang, PVLDB 7(5), 2014.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from mechanisms.checks import check_epsilon
from mechanisms.intervals import single_term_rows
from mechanisms.noise import NoiseSampler

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
# GreedyH's search range for λ (λ = 1 would give the subtree no budget and make M singular).
_LAMBDA_MAX = 0.99
_LAMBDA_GRID = np.linspace(0.0, _LAMBDA_MAX, 100)
_LAMBDA_GRID_STEP = _LAMBDA_MAX / 99
_GOLDEN_ITERATIONS = 40
_LAMBDA_CHUNK = 1 << 15


# --------------------------------------------------------------------------------------------------
# Validation helpers


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


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.array(array, copy=True)
    array.setflags(write=False)
    return array


# --------------------------------------------------------------------------------------------------
# Partitions and workloads


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
        object.__setattr__(self, "boundaries", _readonly(bounds.astype(np.int64)))

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
        """Number of cells ``n``."""
        return int(self.boundaries[-1])

    @property
    def n_buckets(self) -> int:
        """Number of buckets ``k``."""
        return int(self.boundaries.size - 1)

    @property
    def starts(self) -> np.ndarray:
        """First cell of each bucket."""
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
        values = np.asarray(bucket_values, dtype=np.float64)
        if values.shape != (self.n_buckets,):
            raise ValueError(
                f"bucket_values (shape {values.shape}) must have one entry per bucket "
                f"({self.n_buckets})"
            )
        return np.repeat(values / self.sizes, self.sizes)

    def _check_cells(self, n_cells: int, name: str) -> None:
        if n_cells != self.n_cells:
            raise ValueError(f"{name} has {n_cells} cells but the partition covers {self.n_cells}")


@dataclass(frozen=True, kw_only=True, eq=False)
class IntervalWorkload:
    """Linear queries whose rows are weighted sums of cell intervals ("pieces").

    Row ``r`` is ``Σ_{p: row[p] = r} weight[p] · 1[lo[p] ≤ j ≤ hi[p]]``; pieces of one row must not
    overlap.  A 1-D range query is one piece of weight 1 (:meth:`from_ranges`); a rectangle over a
    Hilbert-ordered grid is one piece per run of consecutive positions; any matrix is one piece per
    run of equal consecutive non-zeros (:meth:`from_matrix`).  Public.
    """

    n_cells: int
    """Size of the cell domain."""
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
        row = arrays["row"].astype(np.int64)
        lo = arrays["lo"].astype(np.int64)
        hi = arrays["hi"].astype(np.int64)
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
            object.__setattr__(self, name, _readonly(value))

    @classmethod
    def from_ranges(
        cls, lo: np.ndarray | Sequence[int], hi: np.ndarray | Sequence[int], *, n_cells: int
    ) -> IntervalWorkload:
        """Range queries ``Σ_{lo[i] ≤ j ≤ hi[i]} x_j`` (inclusive, 0-based cell indices)."""
        lo = np.asarray(lo, dtype=np.int64)
        hi = np.asarray(hi, dtype=np.int64)
        if lo.ndim != 1 or lo.shape != hi.shape:
            raise ValueError(
                f"lo (shape {lo.shape}) and hi (shape {hi.shape}) must be 1-D of one length"
            )
        return cls(
            n_cells=n_cells,
            n_rows=max(int(lo.size), 1),
            row=np.arange(lo.size),
            lo=lo,
            hi=hi,
            weight=np.ones(lo.size),
        )

    @classmethod
    def from_matrix(cls, matrix: np.ndarray | sp.sparray | sp.spmatrix) -> IntervalWorkload:
        """Any ``m × n`` query matrix, one piece per run of equal consecutive non-zeros in a row."""
        coo = sp.coo_array(matrix)
        coo.sum_duplicates()
        keep = coo.data != 0
        row, col, value = coo.row[keep], coo.col[keep], coo.data[keep].astype(np.float64)
        order = np.lexsort((col, row))
        row, col, value = row[order], col[order], value[order]
        starts_run = np.ones(row.size, dtype=bool)
        starts_run[1:] = (
            (row[1:] != row[:-1]) | (col[1:] != col[:-1] + 1) | (value[1:] != value[:-1])
        )
        first = np.flatnonzero(starts_run)
        last = np.append(first[1:], row.size) - 1
        return cls(
            n_cells=int(coo.shape[1]),
            n_rows=int(coo.shape[0]),
            row=row[first],
            lo=col[first],
            hi=col[last],
            weight=value[first],
        )

    @property
    def n_pieces(self) -> int:
        """Number of (row, interval, weight) pieces."""
        return int(self.row.size)

    def answer(self, x: np.ndarray) -> np.ndarray:
        """``W x`` for every query.  O(n + pieces)."""
        cells = _as_cells(x)
        if cells.size != self.n_cells:
            raise ValueError(f"x has {cells.size} cells but the workload has {self.n_cells}")
        prefix = np.concatenate(([0.0], np.cumsum(cells)))
        piece_sums = self.weight * (prefix[self.hi + 1] - prefix[self.lo])
        return np.bincount(self.row, weights=piece_sums, minlength=self.n_rows)

    def to_sparse(self) -> sp.csr_array:
        """The ``m × n`` query matrix (for tests and small problems).  O(Σ piece lengths)."""
        lengths = self.hi - self.lo + 1
        piece = np.repeat(np.arange(self.n_pieces), lengths)
        col = self.lo[piece] + (
            np.arange(piece.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        )
        return sp.csr_array(
            (self.weight[piece], (self.row[piece], col)), shape=(self.n_rows, self.n_cells)
        )


# --------------------------------------------------------------------------------------------------
# Step 1: bucket deviations (ALLCOSTS)


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
    O((n + Q) · log2(#ranks)) time, O(n + Q) memory.
    """
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


# --------------------------------------------------------------------------------------------------
# Step 1: least-cost partition (LEASTCOSTPARTITION)


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
        short_costs = [costs[k, first : ends[-1]].tolist() for k in range(n_short)]
        for offset, end in enumerate(ends.tolist()):  # O(block · log block) Python steps
            value, length = math.inf, 0
            for k, candidate_length in enumerate(short_lengths):
                start = end - candidate_length
                if start < 0:
                    break
                total = local_best[start - first] + short_costs[k][start - first]
                if total < value:
                    value, length = total, candidate_length
            if long_best[offset] < value:
                value, length = float(long_best[offset]), int(long_length[offset])
            local_best.append(value)
            best[end] = value
            last_length[end] = length
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
    oracle = _DeviationOracle(cells)
    if intervals == "dyadic":
        costs = np.full((lengths.size, n), np.inf)
        for k, (length, deviation) in enumerate(
            zip(lengths.tolist(), oracle.windows(lengths.tolist()), strict=True)
        ):
            costs[k, : n - length + 1] = perturb(deviation + penalty, length)
        starts = _least_cost_dyadic(costs)
    else:
        counts = n - lengths + 1
        offsets = np.concatenate(([0, 0], np.cumsum(counts)))  # offsets[L] for L = 1 … n
        packed = np.empty(int(counts.sum()))
        for length, deviation in zip(
            lengths.tolist(), oracle.windows(lengths.tolist()), strict=True
        ):
            packed[offsets[length] : offsets[length + 1]] = perturb(deviation + penalty, length)
        starts = _least_cost_all(packed, offsets)
    return Partition.from_starts(starts, n_cells=n)


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

    Privacy
    -------
    ε₁-DP under add/remove-one-record neighbours (Theorem 6.1 with the Remark).  Each candidate
    interval gets one independent Laplace draw; a bucket of length L has cost sensitivity
    ``Δ_b = 2 − 2/L`` and ``Δ̄`` is the largest among the candidates, so the proof of Theorem 6.1
    needs scale ``(Δ̄ + Δ_b)/ε₁`` (``"per_interval"``; ``2Δ̄/ε₁`` for ``"uniform"``).  Scales are
    multiplied by ``contribution_bound`` (group privacy).  Only the argmin partition is released;
    the noisy costs never leave this object.

    References
    ----------
    Li thesis §6.3.2 (Program 6.3.1, Theorem 6.1 and the Remark after it).
    """

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
    """Location of every candidate's Laplace noise, in units of its scale (0 = the thesis).

    A public constant, so privacy is unchanged (Lemma 4 is translation-invariant).  A positive
    offset counters the least-cost search's preference for many buckets whose noise happens to be
    negative; see ``benchmarks/dawa_bench.py`` for its effect.
    """

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

    def candidate_lengths(self, n_cells: int) -> np.ndarray:
        """Lengths of the candidate intervals (each at every offset)."""
        if n_cells < 1:
            raise ValueError(f"n_cells ({n_cells}) must be >= 1")
        return _candidate_lengths(n_cells, self.intervals)

    def noise_scales(self, n_cells: int) -> np.ndarray:
        """Laplace scale of each candidate length (aligned with :meth:`candidate_lengths`).

        ``(Δ̄ + Δ_b)·c/ε₁`` or ``2Δ̄·c/ε₁`` with ``Δ_b = 2 − 2/|b|``, ``Δ̄ = 2 − 2/L_max``.
        All zero when ``n_cells == 1`` (only one partition exists; nothing is drawn).
        """
        lengths = self.candidate_lengths(n_cells)
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
        scales = dict(
            zip(
                self.candidate_lengths(cells.size).tolist(),
                self.noise_scales(cells.size).tolist(),
                strict=True,
            )
        )

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


# --------------------------------------------------------------------------------------------------
# Step 2: the workload over buckets, GreedyH, measurement and least squares


class _BucketPieces:
    """The workload rewritten over buckets, ``Ŵ = W·E`` (Prop. 6.2), kept as pieces.

    Piece ``p`` of row ``r`` contributes ``w_first`` at bucket ``first``, ``w_mid`` at every bucket
    strictly between ``first`` and ``last``, and ``w_last`` at ``last`` (when ``last > first``).
    """

    def __init__(self, workload: IntervalWorkload, partition: Partition) -> None:
        bucket = partition.bucket_of_cell()
        starts, sizes = partition.starts, partition.sizes
        ends = partition.boundaries[1:]
        self.row = workload.row
        self.first = bucket[workload.lo]
        self.last = bucket[workload.hi]
        weight = workload.weight
        first_cover = np.minimum(workload.hi + 1, ends[self.first]) - workload.lo
        self.w_first = weight * first_cover / sizes[self.first]
        last_cover = workload.hi + 1 - starts[self.last]
        self.w_last = np.where(self.last > self.first, weight * last_cover / sizes[self.last], 0.0)
        self.w_mid = weight
        self.one_piece_per_row = np.unique(self.row).size == self.row.size

    def node_sq_norms(self, u: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """``‖Ŵ[:, q] u[q]‖²`` for every node ``q = [bounds[i], bounds[i+1])``.  O(pieces + k).

        A piece meets at most two nodes partially (those holding its first and last bucket);
        nodes strictly between are covered with coefficient ``w_mid`` and contribute
        ``w_mid² (Σ_q u)²``.  Pieces of one row cannot both meet such a covered node.
        """
        n_nodes = bounds.size - 1
        prefix = np.concatenate(([0.0], np.cumsum(u)))
        node_sum = prefix[bounds[1:]] - prefix[bounds[:-1]]
        node_of_bucket = np.repeat(np.arange(n_nodes), np.diff(bounds))
        first, last = self.first, self.last
        first_node, last_node = node_of_bucket[first], node_of_bucket[last]
        same = first_node == last_node
        # Part of the piece inside its first node: buckets first … first_end.
        first_end = np.where(same, last, bounds[first_node + 1] - 1)
        mid_lo = first + 1
        mid_hi = np.maximum(np.minimum(first_end, last - 1) + 1, mid_lo)
        in_first = (
            self.w_first * u[first]
            + self.w_mid * (prefix[mid_hi] - prefix[mid_lo])
            + np.where(same, self.w_last * u[last], 0.0)
        )
        split = ~same
        in_last = (
            self.w_mid[split] * (prefix[last[split]] - prefix[bounds[last_node[split]]])
            + self.w_last[split] * u[last[split]]
        )
        if self.one_piece_per_row:
            partial = np.bincount(first_node, in_first**2, minlength=n_nodes) + np.bincount(
                last_node[split], in_last**2, minlength=n_nodes
            )
        else:  # sum the pieces of one row inside one node before squaring.  O(P log P)
            key = np.concatenate(
                (
                    self.row * n_nodes + first_node,
                    self.row[split] * n_nodes + last_node[split],
                )
            )
            unique_key, inverse = np.unique(key, return_inverse=True)
            row_node_sum = np.bincount(inverse, np.concatenate((in_first, in_last)))
            partial = np.bincount(unique_key % n_nodes, row_node_sum**2, minlength=n_nodes)
        covered = np.zeros(n_nodes + 1)
        np.add.at(covered, first_node[split] + 1, self.w_mid[split] ** 2)
        np.add.at(covered, last_node[split], -(self.w_mid[split] ** 2))
        return partial + np.cumsum(covered)[:n_nodes] * node_sum**2


def _build_tree(n_leaves: int, branching: int) -> list[np.ndarray]:
    """Level bounds of the bottom-up tree (§6.4.1): every ``branching`` consecutive nodes get a parent.

    A level's leftover single node is carried up unchanged (it is not a new query).
    """
    levels = [np.arange(n_leaves + 1, dtype=np.int64)]
    while levels[-1].size > 2:
        below = levels[-1]
        levels.append(np.append(below[:-1][::branching], below[-1]))
    return levels


def _first_children(levels: Sequence[np.ndarray], level: int) -> np.ndarray:
    return np.searchsorted(levels[level - 1], levels[level][:-1])


def _tree_depths(levels: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Depth ``l`` of every node (root 0); a carried node keeps the depth of its single child."""
    depths = [np.zeros(0)] * len(levels)
    depths[-1] = np.zeros(1)
    for level in range(len(levels) - 1, 0, -1):
        first = _first_children(levels, level)
        group = np.diff(np.append(first, levels[level - 1].size - 1))
        is_query = group >= 2
        depths[level - 1] = np.repeat(depths[level] + is_query, group)
    return depths


def _sherman_morrison(lam: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``c = λ²/((1−λ)² + λ²d)`` and ``g = (1 − c·d)/(1−λ)²``.

    With ``B = blkdiag(M_children⁻¹)``, ``u = B𝟏`` and ``d = 𝟏ᵀB𝟏``:
    ``M_q⁻¹ = (B − c·u uᵀ)/(1−λ)²`` (thesis §6.4.3), hence ``M_q⁻¹𝟏 = g·u``.
    """
    c = lam**2 / ((1.0 - lam) ** 2 + lam**2 * d)
    return c, (1.0 - c * d) / (1.0 - lam) ** 2


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

    References
    ----------
    Li thesis §6.4.3, eqs. (6.10)–(6.11) (the printed ``t^{−1/2}`` is ``t^{−l/2}``).
    """
    lam = np.asarray(lam, dtype=np.float64)
    mixed = mu * np.asarray(a) + (1.0 - np.asarray(mu)) * np.asarray(a_prime)
    return (e - mixed * lam**2 / ((1.0 - lam) ** 2 + lam**2 * np.asarray(d))) / (1.0 - lam) ** 2


def _minimise_local_error(
    e: np.ndarray, a: np.ndarray, a_prime: np.ndarray, d: np.ndarray, mu: np.ndarray
) -> np.ndarray:
    """λ ∈ [0, 0.99] minimising (6.11) per node: 100-point grid, then golden section.  O(nodes)."""
    lam = np.zeros(e.size)
    for chunk in range(0, e.size, _LAMBDA_CHUNK):
        part = slice(chunk, chunk + _LAMBDA_CHUNK)
        terms = {"e": e[part], "a": a[part], "a_prime": a_prime[part], "d": d[part], "mu": mu[part]}
        on_grid = greedy_h_local_error(
            _LAMBDA_GRID[None, :], **{name: value[:, None] for name, value in terms.items()}
        )
        pick = np.argmin(on_grid, axis=1)  # first minimum: λ = 0 wins ties
        grid_lam = _LAMBDA_GRID[pick]
        grid_value = on_grid[np.arange(pick.size), pick]
        left = np.maximum(grid_lam - _LAMBDA_GRID_STEP, 0.0)
        right = np.minimum(grid_lam + _LAMBDA_GRID_STEP, _LAMBDA_MAX)
        inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
        for _ in range(_GOLDEN_ITERATIONS):
            inner_left = right - inv_phi * (right - left)
            inner_right = left + inv_phi * (right - left)
            go_left = greedy_h_local_error(inner_left, **terms) < greedy_h_local_error(
                inner_right, **terms
            )
            right = np.where(go_left, inner_right, right)
            left = np.where(go_left, left, inner_left)
        refined = (left + right) / 2.0
        better = greedy_h_local_error(refined, **terms) < grid_value
        lam[part] = np.where(better, refined, grid_lam)
    return lam


@dataclass(frozen=True, kw_only=True, eq=False)
class HierarchicalStrategy:
    """Step 2's measurement: a tree of bucket intervals with GreedyH budget fractions.

    Level 0 holds the buckets, the last level the root.  Node ``q`` keeps the fraction ``λ_q`` of
    the budget that reaches it and passes ``1 − λ_q`` down, so its budget fraction is
    ``f_q = λ_q Π_{ancestors}(1 − λ)`` (leaves keep all that reaches them) and every leaf-to-root
    path sums to 1 (eq. 6.6).  The measured matrix is ``A = diag(f)·Y`` over the rows with
    ``f_q > 0``; it is public and data-independent given the partition.

    Privacy
    -------
    Measuring ``A·B(x)`` with Laplace scale ``Δ(A)/ε₂`` is ε₂-DP (Theorem 6.3): ``Δ(A)`` is the
    largest path sum of ``f`` (1 up to rounding).  It is the same as Laplace(1/(f_q ε₂)) per node.

    References
    ----------
    Li thesis §6.4.1–6.4.3, Program 6.4.1.
    """

    partition: Partition
    """The buckets the tree is built on."""
    level_bounds: tuple[np.ndarray, ...]
    """Node boundaries (in buckets) per level; level 0 is ``0 … k``, the last is ``[0, k]``."""
    lambdas: tuple[np.ndarray, ...]
    """λ of every node of levels 1 … top (0 for a carried node, which is not a query)."""
    error_trace: float
    """``tr(ŴᵀŴ (AᵀA)⁻¹)``: the workload's total variance per unit Laplace variance and ε₂ = 1."""
    name: str = "dawa-greedy-h"
    """Strategy label (for measurement records)."""
    fractions: tuple[np.ndarray, ...] = field(init=False)
    """Budget fraction ``f_q`` of ε₂ for every node of every level (0 = not measured)."""

    def __post_init__(self) -> None:
        levels = tuple(_readonly(np.asarray(b, dtype=np.int64)) for b in self.level_bounds)
        k = self.partition.n_buckets
        if not levels or not np.array_equal(levels[0], np.arange(k + 1)):
            raise ValueError(f"level_bounds[0] must be 0 … n_buckets ({k})")
        if not np.array_equal(levels[-1], [0, k]):
            raise ValueError(f"level_bounds[-1] ({levels[-1]}) must be the root [0, {k}]")
        if len(self.lambdas) != len(levels) - 1:
            raise ValueError(
                f"lambdas has {len(self.lambdas)} levels but level_bounds has {len(levels) - 1} "
                "above the leaves"
            )
        lambdas = []
        for level in range(1, len(levels)):
            if not np.all(np.isin(levels[level], levels[level - 1])):
                raise ValueError(f"level_bounds[{level}] must be nested in level {level - 1}")
            lam = np.asarray(self.lambdas[level - 1], dtype=np.float64)
            if lam.shape != (levels[level].size - 1,):
                raise ValueError(
                    f"lambdas[{level - 1}] (shape {lam.shape}) must have one entry per node"
                )
            if np.any((lam < 0) | (lam >= 1)) or not np.all(np.isfinite(lam)):
                raise ValueError(f"lambdas[{level - 1}] must lie in [0, 1)")
            if np.any(lam[self._group_sizes(levels, level) < 2] != 0):
                raise ValueError(f"lambdas[{level - 1}] must be 0 at carried (single-child) nodes")
            lambdas.append(_readonly(lam))
        object.__setattr__(self, "level_bounds", levels)
        object.__setattr__(self, "lambdas", tuple(lambdas))
        # Budget fractions, top-down.  O(k)
        fractions: list[np.ndarray] = [np.zeros(0)] * len(levels)
        reaching = np.ones(1)
        for level in range(len(levels) - 1, 0, -1):
            lam = lambdas[level - 1]
            fractions[level] = _readonly(lam * reaching)
            reaching = np.repeat(reaching * (1.0 - lam), self._group_sizes(levels, level))
        fractions[0] = _readonly(reaching)
        object.__setattr__(self, "fractions", tuple(fractions))

    @staticmethod
    def _group_sizes(levels: Sequence[np.ndarray], level: int) -> np.ndarray:
        first = _first_children(levels, level)
        return np.diff(np.append(first, levels[level - 1].size - 1))

    @property
    def n_buckets(self) -> int:
        """Number of buckets ``k`` (tree leaves)."""
        return self.partition.n_buckets

    @property
    def num_queries(self) -> int:
        """Number of measured tree nodes (``f_q > 0``)."""
        return int(sum(np.count_nonzero(f) for f in self.fractions))

    def query_buckets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lo, hi, weight)`` of every measured query: ``weight · Σ_{lo ≤ j < hi} s_j`` (buckets).

        Rows are ordered level by level from the leaves up, nodes left to right.
        """
        lo, hi, weight = [], [], []
        for bounds, fraction in zip(self.level_bounds, self.fractions, strict=True):
            asked = fraction > 0
            lo.append(bounds[:-1][asked])
            hi.append(bounds[1:][asked])
            weight.append(fraction[asked])
        return np.concatenate(lo), np.concatenate(hi), np.concatenate(weight)

    def query_cells(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lo, hi, weight)`` of every measured query over cells, ``lo``/``hi`` inclusive."""
        lo, hi, weight = self.query_buckets()
        bounds = self.partition.boundaries
        return bounds[lo], bounds[hi] - 1, weight

    def matrix(self) -> sp.csr_array:
        """``A`` over buckets (rows as :meth:`query_buckets`), sparse.  O(k log k) non-zeros."""
        lo, hi, weight = self.query_buckets()
        lengths = hi - lo
        first = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)
        return sp.csr_array(
            (
                np.repeat(weight, lengths),
                (np.repeat(np.arange(lo.size), lengths), first + np.arange(lengths.sum())),
            ),
            shape=(lo.size, self.n_buckets),
        )

    def sensitivity(self, *, norm: int = 1) -> float:
        """Largest column norm of ``A`` over cells: L1 = max path sum of ``f`` (1), or L2."""
        if norm not in (1, 2):
            raise ValueError(f"norm ({norm}) must be 1 or 2")
        per_bucket = self.fractions[0] ** norm
        for bounds, fraction in zip(self.level_bounds[1:], self.fractions[1:], strict=True):
            per_bucket = per_bucket + np.repeat(fraction**norm, np.diff(bounds))
        return float(per_bucket.max() ** (1.0 / norm))

    def laplace_scale(self, *, epsilon: float) -> float:
        """Laplace scale ``Δ₁(A)/ε₂`` that makes the measurement ε₂-DP (Theorem 6.3)."""
        return self.sensitivity(norm=1) / check_epsilon(epsilon)

    def expected_squared_error(self, *, epsilon: float) -> float:
        """Expected ``‖Ŵŝ − Ŵ B(x)‖²`` summed over the workload: ``2·scale²·error_trace``.

        Perturbation error of Step 2 only (the uniformity bias of the buckets is data-dependent).
        """
        return 2.0 * self.laplace_scale(epsilon=epsilon) ** 2 * self.error_trace

    def answer_buckets(self, bucket_counts: np.ndarray) -> np.ndarray:
        """``A·s``: the weighted tree answers for bucket counts ``s``.  O(k log k)."""
        counts = np.asarray(bucket_counts, dtype=np.float64)
        if counts.shape != (self.n_buckets,):
            raise ValueError(
                f"bucket_counts (shape {counts.shape}) must have one entry per bucket "
                f"({self.n_buckets})"
            )
        prefix = np.concatenate(([0.0], np.cumsum(counts)))
        lo, hi, weight = self.query_buckets()
        return weight * (prefix[hi] - prefix[lo])

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``A·B(x)`` from the confidential cells ``x`` (the session's ``apply``).  O(n + k log k)."""
        return self.answer_buckets(self.partition.bucket_totals(x))

    def least_squares(self, noisy_answers: np.ndarray) -> np.ndarray:
        """``ŝ = (AᵀA)⁻¹ Aᵀ y``: bucket estimates from the noisy answers (post-processing).

        ``AᵀA = M_root`` is applied through the Sherman–Morrison recursion of §6.4.3 from the leaves
        up (``M_leaf = 1``), never formed.  O(k log k).
        """
        answers = np.asarray(noisy_answers, dtype=np.float64)
        if answers.shape != (self.num_queries,):
            raise ValueError(
                f"noisy_answers (shape {answers.shape}) must have one entry per query "
                f"({self.num_queries})"
            )
        lo, hi, weight = self.query_buckets()
        # Aᵀy: each query adds weight·y on its bucket range.  O(queries + k)
        spread = np.zeros(self.n_buckets + 1)
        np.add.at(spread, lo, weight * answers)
        np.add.at(spread, hi, -weight * answers)
        estimate = np.cumsum(spread)[:-1]
        u = np.ones(self.n_buckets)  # M_q⁻¹𝟏 of the current level's nodes, concatenated
        d = np.ones(self.n_buckets)  # 𝟏ᵀM_q⁻¹𝟏
        for level in range(1, len(self.level_bounds)):
            bounds = self.level_bounds[level]
            sizes = np.diff(bounds)
            lam = self.lambdas[level - 1]
            d_children = np.add.reduceat(d, _first_children(self.level_bounds, level))
            c, g = _sherman_morrison(lam, d_children)
            node_total = np.add.reduceat(estimate, bounds[:-1])
            estimate = (estimate - np.repeat(c * node_total, sizes) * u) / np.repeat(
                (1.0 - lam) ** 2, sizes
            )
            u = u * np.repeat(g, sizes)
            d = d_children * g
        return estimate

    def reconstruct(self, noisy_answers: np.ndarray) -> np.ndarray:
        """Cell estimates: least squares, then uniform expansion (Step 3)."""
        return self.partition.expand(self.least_squares(noisy_answers))


def greedy_h_strategy(
    workload: IntervalWorkload, partition: Partition, *, branching: int = 2
) -> HierarchicalStrategy:
    """GreedyH (Program 6.4.1 without the measurement): budget fractions for the bucket tree.

    Public and data-independent given the (already private) partition.  The tree is built bottom-up
    with ``branching`` children per node; nodes are visited level by level and each picks the
    ``λ`` minimising eq. (6.11) with ``μ = branching^{−depth/2}``; the unbiased trace
    ``tr(Ĝ_{qq} M_q⁻¹)`` is passed up.  O((pieces + k) log k) time, O(pieces + k) memory.

    References
    ----------
    Li thesis §6.4.2–6.4.3, Program 6.4.1.
    """
    if not isinstance(branching, int | np.integer) or branching < 2:
        raise ValueError(f"branching ({branching}) must be an integer >= 2")
    if workload.n_cells != partition.n_cells:
        raise ValueError(
            f"workload has {workload.n_cells} cells but the partition covers {partition.n_cells}"
        )
    pieces = _BucketPieces(workload, partition)
    levels = _build_tree(partition.n_buckets, branching)
    depths = _tree_depths(levels)
    u = np.ones(partition.n_buckets)  # M_q⁻¹𝟏 per node of the current level, concatenated
    d = np.ones(partition.n_buckets)  # 𝟏ᵀM_q⁻¹𝟏
    own = pieces.node_sq_norms(u, levels[0])  # ‖Ŵ_q M_q⁻¹𝟏‖²; G_jj at the leaves
    trace = own.copy()  # tr(Ĝ_qq M_q⁻¹); G_jj at the leaves (M_leaf = 1)
    lambdas = []
    for level in range(1, len(levels)):
        first = _first_children(levels, level)
        group = np.diff(np.append(first, levels[level - 1].size - 1))
        e = np.add.reduceat(trace, first)
        a_prime = np.add.reduceat(own, first)
        d_children = np.add.reduceat(d, first)
        a = pieces.node_sq_norms(u, levels[level])  # O(pieces + k)
        lam = np.zeros(group.size)
        query = group >= 2
        mu = float(branching) ** (-depths[level] / 2.0)
        lam[query] = _minimise_local_error(
            e[query], a[query], a_prime[query], d_children[query], mu[query]
        )
        c, g = _sherman_morrison(lam, d_children)
        trace = (e - c * a) / (1.0 - lam) ** 2
        u = u * np.repeat(g, np.diff(levels[level]))
        d = d_children * g
        own = a * g**2
        lambdas.append(lam)
    return HierarchicalStrategy(
        partition=partition,
        level_bounds=tuple(levels),
        lambdas=tuple(lambdas),
        error_trace=float(trace[0]),
    )


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


# --------------------------------------------------------------------------------------------------
# Uncertainty of the released answers: measurement noise plus the bias of uniform expansion


# Rows of the per-query coverage matrix formed at once (bounds working memory to ~16 MB per chunk).
_COVERAGE_CHUNK_ENTRIES = 2_000_000
# A (row, bucket) whose weights vary by less than this (relative) is treated as evenly covered.
_EVEN_COVER_TOLERANCE = 1e-9
# Roughness (``_bucket_roughness``): buckets on each side whose dispersion samples a bucket pools,
# and the pooled quantile, read as a χ²₁ quantile (``scipy.stats.chi2.ppf(0.9, 1)``).  The 0.9
# quantile ignores the few squared residuals that a spike or a bend of the trend inflates (the mean
# made smooth and sparse histograms' intervals several times too wide); lower quantiles or
# narrower windows under-cover on rough ones (benchmarks/dawa_coverage_bench.py).
_ROUGHNESS_WINDOW = 8
_ROUGHNESS_QUANTILE = 0.9
_CHI2_1_QUANTILE = 2.705543454095404


@dataclass(frozen=True, kw_only=True, eq=False)
class QueryUncertainty:
    """Per-query error model of DAWA's answers ``W x̂`` (public: computed from released values only).

    ``std_error`` is ``√(noise_variance + bias_variance)`` where the bias could be estimated and
    ``√noise_variance`` (a noise-only figure, to be published without an interval) where it could
    not; :attr:`interval` and :attr:`uncertainty` are the per-row values a release table takes.
    See :func:`query_uncertainty` for the estimator and its assumption.
    """

    noise_variance: np.ndarray
    """``q (AᵀA)⁻¹ qᵀ · σ²``: variance from the Laplace measurement, given the public partition."""
    bias_variance: np.ndarray
    """Estimated mean squared bias of uniform expansion; 0 for unions of whole buckets; NaN where
    it cannot be estimated from the release."""
    single_laplace_term: np.ndarray
    """The query's error is exactly one Laplace draw (no bias and one measurement), so its interval
    takes the Laplace quantile."""

    def __post_init__(self) -> None:
        for name in ("noise_variance", "bias_variance", "single_laplace_term"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))

    @property
    def bias_estimated(self) -> np.ndarray:
        """Whether the row's ``std_error`` includes the bias (False: noise-only, no interval)."""
        return np.isfinite(self.bias_variance)

    @property
    def variance(self) -> np.ndarray:
        """Squared ``std_error``: noise + estimated squared bias, or noise only where not estimable."""
        return self.noise_variance + np.where(self.bias_estimated, self.bias_variance, 0.0)

    @property
    def std_error(self) -> np.ndarray:
        """``√variance``."""
        return np.sqrt(self.variance)

    @property
    def interval(self) -> np.ndarray:
        """Per row: ``"laplace"`` (one Laplace draw), ``"normal"``, or ``"none"`` (noise-only)."""
        kind = np.where(self.single_laplace_term, "laplace", "normal")
        return np.where(self.bias_estimated, kind, "none").astype(object)

    @property
    def uncertainty(self) -> np.ndarray:
        """Per row: ``"noise+bias"`` (``std_error`` includes the bias) or ``"noise-only"``."""
        return np.where(self.bias_estimated, "noise+bias", "noise-only").astype(object)


def cell_coordinates(shape: Sequence[int], cell_at: np.ndarray | None = None) -> np.ndarray:
    """Grid coordinates ``(n_cells, len(shape))`` of DAWA's cells.

    ``cell_at[p]`` is the row-major grid index of DAWA position ``p`` (a Hilbert layout's
    ``cell_at`` without padding); ``None`` means positions are the grid in row-major order.
    """
    dims = tuple(int(s) for s in shape)
    if not dims or min(dims) < 1:
        raise ValueError(f"shape ({shape}) must be one or more positive sizes")
    index = np.arange(math.prod(dims)) if cell_at is None else np.asarray(cell_at, dtype=np.int64)
    if index.ndim != 1 or np.any((index < 0) | (index >= math.prod(dims))):
        raise ValueError(f"cell_at must be 1-D row-major indices into a grid of shape {dims}")
    return np.column_stack(np.unravel_index(index, dims)).astype(np.int64)


def bucket_covariance(strategy: HierarchicalStrategy, *, noise_variance: float) -> np.ndarray:
    """``Cov(ŝ) = σ² (AᵀA)⁻¹`` of the least-squares bucket counts; ``σ²`` = one draw's variance.

    ``AᵀA`` has full rank (every leaf keeps a positive budget fraction).  O(k³) time, O(k²) memory.
    """
    if not (math.isfinite(noise_variance) and noise_variance > 0):
        raise ValueError(f"noise_variance ({noise_variance}) must be finite and > 0")
    a = strategy.matrix()
    gram = (a.T @ a).toarray()
    factor, info = scipy.linalg.lapack.dpotrf(gram, lower=False)  # O(k³/3)
    if info == 0:
        upper, info = scipy.linalg.lapack.dpotri(factor, lower=False)  # O(2k³/3)
    if info != 0:  # numerically singular (budget fractions near 0): fall back to the pseudo-inverse
        return noise_variance * scipy.linalg.pinvh(gram)
    upper = np.triu(upper)
    return noise_variance * (upper + np.triu(upper, 1).T)


def _cross_edges(
    partition: Partition, coordinates: np.ndarray
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per axis, every grid edge between cells of different buckets: ``(axis, b, c)`` with ``c``'s
    cell one step further along ``axis`` than ``b``'s.  O(n) per axis."""
    bucket = partition.bucket_of_cell()
    shape = tuple(int(s) for s in coordinates.max(axis=0) + 1)
    grid = np.ravel_multi_index(tuple(coordinates.T), shape)
    position = np.full(math.prod(shape), -1, dtype=np.int64)
    position[grid] = np.arange(grid.size)
    for axis in range(coordinates.shape[1]):
        here = np.flatnonzero(coordinates[:, axis] < shape[axis] - 1)
        there = position[grid[here] + math.prod(shape[axis + 1 :])]
        keep = there >= 0
        b, c = bucket[here[keep]], bucket[there[keep]]
        cross = b != c
        yield axis, b[cross], c[cross]


def _bucket_slopes_squared(
    partition: Partition,
    densities: np.ndarray,
    density_covariance: np.ndarray,
    coordinates: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Squared density slope of every bucket along every axis, from its neighbouring buckets.

    Every grid edge between cells of buckets ``b ≠ b'`` gives, along the edge's axis, the sample
    ``max(0, (d_b' − d_b)² − Var(d_b' − d_b)) / max(|m_b' − m_b|, 1)²`` (``d`` densities, ``m``
    centroids; subtracting the noise variance removes the noise's upward bias, the floor at 0 keeps
    it a square).  A bucket's value per
    axis is the mean of its samples; an axis without samples takes the mean of the bucket's other
    axes.  Returns ``(slopes², centroids, estimable)``; a bucket with no neighbour at all (only when
    ``k = 1``) is not estimable.  O(n·axes + k).
    """
    k = partition.n_buckets
    bucket = partition.bucket_of_cell()
    sizes = partition.sizes.astype(np.float64)
    n_axes = coordinates.shape[1]
    centroids = np.column_stack(
        [
            np.bincount(bucket, coordinates[:, a].astype(np.float64), k) / sizes
            for a in range(n_axes)
        ]
    )
    variance = np.diag(density_covariance)
    sums = np.zeros((k, n_axes))
    counts = np.zeros((k, n_axes))
    for axis, b, c in _cross_edges(partition, coordinates):
        contrast = (densities[c] - densities[b]) ** 2 - (
            variance[b] + variance[c] - 2.0 * density_covariance[b, c]
        )
        distance = np.maximum(np.abs(centroids[c, axis] - centroids[b, axis]), 1.0)
        sample = np.maximum(contrast, 0.0) / distance**2
        sums[:, axis] = np.bincount(b, sample, k) + np.bincount(c, sample, k)
        counts[:, axis] = np.bincount(b, minlength=k) + np.bincount(c, minlength=k)
    seen = counts > 0
    slopes = np.divide(sums, counts, out=np.zeros_like(sums), where=seen)
    estimable = seen.any(axis=1)
    axis_mean = slopes.sum(axis=1) / np.maximum(seen.sum(axis=1), 1)
    slopes = np.where(seen, slopes, axis_mean[:, None])
    return slopes, centroids, estimable


def _bucket_roughness(
    partition: Partition, densities: np.ndarray, density_covariance: np.ndarray
) -> np.ndarray:
    """Per bucket of a 1-D partition, the variance ``σ²`` of its cells around the local trend.

    For a bucket ``b`` between buckets ``l = b−1`` and ``r = b+1`` a linear trend through the
    three centroids predicts ``d_b`` as ``w_l·d_l + w_r·d_r``.  If cells vary around the trend
    independently with variance ``σ²``, the residual's variance is
    ``σ²(1/|b| + w_l²/|l| + w_r²/|r|)`` plus the noise's (from ``density_covariance``), which
    gives the sample ``(residual² − noise) / (1/|b| + w_l²/|l| + w_r²/|r|)`` of ``σ²``.  Counts
    vary more where they are larger, so samples are pooled as dispersions ``σ²/λ`` (``λ = max(d,
    1)``, the Poisson variance): a bucket's ``σ²`` is its ``λ`` times the ``_ROUGHNESS_QUANTILE``
    quantile of the dispersion samples of the ``2·_ROUGHNESS_WINDOW + 1`` buckets around it,
    divided by the same quantile of ``χ²₁`` (one squared residual is ``σ²`` times a ``χ²₁`` draw).
    NaN only when the partition has fewer than three buckets.  O(k·window).
    """
    k = partition.n_buckets
    if k < 3:
        return np.full(k, np.nan)
    sizes = partition.sizes.astype(np.float64)
    centroids = partition.starts + (sizes - 1.0) / 2.0
    left, middle, right = slice(0, k - 2), slice(1, k - 1), slice(2, k)
    w_l = (centroids[right] - centroids[middle]) / (centroids[right] - centroids[left])
    w_r = 1.0 - w_l
    residual = densities[middle] - w_l * densities[left] - w_r * densities[right]
    cov = density_covariance
    noise = (
        np.diag(cov)[middle]
        + w_l**2 * np.diag(cov)[left]
        + w_r**2 * np.diag(cov)[right]
        - 2.0 * w_l * np.diag(cov, -1)[left]  # Cov(d_b, d_{b−1})
        - 2.0 * w_r * np.diag(cov, 1)[middle]  # Cov(d_b, d_{b+1})
        + 2.0 * w_l * w_r * np.diag(cov, 2)  # Cov(d_{b−1}, d_{b+1})
    )
    spread = 1.0 / sizes[middle] + w_l**2 / sizes[left] + w_r**2 / sizes[right]
    level = np.maximum(densities, 1.0)  # the Poisson variance, at least one count
    padding = np.full(_ROUGHNESS_WINDOW + 1, np.nan)  # the end buckets have no sample
    dispersion = np.r_[padding, (residual**2 - noise) / spread / level[middle], padding]
    windows = np.lib.stride_tricks.sliding_window_view(dispersion, 2 * _ROUGHNESS_WINDOW + 1)
    upper = np.nanquantile(windows, _ROUGHNESS_QUANTILE, axis=1)  # O(k·window)
    return level * np.maximum(upper, 0.0) / _CHI2_1_QUANTILE


def _partial_covers(
    workload: IntervalWorkload, partition: Partition, coordinates: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (row, bucket) a query covers unevenly, with its weight sums.

    Returns ``(row, bucket, Σa, Σa², Σa·coord)`` over the bucket's cells, ``a`` the query's weight on
    each cell (0 off the query).  Only a piece's first and last bucket can be cut; buckets strictly
    inside a piece are covered evenly and no other piece of the row meets them.  O(P log P).
    """
    bucket = partition.bucket_of_cell()
    starts, ends = partition.starts, partition.boundaries[1:]
    prefix = np.vstack(
        (np.zeros((1, coordinates.shape[1])), np.cumsum(coordinates, axis=0, dtype=np.float64))
    )
    first, last = bucket[workload.lo], bucket[workload.hi]
    split = last != first
    # (piece, bucket, lo, hi) of the piece's part in its first bucket, then in its last bucket.
    rows = np.concatenate((workload.row, workload.row[split]))
    buckets = np.concatenate((first, last[split]))
    lo = np.concatenate((workload.lo, starts[last[split]]))
    hi = np.concatenate((np.where(split, ends[first] - 1, workload.hi), workload.hi[split]))
    weight = np.concatenate((workload.weight, workload.weight[split]))
    count = (hi - lo + 1).astype(np.float64)
    key = rows * partition.n_buckets + buckets
    unique_key, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.ravel()
    a1 = np.bincount(inverse, weight * count)
    a2 = np.bincount(inverse, weight**2 * count)
    coord = np.column_stack(
        [
            np.bincount(inverse, weight * (prefix[hi + 1, axis] - prefix[lo, axis]))
            for axis in range(coordinates.shape[1])
        ]
    )
    row, bucket_index = np.divmod(unique_key, partition.n_buckets)
    size = partition.sizes[bucket_index].astype(np.float64)
    uneven = a2 * size - a1**2 > _EVEN_COVER_TOLERANCE * np.maximum(a2 * size, 1e-300)
    return row[uneven], bucket_index[uneven], a1[uneven], a2[uneven], coord[uneven]


def _coverage_rows(
    workload: IntervalWorkload, partition: Partition, first_row: int, last_row: int
) -> sp.csr_array:
    """``Q`` of rows ``first_row … last_row−1`` (sparse): each bucket's weight in the query's answer
    ``Σ_b Q_rb ŝ_b`` (uniform expansion: covering c of a bucket's L cells gives weight·c/L).
    O(pieces + Σ buckets spanned by the pieces)."""
    begin, end = np.searchsorted(workload.row, [first_row, last_row])
    piece = slice(begin, end)
    lo, hi, weight = workload.lo[piece], workload.hi[piece], workload.weight[piece]
    bucket = partition.bucket_of_cell()
    first, last = bucket[lo], bucket[hi]
    span = last - first + 1
    entry_piece = np.repeat(np.arange(span.size), span)
    entry_bucket = np.repeat(first - (np.cumsum(span) - span), span) + np.arange(span.sum())
    cover_lo = np.maximum(partition.starts[entry_bucket], lo[entry_piece])
    cover_hi = np.minimum(partition.boundaries[1:][entry_bucket], hi[entry_piece] + 1)
    value = weight[entry_piece] * (cover_hi - cover_lo) / partition.sizes[entry_bucket]
    return sp.csr_array(
        (value, (workload.row[piece][entry_piece] - first_row, entry_bucket)),
        shape=(last_row - first_row, partition.n_buckets),
    )


def query_uncertainty(
    workload: IntervalWorkload,
    strategy: HierarchicalStrategy,
    bucket_estimates: np.ndarray,
    *,
    noise_variance: float,
    coordinates: np.ndarray | None = None,
) -> QueryUncertainty:
    """Error model of every query's DAWA answer: noise variance plus the estimated expansion bias.

    Uses only what the release already holds (the public partition, the public strategy and the
    released bucket estimates ``ŝ``) — no extra budget, never the true cells.

    For a query with weight ``a_j`` on cell ``j`` the answer's error is
    ``Σ_b q_b(ŝ_b − s_b)`` (noise; ``q_b = Σ_{j∈b} a_j / |b|``) plus the bias
    ``Σ_b Σ_{j∈b} a_j (s_b/|b| − x_j)``, which is zero in every bucket the query covers evenly
    (all or none of its cells at one weight).  The bias in a bucket ``b`` that the query cuts is
    estimated under this **assumption**: inside a bucket, the cell counts vary independently
    around a linear trend, ``x_j = λ_b + g_b·(z_j − m_b) + e_j`` (``z_j`` the cell's grid
    coordinates, ``m_b`` the bucket's centroid) with ``Var(e_j) = σ_b²``.  Then

    ``E[bias_b²] = σ_b² (Σa_j² − (Σa_j)²/|b|) + Σ_axes g_{b,axis}² (Σ a_j (z_j − m_b)_axis)²``

    with ``g_b²`` from the density contrasts with the neighbouring buckets in the grid
    (:func:`_bucket_slopes_squared`, noise-corrected) and ``σ_b²`` the larger of the Poisson
    variance ``max(ŝ_b/|b|, 0)`` and, on 1-D domains, the roughness of the neighbourhood around
    its local trend (:func:`_bucket_roughness`): real histograms vary between neighbouring cells far more than
    Poisson, and single-cell intervals built on Poisson alone under-cover on them.  Buckets' terms
    are added (slopes of different buckets taken as independent).  The assumption still fails for
    a spike inside a bucket whose neighbourhood is smooth; ``benchmarks/dawa_coverage_bench.py``
    measures the coverage on real histograms.
    A bucket with no neighbour (``k = 1``) has no slope estimate: queries that cut it get
    ``bias_variance = NaN`` (noise-only, publish no interval).

    ``noise_variance`` is the variance of one unit-weight draw (``2·scale²`` for Laplace);
    ``coordinates`` gives each cell's grid coordinates (:func:`cell_coordinates`; default: the 1-D
    position).  O(k³ + m·k + P log P) time for m queries of P pieces, O(k² + chunk) memory.

    References
    ----------
    Li thesis Prop. 6.1 (approximation + perturbation error of uniform expansion), eq. (6.1).
    """
    partition = strategy.partition
    if workload.n_cells != partition.n_cells:
        raise ValueError(
            f"workload has {workload.n_cells} cells but the partition covers {partition.n_cells}"
        )
    estimates = np.asarray(bucket_estimates, dtype=np.float64)
    if estimates.shape != (partition.n_buckets,) or not np.all(np.isfinite(estimates)):
        raise ValueError(
            f"bucket_estimates (shape {estimates.shape}) must be {partition.n_buckets} finite values"
        )
    coords = (
        np.arange(partition.n_cells, dtype=np.int64)[:, None]
        if coordinates is None
        else np.asarray(coordinates)
    )
    if (
        coords.ndim != 2
        or coords.shape[0] != partition.n_cells
        or not np.issubdtype(coords.dtype, np.integer)
        or np.any(coords < 0)
    ):
        raise ValueError(
            f"coordinates (shape {coords.shape}) must be non-negative integers, one row per cell "
            f"({partition.n_cells})"
        )
    covariance = bucket_covariance(strategy, noise_variance=noise_variance)
    sizes = partition.sizes.astype(np.float64)
    densities = estimates / sizes
    density_covariance = covariance / np.outer(sizes, sizes)
    slopes, centroids, estimable = _bucket_slopes_squared(
        partition, densities, density_covariance, coords
    )
    # Roughness is estimated on 1-D partitions only: along a grid axis of an n-D table the residual
    # from a linear trend mostly measures the other axes' categories, not cell-level variation.
    roughness = (
        _bucket_roughness(partition, densities, density_covariance)
        if coords.shape[1] == 1
        else np.full(partition.n_buckets, np.nan)
    )
    cell_variance = np.fmax(np.maximum(densities, 0.0), roughness)

    # Bias: one term per unevenly covered (row, bucket).  O(P log P)
    row, bucket, a1, a2, coord_sum = _partial_covers(workload, partition, coords)
    spread = coord_sum - a1[:, None] * centroids[bucket]
    term = cell_variance[bucket] * (a2 - a1**2 / sizes[bucket]) + np.sum(
        slopes[bucket] * spread**2, axis=1
    )
    bias = np.bincount(row, term, workload.n_rows).astype(np.float64)  # int when nothing is cut
    cut = np.bincount(row, minlength=workload.n_rows) > 0
    bias[np.bincount(row[~estimable[bucket]], minlength=workload.n_rows) > 0] = np.nan

    # Noise and single-draw rows, a chunk of whole queries at a time.  O(nnz(Q)·k + m·k log k)
    matrix = strategy.matrix()
    inverse = covariance / noise_variance  # (AᵀA)⁻¹
    noise = np.zeros(workload.n_rows)
    single = np.zeros(workload.n_rows, dtype=bool)
    rows_per_chunk = max(1, _COVERAGE_CHUNK_ENTRIES // max(partition.n_buckets, matrix.shape[0]))
    for first_row in range(0, workload.n_rows, rows_per_chunk):
        last_row = min(first_row + rows_per_chunk, workload.n_rows)
        q = _coverage_rows(workload, partition, first_row, last_row)
        noise[first_row:last_row] = np.asarray(q.multiply(q @ covariance).sum(axis=1)).ravel()
        exact = np.flatnonzero(~cut[first_row:last_row])
        if exact.size:
            answer_rows = (matrix @ (q[exact] @ inverse).T).T  # q (AᵀA)⁻¹ Aᵀ
            single[first_row + exact] = single_term_rows(answer_rows)
    return QueryUncertainty(noise_variance=noise, bias_variance=bias, single_laplace_term=single)


# --------------------------------------------------------------------------------------------------
# The whole algorithm


def split_budget(epsilon: float, *, ratio: float = 0.25) -> tuple[float, float]:
    """``(ε₁, ε₂) = (ratio·ε, ε − ratio·ε)`` (§6.5.1 uses ratio 0.25)."""
    epsilon = check_epsilon(epsilon)
    if not (isinstance(ratio, int | float | np.floating) and 0 < ratio < 1):
        raise ValueError(f"ratio ({ratio}) must lie strictly between 0 and 1")
    partition_epsilon = ratio * epsilon
    return partition_epsilon, epsilon - partition_epsilon


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
