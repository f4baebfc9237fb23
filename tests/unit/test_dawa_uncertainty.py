"""DAWA's per-query uncertainty (mechanisms/dawa/partition.py) and the interval quantiles (mechanisms/primitives/intervals.py).

Every fast path of :func:`query_uncertainty` (sparse coverage rows, cut detection from piece ends,
grid-edge slope samples, prefix sums of coordinates) is checked against a dense, brute-force
evaluation of the same formulas on small 1-D and 2-D problems.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from dprelease.mechanisms.dawa.greedy_h import HierarchicalStrategy, greedy_h_strategy
from dprelease.mechanisms.dawa.hilbert import HilbertLayout
from dprelease.mechanisms.dawa.partition import IntervalWorkload, Partition
from dprelease.mechanisms.dawa.uncertainty import (
    QueryUncertainty,
    bucket_covariance,
    cell_coordinates,
    query_uncertainty,
)
from dprelease.mechanisms.primitives.intervals import (
    interval_half_widths,
    kron_single_term_rows,
    laplace_quantile,
    normal_quantile,
    single_term_rows,
)
from dprelease.mechanisms.primitives.operators import Identity, Prefix, Total
from dprelease.mechanisms.primitives.strategies import (
    hierarchical_strategy,
    identity_strategy,
    total_strategy,
)
from tests.reference.dawa import answer, matrix_workload, query_matrix, ranges_workload
from tests.unit.test_dawa import dense_strategy_matrix

NOISE_VARIANCE = 2.0 * 1.7**2


def expansion(partition: Partition) -> np.ndarray:
    """``E`` (n × k): ``x̂ = E ŝ`` (uniform expansion)."""
    e = np.zeros((partition.n_cells, partition.n_buckets))
    e[np.arange(partition.n_cells), partition.bucket_of_cell()] = 1.0 / np.repeat(
        partition.sizes, partition.sizes
    )
    return e


def brute_force(
    workload: IntervalWorkload,
    strategy: HierarchicalStrategy,
    estimates: np.ndarray,
    coords: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documented formulas, evaluated cell by cell with dense matrices."""
    partition = strategy.partition
    k = partition.n_buckets
    w = query_matrix(workload).toarray()
    a = dense_strategy_matrix(strategy)
    inverse = np.linalg.inv(a.T @ a)
    q = w @ expansion(partition)
    noise = NOISE_VARIANCE * np.einsum("ij,jk,ik->i", q, inverse, q)
    sizes = partition.sizes.astype(float)
    bucket = partition.bucket_of_cell()
    d = estimates / sizes
    cov_d = NOISE_VARIANCE * inverse / np.outer(sizes, sizes)
    centroid = np.array([coords[bucket == b].mean(axis=0) for b in range(k)])
    n_axes = coords.shape[1]
    samples: list[list[list[float]]] = [[[] for _ in range(n_axes)] for _ in range(k)]
    for i, j in itertools.combinations(range(partition.n_cells), 2):
        step = np.abs(coords[i] - coords[j])
        if step.sum() != 1 or bucket[i] == bucket[j]:
            continue
        axis = int(np.argmax(step))
        b, c = bucket[i], bucket[j]
        contrast = (d[c] - d[b]) ** 2 - (cov_d[b, b] + cov_d[c, c] - 2 * cov_d[b, c])
        distance = max(abs(centroid[c, axis] - centroid[b, axis]), 1.0)
        for own in (b, c):
            samples[own][axis].append(max(contrast, 0.0) / distance**2)
    roughness = brute_force_roughness(partition, d, cov_d) if n_axes == 1 else np.full(k, np.nan)
    bias = np.zeros(workload.n_rows)
    for row in range(workload.n_rows):
        for b in range(k):
            weights = w[row, bucket == b]
            size = weights.size
            if weights.sum() ** 2 >= size * (weights**2).sum() * (1 - 1e-12):
                continue  # evenly covered: no bias
            per_axis = [np.mean(s) if s else None for s in samples[b]]
            known = [v for v in per_axis if v is not None]
            if not known:
                bias[row] = np.nan
                continue
            slopes = np.array([np.mean(known) if v is None else v for v in per_axis])
            spread = weights @ (coords[bucket == b] - centroid[b])
            rough = roughness[b] if np.isfinite(roughness[b]) else 0.0  # NaN: Poisson only
            cell_variance = max(d[b], 0.0, rough)
            bias[row] += cell_variance * ((weights**2).sum() - weights.sum() ** 2 / size) + float(
                slopes @ spread**2
            )
    answers = q @ inverse @ a.T
    exact = np.isfinite(bias) & (bias == 0) & ~_cut_rows(w, partition)
    single = exact & single_term_rows(answers)
    return noise, bias, single


