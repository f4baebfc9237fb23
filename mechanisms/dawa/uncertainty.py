"""The error of DAWA's released answers: measurement noise plus the bias of uniform expansion,
estimated from released values only (:func:`query_uncertainty`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dprelease.mechanisms.dawa.greedy_h import HierarchicalStrategy
from dprelease.mechanisms.dawa.partition import IntervalWorkload, Partition
from dprelease.mechanisms.primitives.intervals import single_term_rows
from dprelease.mechanisms.primitives.linalg import read_only

# Rows of the per-query coverage matrix formed at once (bounds working memory to ~16 MB per chunk).
_COVERAGE_CHUNK_ENTRIES = 2_000_000
# A (row, bucket) whose weights vary by less than this (relative) is treated as evenly covered.
_EVEN_COVER_TOLERANCE = 1e-9
# Roughness (``_bucket_roughness``): buckets on each side whose dispersion samples a bucket pools,
# and the pooled quantile, read as a χ²₁ quantile (``scipy.stats.chi2.ppf(0.9, 1)``): it ignores
# the few residuals a spike or a bend inflates; lower quantiles or narrower windows under-cover
# on rough histograms (benchmarks/dawa_coverage_bench.py).
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
            object.__setattr__(self, name, read_only(getattr(self, name)))

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

    ``AᵀA = D + Σ_q f_q² 1_q 1_qᵀ`` over the tree's nodes above the leaves (``D`` the leaves'
    ``f²``, every leaf keeps a positive fraction), so nested Sherman–Morrison updates, from the
    leaves up, give ``(AᵀA)⁻¹ = D⁻¹ − Σ_q β_q w_q w_qᵀ`` with ``w_q`` the children's ``G_c⁻¹ 1``
    side by side and ``β_q = f_q² / (1 + f_q² 1ᵀw_q)``.  O(Σ_q |q|²) = O(k²) time and memory.
    """
    if not (math.isfinite(noise_variance) and noise_variance > 0):
        raise ValueError(f"noise_variance ({noise_variance}) must be finite and > 0")
    leaves = strategy.fractions[0] ** 2  # > 0: HierarchicalStrategy keeps every λ < 1
    inverse = np.diag(1.0 / leaves)
    ones_image = 1.0 / leaves  # G_c⁻¹ 1 of the current level's nodes, side by side
    for bounds, fraction in zip(strategy.level_bounds[1:], strategy.fractions[1:], strict=True):
        for lo, hi, weight in zip(bounds[:-1], bounds[1:], fraction**2, strict=True):
            if weight == 0.0:  # a carried node or an unmeasured level: G_q = blockdiag(G_c)
                continue
            w = ones_image[lo:hi]
            total = float(w.sum())
            beta = weight / (1.0 + weight * total)
            inverse[lo:hi, lo:hi] -= beta * np.outer(w, w)  # O(|q|²)
            ones_image[lo:hi] = w * (1.0 - beta * total)
    return noise_variance * inverse


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
    it a square).  A bucket's value per axis is the mean of its samples; an axis without samples
    takes the mean of the bucket's other axes.  Returns ``(slopes², centroids, estimable)``; a bucket with no neighbour at all (only when
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


def _nan_quantile_rows(rows: np.ndarray, quantile: float) -> np.ndarray:
    """``np.nanquantile(rows, quantile, axis=1)`` with its default ``"linear"`` method, the same
    numbers in one pass over all rows instead of one call per row; NaN (without a warning) for a
    row of NaNs only.

    Per row with ``n`` values (NaNs dropped) sorted as ``v``: position ``h = (n − 1)·quantile``,
    ``v[⌊h⌋] + (v[⌊h⌋+1] − v[⌊h⌋])·γ`` with ``γ = h − ⌊h⌋`` (from the upper value when
    ``γ ≥ 0.5``, as NumPy's ``_lerp``), and ``v[n − 1]`` when ``h ≥ n − 1``.
    O(rows · width log width)."""
    ordered = np.sort(rows, axis=1)  # NaNs last
    count = rows.shape[1] - np.count_nonzero(np.isnan(ordered), axis=1)
    position = (count - 1) * float(quantile)
    below = np.floor(position)
    gamma = position - below
    at_top = position >= count - 1
    last = np.maximum(count - 1, 0)
    lower_index = np.where(at_top, last, below.astype(np.int64))
    upper_index = np.where(at_top, last, lower_index + 1)
    lower = np.take_along_axis(ordered, lower_index[:, None], axis=1)[:, 0]
    upper = np.take_along_axis(ordered, upper_index[:, None], axis=1)[:, 0]
    difference = upper - lower
    value = np.where(gamma >= 0.5, upper - difference * (1.0 - gamma), lower + difference * gamma)
    return np.where(count > 0, value, np.nan)


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
    upper = _nan_quantile_rows(windows, _ROUGHNESS_QUANTILE)  # O(k·window log window)
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
    its local trend (:func:`_bucket_roughness`; real histograms are rougher than Poisson).
    Buckets' terms are added (slopes taken as independent).  The assumption fails for a spike
    inside a bucket whose neighbourhood is smooth.  A bucket with no neighbour (``k = 1``) has no
    slope estimate: queries that cut it get ``bias_variance = NaN`` (noise-only, no interval).

    ``noise_variance`` is the variance of one unit-weight draw (``2·scale²`` for Laplace);
    ``coordinates`` gives each cell's grid coordinates (:func:`cell_coordinates`; default: the 1-D
    position).  O(k³ + m·k + P log P) time for m queries of P pieces, O(k² + chunk) memory.

    References:
    Li thesis Prop. 6.1 (approximation + perturbation error of uniform expansion), eq. (6.1)."""
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