def brute_force_roughness(partition: Partition, d: np.ndarray, cov_d: np.ndarray) -> np.ndarray:
    """Cell variance around the local trend (1-D), one bucket and one window at a time."""
    k, window = partition.n_buckets, 8
    sizes = partition.sizes.astype(float)
    centroid = np.array(
        [
            np.mean(np.arange(lo, lo + size))
            for lo, size in zip(partition.starts, sizes, strict=True)
        ]
    )
    level = np.maximum(d, 1.0)
    dispersion = np.full(k, np.nan)
    for b in range(1, k - 1):
        lr = np.array([b - 1, b + 1])
        w = np.array([centroid[b + 1] - centroid[b], centroid[b] - centroid[b - 1]])
        w /= centroid[b + 1] - centroid[b - 1]
        combination = np.zeros(k)
        combination[b], combination[lr] = 1.0, -w
        residual = combination @ d
        noise = combination @ cov_d @ combination
        spread = 1 / sizes[b] + float(w**2 @ (1 / sizes[lr]))
        dispersion[b] = (residual**2 - noise) / spread / level[b]
    if k < 3:
        return np.full(k, np.nan)
    chi2_90 = scipy.stats.chi2.ppf(0.9, 1)
    return np.array(
        [
            level[b]
            * max(np.nanquantile(dispersion[max(b - window, 0) : b + window + 1], 0.9), 0.0)
            / chi2_90
            for b in range(k)
        ]
    )


def _cut_rows(w: np.ndarray, partition: Partition) -> np.ndarray:
    bucket = partition.bucket_of_cell()
    cut = np.zeros(w.shape[0], dtype=bool)
    for b in range(partition.n_buckets):
        block = w[:, bucket == b]
        cut |= np.ptp(block, axis=1) > 0
    return cut


def random_workload(rng: np.random.Generator, n: int, rows: int) -> IntervalWorkload:
    matrix = np.zeros((rows, n))
    for row in range(rows):
        for _ in range(rng.integers(1, 4)):
            lo = rng.integers(0, n)
            hi = rng.integers(lo, min(n, lo + 6))
            matrix[row, lo : hi + 1] = rng.choice([1.0, 1.0, 2.0, -0.5])
    return matrix_workload(matrix)


def check_against_brute_force(
    workload: IntervalWorkload, partition: Partition, estimates: np.ndarray, coords: np.ndarray
) -> QueryUncertainty:
    strategy = greedy_h_strategy(workload, partition)
    result = query_uncertainty(
        workload, strategy, estimates, noise_variance=NOISE_VARIANCE, coordinates=coords
    )
    noise, bias, single = brute_force(workload, strategy, estimates, coords)
    np.testing.assert_allclose(result.noise_variance, noise, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(result.bias_variance, bias, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(result.single_laplace_term, single)
    return result


def test_strategy_matrix_is_the_dense_measurement_matrix() -> None:
    partition = Partition.from_starts([0, 2, 3, 7, 9], n_cells=12)
    workload = ranges_workload([0, 1, 4], [5, 10, 11], n_cells=12)
    strategy = greedy_h_strategy(workload, partition)
    np.testing.assert_array_equal(strategy.matrix().toarray(), dense_strategy_matrix(strategy))
    a = dense_strategy_matrix(strategy)
    np.testing.assert_allclose(
        bucket_covariance(strategy, noise_variance=3.0), 3.0 * np.linalg.inv(a.T @ a), rtol=1e-10
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_dimensional_uncertainty_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)  # public randomness: test problem
    n = 23
    starts = np.sort(rng.choice(np.arange(1, n), size=6, replace=False))
    partition = Partition.from_starts(np.r_[0, starts], n_cells=n)
    workload = random_workload(rng, n, 30)
    estimates = rng.normal(20.0, 15.0, partition.n_buckets)  # some negative densities
    result = check_against_brute_force(workload, partition, estimates, cell_coordinates((n,)))
    assert np.all(result.bias_estimated)
    assert np.any(result.bias_variance > 0)


def test_two_dimensional_uncertainty_matches_brute_force() -> None:
    rng = np.random.default_rng(7)  # public randomness: test problem
    layout = HilbertLayout.for_shape((5, 6), keep_padding=False)
    n = 30
    partition = Partition.from_starts([0, 3, 4, 8, 16, 17, 25], n_cells=n)
    r0, c0 = rng.integers(0, 5, 12), rng.integers(0, 6, 12)
    r1, c1 = np.minimum(r0 + rng.integers(0, 3, 12), 4), np.minimum(c0 + rng.integers(0, 4, 12), 5)
    query, lo, hi = layout.rectangle_pieces(r0, r1, c0, c1)
    cells = np.arange(n)
    workload = IntervalWorkload(
        n_cells=n,
        n_rows=12 + n,
        row=np.r_[query, 12 + cells],
        lo=np.r_[lo, cells],
        hi=np.r_[hi, cells],
        weight=np.ones(query.size + n),
    )
    estimates = rng.uniform(0.0, 60.0, partition.n_buckets)
    coords = cell_coordinates((5, 6), layout.cell_at)
    result = check_against_brute_force(workload, partition, estimates, coords)
    assert np.all(result.bias_estimated)


def test_whole_bucket_queries_have_no_bias_and_a_single_bucket_gives_noise_only() -> None:
    partition = Partition.from_starts([0], n_cells=8)  # k = 1: no neighbour, no slope
    workload = ranges_workload([0, 2, 0], [7, 3, 0], n_cells=8)
    strategy = greedy_h_strategy(workload, partition)
    result = query_uncertainty(workload, strategy, np.array([40.0]), noise_variance=2.0)
    assert result.bias_variance[0] == 0.0  # the total: a union of whole buckets
    assert np.isnan(result.bias_variance[1:]).all()  # cut the only bucket: not estimable
    np.testing.assert_array_equal(result.bias_estimated, [True, False, False])
    np.testing.assert_allclose(result.std_error, np.sqrt(result.noise_variance))
    assert result.single_laplace_term[0]  # one leaf, one Laplace draw


def test_identity_workload_on_singletons_is_one_laplace_draw_per_cell() -> None:
    n = 9
    partition = Partition.singletons(n)
    workload = ranges_workload(np.r_[np.arange(n), 0], np.r_[np.arange(n), 1], n_cells=n)
    strategy = greedy_h_strategy(workload, partition)
    result = query_uncertainty(workload, strategy, np.full(n, 5.0), noise_variance=2.0)
    np.testing.assert_array_equal(result.single_laplace_term, [True] * n + [False])
    np.testing.assert_array_equal(result.bias_variance, np.zeros(n + 1))


def test_linear_trend_bias_matches_the_exact_bias_of_a_noise_free_linear_density() -> None:
    # Densities that rise by 2 per cell everywhere: the neighbour contrasts give g² = 4 exactly, so
    # the trend term of a query that cuts one bucket is the exact squared bias of uniform expansion
    # (plus the Poisson term λ·c(L − c)/L for c of the bucket's L = 4 cells).
    n = 16
    partition = Partition.from_starts([0, 4, 8, 12], n_cells=n)
    x = 100.0 + 2.0 * np.arange(n)
    workload = ranges_workload([0, 5, 9], [2, 15, 9], n_cells=n)
    strategy = greedy_h_strategy(workload, partition)
    estimates = partition.bucket_totals(x)
    result = query_uncertainty(workload, strategy, estimates, noise_variance=1e-12)
    exact_bias = answer(workload, partition.expand(estimates)) - answer(workload, x)
    cut_bucket, covered = np.array([0, 1, 2]), np.array([3, 3, 1])
    poisson = estimates[cut_bucket] / 4 * covered * (4 - covered) / 4
    assert np.all(exact_bias != 0)
    np.testing.assert_allclose(result.bias_variance, exact_bias**2 + poisson, rtol=1e-6)


def test_roughness_around_the_local_trend_widens_cut_cells_beyond_poisson() -> None:
    # Densities alternate 10, 50, 10, … over buckets of 2 cells: an interior bucket's residual from
    # the trend through its neighbours is ±40, so its σ² sample is 40² / (1/2 + ¼·½ + ¼·½) and its
    # dispersion that over its density.  The window (all 6 samples here) holds three dispersions
    # of each kind; its 0.9 quantile is the larger, and bucket 3 (density 50) takes 50 times it
    # over the 0.9 quantile of χ²₁.
    n = 16
    partition = Partition.from_starts(np.arange(0, n, 2), n_cells=n)
    densities = np.tile([10.0, 50.0], 4)
    workload = ranges_workload([6], [6], n_cells=n)  # one cell of bucket 3
    strategy = greedy_h_strategy(workload, partition)
    result = query_uncertainty(workload, strategy, 2.0 * densities, noise_variance=1e-12)
    sample = 40.0**2 / (1 / 2 + 1 / 8 + 1 / 8)
    roughness = 50.0 * (sample / 10.0) / scipy.stats.chi2.ppf(0.9, 1)
    slope_squared = 40.0**2 / 2.0**2  # contrast over the 2-cell distance between centroids
    uneven = 1.0 - 1.0 / 2.0  # Σa² − (Σa)²/|b| for one of the bucket's two cells
    expected = roughness * uneven + slope_squared * 0.5**2
    np.testing.assert_allclose(result.bias_variance, [expected], rtol=1e-6)
    assert expected > 10 * (50.0 * uneven + slope_squared * 0.5**2)  # Poisson alone: far less


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda w, s: query_uncertainty(w, s, np.ones(2), noise_variance=1.0),
            r"bucket_estimates \(shape \(2,\)\) must be 3 finite values",
        ),
        (
            lambda w, s: query_uncertainty(w, s, np.array([1.0, np.nan, 2.0]), noise_variance=1.0),
            "must be 3 finite values",
        ),
        (
            lambda w, s: query_uncertainty(w, s, np.ones(3), noise_variance=0.0),
            r"noise_variance \(0.0\) must be finite and > 0",
        ),
        (
            lambda w, s: query_uncertainty(
                w, s, np.ones(3), noise_variance=1.0, coordinates=np.zeros((5, 1), dtype=int)
            ),
            r"coordinates \(shape \(5, 1\)\) must be non-negative integers, one row per cell \(6\)",
        ),
        (
            lambda w, s: query_uncertainty(
                w, s, np.ones(3), noise_variance=1.0, coordinates=np.full((6, 1), 0.5)
            ),
            "must be non-negative integers",
        ),
        (
            lambda w, s: query_uncertainty(
                ranges_workload([0], [3], n_cells=7), s, np.ones(3), noise_variance=1.0
            ),
            "workload has 7 cells but the partition covers 6",
        ),
        (lambda w, s: cell_coordinates((0, 3)), r"shape \(\(0, 3\)\) must be one or more positive"),
        (
            lambda w, s: cell_coordinates((2, 3), np.array([0, 6])),
            r"cell_at must be 1-D row-major indices into a grid of shape \(2, 3\)",
        ),
    ],
)
def test_invalid_inputs_are_refused(call, message: str) -> None:
    workload = ranges_workload([0, 2], [3, 5], n_cells=6)
    strategy = greedy_h_strategy(workload, Partition.from_starts([0, 2, 4], n_cells=6))
    with pytest.raises(ValueError, match=message):
        call(workload, strategy)


# --------------------------------------------------------------------------------------------------
# Interval quantiles


def test_quantiles() -> None:
    assert normal_quantile(0.95) == pytest.approx(1.959963984540054, abs=1e-12)
    # One Laplace(b) draw: P(|L| > b·ln 20) = 1/20, and σ = √2·b.
    assert laplace_quantile(0.95) * math.sqrt(2) == pytest.approx(math.log(20.0), abs=1e-12)
    widths = interval_half_widths(
        np.array([1.0, 2.0, 3.0]), interval=np.array(["laplace", "normal", "none"])
    )
    np.testing.assert_allclose(widths, [math.log(20) / math.sqrt(2), 2 * 1.959963984540054, np.nan])
    assert interval_half_widths(np.array([3.0]), interval="normal")[0] == pytest.approx(
        3 * 1.959963984540054
    )


@pytest.mark.parametrize("level", [0.0, 1.0, 1.5, -0.1])
def test_interval_level_must_lie_in_the_open_unit_interval(level: float) -> None:
    with pytest.raises(ValueError, match=rf"level \({level}\) must lie strictly between 0 and 1"):
        interval_half_widths(np.ones(2), interval="normal", level=level)


def test_interval_kinds_are_checked() -> None:
    with pytest.raises(
        ValueError, match=r"interval \(shape \(3,\)\) must be one value or one per row"
    ):
        interval_half_widths(np.ones(2), interval=np.array(["normal", "laplace", "none"]))
    with pytest.raises(ValueError, match=r"interval values \['student'\] must be one of"):
        interval_half_widths(np.ones(2), interval="student")


def test_per_row_table_values_follow_the_estimated_bias() -> None:
    result = QueryUncertainty(
        noise_variance=np.array([1.0, 2.0, 3.0]),
        bias_variance=np.array([0.0, 5.0, np.nan]),
        single_laplace_term=np.array([True, False, False]),
    )
    np.testing.assert_allclose(result.variance, [1.0, 7.0, 3.0])
    assert result.interval.tolist() == ["laplace", "normal", "none"]
    assert result.uncertainty.tolist() == ["noise+bias", "noise+bias", "noise-only"]


def test_kron_single_term_rows_match_the_dense_kronecker_answer_matrix() -> None:
    workload = [Identity(4), Prefix(3), Total(2)]
    cases = {
        "identity": [identity_strategy(4), identity_strategy(3), total_strategy(2)],
        "hierarchical": [hierarchical_strategy(4), identity_strategy(3), total_strategy(2)],
    }
    for strategy in cases.values():
        pinvs = [np.linalg.pinv(f.gram()) for f in strategy]
        w = np.asarray(
            np.kron(np.kron(workload[0].dense(), workload[1].dense()), workload[2].dense())
        )
        a = np.kron(np.kron(strategy[0].dense(), strategy[1].dense()), strategy[2].dense())
        dense = single_term_rows(w @ np.linalg.pinv(a.T @ a) @ a.T)
        np.testing.assert_array_equal(kron_single_term_rows(workload, strategy, pinvs), dense)
    flags = kron_single_term_rows(
        workload, cases["identity"], [np.linalg.pinv(f.gram()) for f in cases["identity"]]
    )
    assert flags.sum() == 4  # a cell × the first CDF value × the total: one measurement each


def test_kron_single_term_rows_needs_one_factor_per_attribute() -> None:
    with pytest.raises(ValueError, match=r"workload_factors \(1\), strategy_factors \(2\)"):
        kron_single_term_rows([Identity(2)], [identity_strategy(2)] * 2, [np.eye(2)] * 2)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_bucket_covariance_by_tree_updates_is_the_dense_inverse(seed: int) -> None:
    """Random trees (branching 2–5, carried nodes, a random λ at every other node) over 60–200
    buckets: the O(k²) nested updates equal the dense inverse."""
    rng = np.random.default_rng(seed)  # public randomness: a random tree
    k = int(rng.integers(60, 200))
    partition = Partition.from_starts(np.arange(k) * 2, n_cells=2 * k)
    levels = [np.arange(k + 1)]
    lambdas = []
    while levels[-1].size > 2:
        below = levels[-1]
        cuts = np.cumsum(rng.integers(1, 6, below.size))  # children per node; 1: carried
        bounds = below[np.concatenate(([0], cuts[cuts < below.size - 1], [below.size - 1]))]
        children = np.diff(np.searchsorted(below, bounds))
        lam = np.where(children >= 2, rng.uniform(0.0, 0.6, children.size), 0.0)
        levels.append(bounds)
        lambdas.append(lam)
    strategy = HierarchicalStrategy(
        partition=partition, level_bounds=tuple(levels), lambdas=tuple(lambdas), error_trace=0.0
    )
    assert sum(np.count_nonzero(f) for f in strategy.fractions[1:]) > k / 3
    a = dense_strategy_matrix(strategy)
    expected = 2.5 * np.linalg.inv(a.T @ a)
    np.testing.assert_allclose(
        bucket_covariance(strategy, noise_variance=2.5),
        expected,
        rtol=1e-9,
        atol=1e-12 * expected.max(),
    )
