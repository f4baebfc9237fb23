"""Deterministic tests of DAWA (mechanisms/dawa/, tests/reference/dawa.py) and the Hilbert layout (mechanisms/dawa/hilbert.py).

Test vectors T1–T10 are those of ``seed-dawa.md`` §12; every structural shortcut (wavelet-matrix
deviations, blocked dynamic program, piecewise workload norms, Sherman–Morrison recursion) is
checked against a dense or brute-force computation.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from dprelease.mechanisms.dawa.greedy_h import (
    HierarchicalStrategy,
    _BucketPieces,
    _sherman_morrison,
    greedy_h_strategy,
)
from dprelease.mechanisms.dawa.hilbert import HilbertLayout, hilbert_order
from dprelease.mechanisms.dawa.partition import (
    ALL_INTERVALS_MAX_CELLS,
    IntervalWorkload,
    Partition,
    PartitionSelector,
    split_budget,
)
from tests.reference.dawa import (
    answer,
    bucket_deviations,
    dawa,
    expected_squared_error,
    greedy_h_local_error,
    laplace_scale,
    least_cost_partition,
    matrix_workload,
    measure_and_reconstruct,
    measure_buckets,
    partition_cost,
    private_partition,
    query_cells,
    query_matrix,
    ranges_workload,
    window_deviations,
)
from tests.samplers import SeededNumpyNoise, ZeroNoise

EXAMPLE_X = np.array([2, 3, 8, 1, 0, 2, 0, 4, 2, 4], dtype=float)  # Example 6.1
EXAMPLE_PARTITION = Partition.from_starts([0, 2, 3, 7], n_cells=10)  # [1,2] [3,3] [4,7] [8,10]


class ScriptedNoise:
    """Laplace noise from a seeded generator that keeps every (input, output, scale) it produced."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.records: list[tuple[np.ndarray, np.ndarray, float]] = []

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        noisy = values + self.rng.laplace(0.0, scale, size=values.shape)
        self.records.append((values.copy(), noisy.copy(), scale))
        return noisy

    def add_gaussian(self, values: np.ndarray, *, sigma: float) -> np.ndarray:
        raise AssertionError("DAWA never draws Gaussian noise")


# --------------------------------------------------------------------------------------------------
# Dense and brute-force references


def dense_deviation(x: np.ndarray, start: int, stop: int) -> float:
    block = x[start:stop]
    return float(np.abs(block - block.mean()).sum())


def compositions(n: int, allowed: set[int]) -> list[list[int]]:
    """Every partition of n cells into consecutive buckets with lengths in ``allowed`` (as starts)."""
    out = []
    for cuts in itertools.product([False, True], repeat=n - 1):
        starts = [0] + [i + 1 for i, cut in enumerate(cuts) if cut]
        lengths = np.diff([*starts, n])
        if all(int(length) in allowed for length in lengths):
            out.append(starts)
    return out


def expansion_matrix(partition: Partition) -> np.ndarray:
    """E (n × k) with E[i, j] = 1/|b_j| for i in b_j (§6.4.1)."""
    bucket = partition.bucket_of_cell()
    matrix = np.zeros((partition.n_cells, partition.n_buckets))
    matrix[np.arange(partition.n_cells), bucket] = 1.0 / partition.sizes[bucket]
    return matrix


def dense_strategy_matrix(strategy: HierarchicalStrategy) -> np.ndarray:
    """A = diag(f)·Y over buckets, rows in the order of ``query_buckets``."""
    lo, hi, weight = strategy.query_buckets()
    matrix = np.zeros((lo.size, strategy.n_buckets))
    for row, (a, b, w) in enumerate(zip(lo, hi, weight, strict=True)):
        matrix[row, a:b] = w
    return matrix


def random_partition(rng: np.random.Generator, n: int, k: int) -> Partition:
    cuts = np.sort(rng.choice(np.arange(1, n), size=k - 1, replace=False))
    return Partition.from_starts(np.r_[0, cuts], n_cells=n)


def random_ranges(rng: np.random.Generator, n: int, m: int) -> IntervalWorkload:
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    return ranges_workload(np.minimum(a, b), np.maximum(a, b), n_cells=n)


def random_multi_piece(rng: np.random.Generator, n: int, m: int) -> IntervalWorkload:
    """Rows made of several disjoint weighted runs, plus a few scattered single cells."""
    matrix = np.zeros((m, n))
    for row in range(m):
        cuts = np.sort(rng.choice(n, size=6, replace=False))
        for lo, hi in zip(cuts[::2], cuts[1::2], strict=True):
            matrix[row, lo : hi + 1] = rng.normal()
    matrix[: m // 3] = (rng.random((m // 3, n)) < 0.15) * rng.normal(size=(m // 3, n))
    return matrix_workload(matrix)


# --------------------------------------------------------------------------------------------------
# Partitions, expansion, deviations and costs (T1–T4)


def test_uniform_expansion_matches_example_6_1() -> None:
    """T1: expand(B, s) of Example 6.1."""
    expanded = EXAMPLE_PARTITION.expand([6.3, 7.1, 3.6, 8.4])
    expected = [3.15, 3.15, 7.1, 0.9, 0.9, 0.9, 0.9, 2.8, 2.8, 2.8]
    np.testing.assert_allclose(expanded, expected, rtol=0, atol=1e-12)


def test_bucket_counts_and_deviations_match_example_6_2() -> None:
    """T2: true bucket counts (5, 8, 3, 10), deviations 1, 0, 3, 8/3, pcost 10⅔ at ε₂ = 1."""
    np.testing.assert_allclose(EXAMPLE_PARTITION.bucket_totals(EXAMPLE_X), [5, 8, 3, 10])
    deviations = bucket_deviations(EXAMPLE_X, EXAMPLE_PARTITION)
    np.testing.assert_allclose(deviations, [1, 0, 3, 8 / 3], rtol=0, atol=1e-12)
    cost = partition_cost(EXAMPLE_X, EXAMPLE_PARTITION, measurement_epsilon=1.0)
    assert cost == pytest.approx(32 / 3, abs=1e-12)


@pytest.mark.parametrize(
    ("measurement_epsilon", "expected_cost"), [(1.0, 18.2), (0.1, 27.2)], ids=["eps2=1", "eps2=0.1"]
)
def test_single_bucket_cost_matches_example_6_2(
    measurement_epsilon: float, expected_cost: float
) -> None:
    """T3: the single bucket [1, 10] has deviation 17.2."""
    single = Partition.from_starts([0], n_cells=10)
    assert bucket_deviations(EXAMPLE_X, single)[0] == pytest.approx(17.2, abs=1e-12)
    cost = partition_cost(EXAMPLE_X, single, measurement_epsilon=measurement_epsilon)
    assert cost == pytest.approx(expected_cost, abs=1e-12)


@pytest.mark.parametrize(
    ("measurement_epsilon", "expected_cost", "bucket_range"),
    [(1.0, 10.0, (6, 10)), (0.1, 27.2, (1, 1))],
    ids=["eps2=1", "eps2=0.1"],
)
def test_least_cost_partition_matches_t4(
    measurement_epsilon: float, expected_cost: float, bucket_range: tuple[int, int]
) -> None:
    """T4: the noise-free optimum over all intervals (compare costs: optima tie)."""
    best = least_cost_partition(EXAMPLE_X, measurement_epsilon=measurement_epsilon)
    cost = partition_cost(EXAMPLE_X, best, measurement_epsilon=measurement_epsilon)
    assert cost == pytest.approx(expected_cost, abs=1e-9)
    assert bucket_range[0] <= best.n_buckets <= bucket_range[1]


@pytest.mark.parametrize("intervals", ["dyadic", "all"])
@pytest.mark.parametrize("measurement_epsilon", [0.05, 0.3, 2.0], ids=["eps2=.05", ".3", "2"])
def test_least_cost_partition_matches_brute_force(
    intervals: str, measurement_epsilon: float
) -> None:
    rng = np.random.default_rng(11)
    x = rng.poisson(rng.choice([0.5, 4.0, 20.0], size=9)).astype(float)
    allowed = {1, 2, 4, 8} if intervals == "dyadic" else set(range(1, 10))
    brute = min(
        partition_cost(
            x, Partition.from_starts(s, n_cells=9), measurement_epsilon=measurement_epsilon
        )
        for s in compositions(9, allowed)
    )
    best = least_cost_partition(x, measurement_epsilon=measurement_epsilon, intervals=intervals)
    assert set(best.sizes.tolist()) <= allowed
    cost = partition_cost(x, best, measurement_epsilon=measurement_epsilon)
    assert cost == pytest.approx(brute, abs=1e-9)


DEVIATION_DATA = {
    "small-integers": np.random.default_rng(1).integers(0, 4, 75).astype(float),
    "large-counts": np.random.default_rng(2).poisson(500.0, 75).astype(float),
    "real-valued": np.random.default_rng(3).normal(size=75),
    "constant": np.full(75, 7.0),
    "sparse": np.where(np.random.default_rng(4).random(75) < 0.1, 30.0, 0.0),
}


@pytest.mark.parametrize("x", DEVIATION_DATA.values(), ids=DEVIATION_DATA.keys())
@pytest.mark.parametrize("length", [1, 2, 7, 16, 17, 32, 50, 75])
def test_window_deviations_match_dense(x: np.ndarray, length: int) -> None:
    """Lengths <= 16 use direct sums, longer ones the wavelet matrix; both equal eq. (6.2)."""
    expected = [dense_deviation(x, i, i + length) for i in range(x.size - length + 1)]
    np.testing.assert_allclose(window_deviations(x, length=length), expected, rtol=0, atol=1e-9)


# --------------------------------------------------------------------------------------------------
# Step 1: private partition (Program 6.3.1)


def noisy_costs_from(records: list, n: int) -> dict[int, np.ndarray]:
    """Length -> noisy cost of every window, read back from a ScriptedNoise."""
    return {n - values.size + 1: noisy for values, noisy, _scale in records}


@pytest.mark.parametrize("intervals", ["dyadic", "all"])
@pytest.mark.parametrize("noise_offset", [0.0, 1.5], ids=["offset=0", "offset=1.5"])
def test_private_partition_is_the_argmin_of_the_noisy_costs(
    intervals: str, noise_offset: float
) -> None:
    """The released partition minimises Σ noisy bcost (plus offset) over all partitions."""
    x = np.array([0, 0, 5, 6, 5, 0, 1, 9, 9], dtype=float)
    sampler = ScriptedNoise(seed=5)
    selector = PartitionSelector(
        epsilon=1.0, measurement_epsilon=0.5, intervals=intervals, noise_offset=noise_offset
    )
    chosen = selector.select(x, sampler=sampler)
    costs = {}
    for values, noisy, scale in sampler.records:  # the sampler saw dev + 1/ε₂ for every window
        length = 9 - values.size + 1
        exact = [dense_deviation(x, i, i + length) + 2.0 for i in range(values.size)]
        np.testing.assert_allclose(values, exact, atol=1e-12)
        costs[length] = noisy + noise_offset * scale

    def total(starts: list[int]) -> float:
        bounds = [*starts, 9]
        return sum(costs[b - a][a] for a, b in itertools.pairwise(bounds))

    allowed = set(costs)
    best = min(compositions(9, allowed), key=total)
    np.testing.assert_array_equal(chosen.starts, best)


def reference_dyadic_dp(costs: dict[int, np.ndarray], n: int) -> list[int]:
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    last = np.zeros(n + 1, dtype=int)
    for end in range(1, n + 1):
        for length in sorted(costs):
            if length <= end and best[end - length] + costs[length][end - length] < best[end]:
                best[end] = best[end - length] + costs[length][end - length]
                last[end] = length
    starts, end = [], n
    while end:
        end -= last[end]
        starts.append(end)
    return starts[::-1]


@pytest.mark.parametrize("n", [63, 64, 65, 300], ids=lambda n: f"n={n}")
def test_blocked_dyadic_dp_matches_plain_dp(n: int) -> None:
    """The blocked DP (vectorised long lengths, sequential short ones) equals the plain recurrence."""
    x = np.random.default_rng(n).poisson(3.0, n).astype(float)
    sampler = ScriptedNoise(seed=n)
    chosen = private_partition(x, epsilon=0.5, measurement_epsilon=1.0, sampler=sampler)
    expected = reference_dyadic_dp(noisy_costs_from(sampler.records, n), n)
    np.testing.assert_array_equal(chosen.starts, expected)


class ForcingNoise(ScriptedNoise):
    """Seeded Laplace noise, except that chosen windows (length, start) get a cost of −10⁴."""

    def __init__(self, seed: int, forced: list[tuple[int, int]], n: int) -> None:
        super().__init__(seed)
        self.forced, self.n = forced, n

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        noisy = super().add_laplace(values, scale=scale)
        length = self.n - noisy.size + 1
        for forced_length, start in self.forced:
            if forced_length == length:
                noisy[start] = -1e4
        self.records[-1] = (self.records[-1][0], noisy.copy(), scale)
        return noisy


def test_blocked_dyadic_dp_reads_buckets_that_end_at_a_block_start() -> None:
    """Buckets of every short length whose end is the first end of a DP block (65, 129, …)."""
    n = 450
    forced = [(32, 33), (16, 113), (8, 185), (4, 253), (2, 319), (1, 384)]
    sampler = ForcingNoise(seed=3, forced=forced, n=n)
    chosen = private_partition(np.zeros(n), epsilon=1.0, measurement_epsilon=1.0, sampler=sampler)
    expected = reference_dyadic_dp(noisy_costs_from(sampler.records, n), n)
    np.testing.assert_array_equal(chosen.starts, expected)
    assert {start for _length, start in forced} <= set(chosen.starts.tolist())


@pytest.mark.parametrize(
    ("n", "intervals", "expected"),
    [(3, "dyadic", [0, 2]), (96, "dyadic", [0, 64]), (3, "all", [0]), (96, "all", [0])],
    ids=["n3-dyadic", "n96-dyadic", "n3-all", "n96-all"],
)
def test_noise_free_ties_go_to_the_shortest_last_bucket(
    n: int, intervals: str, expected: list[int]
) -> None:
    """Zero data: every two-bucket dyadic split ties ([2, 1] vs [1, 2], [64, 32] vs [32, 64]);
    the shorter last bucket wins.  With all intervals the single bucket is optimal."""
    chosen = least_cost_partition(np.zeros(n), measurement_epsilon=1.0, intervals=intervals)
    np.testing.assert_array_equal(chosen.starts, expected)


@pytest.mark.parametrize(
    ("n", "intervals", "scale_rule", "bound"),
    [
        (10, "dyadic", "per_interval", 1),
        (13, "dyadic", "per_interval", 1),
        (13, "dyadic", "uniform", 1),
        (13, "all", "per_interval", 1),
        (13, "all", "uniform", 3),
        (16, "dyadic", "per_interval", 2),
    ],
    ids=[
        "n10-dyadic",
        "n13-dyadic",
        "n13-dyadic-uniform",
        "n13-all",
        "n13-all-uniform-c3",
        "n16-c2",
    ],
)
def test_step1_noise_scale_per_interval_length(
    n: int, intervals: str, scale_rule: str, bound: int
) -> None:
    """T10 (Step 1): scale (Δ̄ + Δ_b)·c/ε₁ or 2Δ̄·c/ε₁ with Δ_b = 2 − 2/|b|, Δ̄ = 2 − 2/L_max."""
    epsilon = 0.2
    sampler = ZeroNoise()
    private_partition(
        np.arange(n, dtype=float),
        epsilon=epsilon,
        measurement_epsilon=0.6,
        sampler=sampler,
        intervals=intervals,
        scale_rule=scale_rule,
        contribution_bound=bound,
    )
    lengths = [n - size + 1 for _kind, size, _scale in sampler.calls]
    expected_lengths = (
        list(range(1, n + 1)) if intervals == "all" else [2**k for k in range(n.bit_length())]
    )
    assert lengths == expected_lengths  # one draw per candidate interval, every offset
    max_sensitivity = 2 - 2 / expected_lengths[-1]
    for (kind, _size, scale), length in zip(sampler.calls, lengths, strict=True):
        own = 2 - 2 / length if scale_rule == "per_interval" else max_sensitivity
        assert kind == "laplace"
        assert scale == pytest.approx((max_sensitivity + own) * bound / epsilon, rel=1e-12)


def test_single_cell_partition_draws_no_noise() -> None:
    sampler = ZeroNoise()
    chosen = private_partition(np.array([4.0]), epsilon=1, measurement_epsilon=1, sampler=sampler)
    np.testing.assert_array_equal(chosen.boundaries, [0, 1])
    assert sampler.calls == []


def test_selector_is_callable_positionally_like_a_session_selector() -> None:
    selector = PartitionSelector(epsilon=1.0, measurement_epsilon=3.0)
    by_call = selector(EXAMPLE_X, ZeroNoise())
    by_select = selector.select(EXAMPLE_X, sampler=ZeroNoise())
    np.testing.assert_array_equal(by_call.boundaries, by_select.boundaries)


# --------------------------------------------------------------------------------------------------
# Step 2: workload reduction, GreedyH, measurement, least squares (T6, T7, T10)


@pytest.mark.parametrize("kind", ["ranges", "multi-piece"])
def test_node_squared_norms_match_dense_reduced_workload(kind: str) -> None:
    """‖Ŵ[:, q] u[q]‖² from pieces equals the dense Ŵ = W·E computation (Prop. 6.2)."""
    rng = np.random.default_rng(21)
    n, partition = 57, random_partition(rng, 57, 20)
    workload = random_ranges(rng, n, 40) if kind == "ranges" else random_multi_piece(rng, n, 30)
    reduced = query_matrix(workload).toarray() @ expansion_matrix(partition)
    pieces = _BucketPieces(workload, partition)
    u = rng.normal(size=partition.n_buckets)
    for bounds in ([*range(21)], [0, 3, 4, 10, 20], [0, 20], [0, 1, 19, 20]):
        bounds = np.asarray(bounds)
        expected = [np.sum((reduced[:, a:b] @ u[a:b]) ** 2) for a, b in itertools.pairwise(bounds)]
        np.testing.assert_allclose(pieces.node_sq_norms(u, bounds), expected, rtol=1e-12)


def test_local_error_6_11_equals_direct_trace_of_6_10() -> None:
    """T6: (6.11) and the Sherman–Morrison inverse equal the dense computation."""
    rng = np.random.default_rng(6)
    sizes = (3, 4)
    blocks = []
    for size in sizes:
        root = rng.normal(size=(size, size))
        blocks.append(root @ root.T + size * np.eye(size))  # SPD M_i
    inverses = [np.linalg.inv(block) for block in blocks]
    block_inverse = np.zeros((7, 7))
    block_inverse[:3, :3], block_inverse[3:, 3:] = inverses
    workload = rng.normal(size=(9, 7))
    gram = workload.T @ workload
    children_gram = np.zeros_like(gram)
    children_gram[:3, :3], children_gram[3:, 3:] = gram[:3, :3], gram[3:, 3:]
    u = block_inverse @ np.ones(7)
    d = float(np.ones(7) @ u)
    e = float(np.trace(gram @ block_inverse))
    a = float(u @ gram @ u)
    a_prime = float(u[:3] @ gram[:3, :3] @ u[:3] + u[3:] @ gram[3:, 3:] @ u[3:])
    for lam, mu in [(0.3, 0.7), (0.0, 0.5), (0.95, 1.0), (0.5, 0.0)]:
        m_q = np.zeros((7, 7))
        m_q[:3, :3], m_q[3:, 3:] = blocks
        m_q = (1 - lam) ** 2 * m_q + lam**2 * np.ones((7, 7))
        direct_inverse = np.linalg.inv(m_q)
        c, g = _sherman_morrison(np.array(lam), np.array(d))
        np.testing.assert_allclose(
            (block_inverse - c * np.outer(u, u)) / (1 - lam) ** 2, direct_inverse, atol=1e-12
        )
        np.testing.assert_allclose(g * u, direct_inverse @ np.ones(7), atol=1e-12)
        direct = np.trace((mu * gram + (1 - mu) * children_gram) @ direct_inverse)
        formula = greedy_h_local_error(lam, e=e, a=a, a_prime=a_prime, d=d, mu=mu)
        assert float(formula) == pytest.approx(direct, rel=1e-10)


@pytest.mark.parametrize("branching", [2, 3, 4])
@pytest.mark.parametrize("kind", ["ranges", "multi-piece"])
def test_greedy_h_error_trace_and_least_squares_match_dense(branching: int, kind: str) -> None:
    rng = np.random.default_rng(branching)
    n, partition = 61, random_partition(rng, 61, 23)
    workload = random_ranges(rng, n, 80) if kind == "ranges" else random_multi_piece(rng, n, 30)
    strategy = greedy_h_strategy(workload, partition, branching=branching)
    reduced = query_matrix(workload).toarray() @ expansion_matrix(partition)
    matrix = dense_strategy_matrix(strategy)
    gram_inverse = np.linalg.inv(matrix.T @ matrix)
    assert strategy.error_trace == pytest.approx(np.trace(reduced.T @ reduced @ gram_inverse))
    noisy = rng.normal(size=strategy.num_queries)
    expected, *_ = np.linalg.lstsq(matrix, noisy, rcond=None)
    np.testing.assert_allclose(strategy.least_squares(noisy), expected, atol=1e-10)
    assert expected_squared_error(strategy, epsilon=0.5) == pytest.approx(
        2 * (strategy.sensitivity() / 0.5) ** 2 * np.trace(reduced.T @ reduced @ gram_inverse)
    )
    bucket_counts = rng.normal(size=partition.n_buckets)
    np.testing.assert_allclose(strategy.answer_buckets(bucket_counts), matrix @ bucket_counts)


def node_containing(strategy: HierarchicalStrategy, level: int, bucket: int) -> int:
    return int(np.searchsorted(strategy.level_bounds[level], bucket, side="right") - 1)


def is_query(strategy: HierarchicalStrategy, level: int, node: int) -> bool:
    bounds, below = strategy.level_bounds[level], strategy.level_bounds[level - 1]
    return np.count_nonzero((below >= bounds[node]) & (below < bounds[node + 1])) >= 2


def children_gram(strategy: HierarchicalStrategy, level: int, node: int) -> np.ndarray:
    """blkdiag(M_children) of node q in local units (the budget reaching the children is 1)."""
    start, stop = strategy.level_bounds[level][node], strategy.level_bounds[level][node + 1]
    below_q = sum(
        strategy.fractions[lower][node_containing(strategy, lower, start)] for lower in range(level)
    )
    gram = np.zeros((stop - start, stop - start))
    for lower in range(level):
        bounds = strategy.level_bounds[lower]
        for i in range(bounds.size - 1):
            a, b = bounds[i] - start, bounds[i + 1] - start
            if a >= 0 and b <= stop - start:
                gram[a:b, a:b] += (strategy.fractions[lower][i] / below_q) ** 2
    return gram


def test_greedy_h_lambdas_minimise_the_dense_local_objective() -> None:
    """Each λ_q minimises (6.10) computed densely from the children's M (μ = 2^{−depth/2})."""
    rng = np.random.default_rng(8)
    n, partition = 96, random_partition(rng, 96, 32)
    # Long ranges make upper nodes worth measuring, so some λ > 0.
    lo, hi = rng.integers(0, n // 4, 300), rng.integers(3 * n // 4, n, 300)
    workload = ranges_workload(lo, hi, n_cells=n)
    strategy = greedy_h_strategy(workload, partition)
    reduced = query_matrix(workload).toarray() @ expansion_matrix(partition)
    gram = reduced.T @ reduced
    top = len(strategy.level_bounds) - 1
    grid = np.linspace(0, 0.99, 991)
    checked = 0
    for level in range(1, top + 1):
        bounds = strategy.level_bounds[level]
        for node in range(bounds.size - 1):
            start, stop = bounds[node], bounds[node + 1]
            if not is_query(strategy, level, node):
                assert strategy.lambdas[level - 1][node] == 0
                continue
            depth = sum(
                is_query(strategy, upper, node_containing(strategy, upper, start))
                for upper in range(level + 1, top + 1)
            )
            block = children_gram(strategy, level, node)
            local_gram = gram[start:stop, start:stop]
            below = strategy.level_bounds[level - 1]
            children = below[(below >= start) & (below <= stop)] - start
            same_child = np.zeros_like(local_gram, dtype=bool)
            for a, b in itertools.pairwise(children):
                same_child[a:b, a:b] = True
            mixed_children = np.where(same_child, local_gram, 0.0)
            mu = 2.0 ** (-depth / 2)
            mixed = mu * local_gram + (1 - mu) * mixed_children
            ones = np.ones((stop - start, stop - start))

            def objective(lam: float, block=block, ones=ones, mixed=mixed) -> float:
                return float(
                    np.trace(mixed @ np.linalg.inv((1 - lam) ** 2 * block + lam**2 * ones))
                )

            chosen = objective(float(strategy.lambdas[level - 1][node]))
            assert chosen <= min(objective(lam) for lam in grid) * (1 + 1e-9)
            checked += 1
    assert checked >= 20 and sum(np.count_nonzero(lam) for lam in strategy.lambdas) >= 2


def test_greedy_h_on_identity_workload_keeps_all_budget_on_the_leaves() -> None:
    """T7: for the identity workload every λ is 0 (Step 2 is the Laplace mechanism on buckets)."""
    rng = np.random.default_rng(3)
    partition = random_partition(rng, 200, 77)
    identity = ranges_workload(np.arange(200), np.arange(200), n_cells=200)
    strategy = greedy_h_strategy(identity, partition)
    assert all(np.all(lam == 0) for lam in strategy.lambdas)
    np.testing.assert_array_equal(strategy.fractions[0], np.ones(77))
    assert strategy.num_queries == 77


@pytest.mark.parametrize("branching", [2, 3, 5])
@pytest.mark.parametrize("n_buckets", [1, 2, 5, 64, 100])
def test_every_leaf_to_root_path_spends_exactly_epsilon2(branching: int, n_buckets: int) -> None:
    """T10 (Step 2): Σ_path f_q = 1, so Δ(A) = 1 and the measurement is ε₂-DP (eq. 6.6)."""
    rng = np.random.default_rng(n_buckets)
    n = 3 * n_buckets
    if n_buckets == 1:
        partition = Partition.from_starts([0], n_cells=n)
    else:
        partition = random_partition(rng, n, n_buckets)
    strategy = greedy_h_strategy(random_ranges(rng, n, 50), partition, branching=branching)
    column_sums = np.abs(dense_strategy_matrix(strategy)).sum(axis=0)
    np.testing.assert_allclose(column_sums, 1.0, rtol=0, atol=1e-12)
    assert strategy.sensitivity() == pytest.approx(1.0, abs=1e-12)
    assert laplace_scale(strategy, epsilon=0.3) == pytest.approx(1 / 0.3, rel=1e-12)
    squares = np.sqrt((dense_strategy_matrix(strategy) ** 2).sum(axis=0).max())
    assert strategy.sensitivity(norm=2) == pytest.approx(squares, rel=1e-12)


def test_tree_carries_a_leftover_node_instead_of_duplicating_it() -> None:
    rng = np.random.default_rng(0)
    strategy = greedy_h_strategy(random_ranges(rng, 5, 20), Partition.singletons(5))
    assert [b.tolist() for b in strategy.level_bounds] == [
        [0, 1, 2, 3, 4, 5],
        [0, 2, 4, 5],
        [0, 4, 5],
        [0, 5],
    ]
    assert strategy.lambdas[0][2] == 0 and strategy.lambdas[1][1] == 0
    assert strategy.fractions[1][2] == 0 and strategy.fractions[2][1] == 0


def test_cell_queries_and_apply_use_the_partition() -> None:
    rng = np.random.default_rng(4)
    x = rng.poisson(5.0, 30).astype(float)
    partition = random_partition(rng, 30, 9)
    strategy = greedy_h_strategy(random_ranges(rng, 30, 25), partition)
    lo, hi, weight = query_cells(strategy)
    by_cells = np.array([w * x[a : b + 1].sum() for a, b, w in zip(lo, hi, weight, strict=True)])
    np.testing.assert_allclose(strategy.apply(x), by_cells)
    np.testing.assert_allclose(
        strategy.apply(x), dense_strategy_matrix(strategy) @ partition.bucket_totals(x)
    )


def test_noise_free_measurement_reconstructs_the_bucket_counts_exactly() -> None:
    rng = np.random.default_rng(9)
    x = rng.poisson(4.0, 50).astype(float)
    partition = random_partition(rng, 50, 12)
    strategy = greedy_h_strategy(random_ranges(rng, 50, 30), partition)
    sampler = ZeroNoise()
    estimate = measure_and_reconstruct(x, strategy, epsilon=0.4, sampler=sampler)
    np.testing.assert_allclose(estimate, partition.expand(partition.bucket_totals(x)), atol=1e-9)
    assert sampler.calls == [("laplace", strategy.num_queries, pytest.approx(1 / 0.4))]


# --------------------------------------------------------------------------------------------------
# The whole algorithm


def test_dawa_without_noise_returns_the_uniform_expansion_of_its_partition() -> None:
    rng = np.random.default_rng(12)
    x = np.repeat(rng.poisson(30.0, 8), 16).astype(float)
    workload = random_ranges(rng, x.size, 100)
    sampler = ZeroNoise()
    result = dawa(x, workload, epsilon=1.0, sampler=sampler)
    np.testing.assert_allclose(
        result.estimate, result.partition.expand(result.partition.bucket_totals(x)), atol=1e-9
    )
    assert result.partition_epsilon == pytest.approx(0.25)
    assert result.measurement_epsilon == pytest.approx(0.75)
    assert result.epsilon == pytest.approx(1.0)
    n_lengths = x.size.bit_length()  # 1, 2, 4, …, 128
    assert len(sampler.calls) == n_lengths + 1  # one call per length, then one measurement
    assert sampler.calls[-1][2] == pytest.approx(result.measurement_scale)
    assert result.measurement_scale == pytest.approx(1 / 0.75)


def test_dawa_is_reproducible_with_a_seeded_sampler_and_estimates_are_read_only() -> None:
    rng = np.random.default_rng(13)
    x = rng.poisson(10.0, 128).astype(float)
    workload = random_ranges(rng, 128, 40)
    runs = [
        dawa(x, workload, epsilon=0.5, sampler=SeededNumpyNoise(np.random.default_rng(99)))
        for _ in range(2)
    ]
    np.testing.assert_array_equal(runs[0].estimate, runs[1].estimate)
    np.testing.assert_array_equal(runs[0].partition.boundaries, runs[1].partition.boundaries)
    assert np.all(np.isfinite(runs[0].estimate)) and runs[0].estimate.shape == (128,)
    assert runs[0].noisy_answers.size == runs[0].strategy.num_queries
    with pytest.raises(ValueError, match="read-only"):
        runs[0].estimate[0] = 1.0


def test_measure_buckets_uses_one_laplace_call_at_the_strategy_scale() -> None:
    partition = Partition.from_starts([0, 3], n_cells=6)
    strategy = greedy_h_strategy(ranges_workload([0], [5], n_cells=6), partition)
    sampler = ZeroNoise()
    answers = measure_buckets(np.arange(6.0), strategy, epsilon=2.0, sampler=sampler)
    np.testing.assert_allclose(answers, strategy.apply(np.arange(6.0)))
    assert sampler.calls == [("laplace", strategy.num_queries, pytest.approx(0.5))]


# --------------------------------------------------------------------------------------------------
# Workloads


def test_interval_workload_from_matrix_round_trips_and_answers() -> None:
    rng = np.random.default_rng(14)
    matrix = np.round(rng.normal(size=(7, 20)) * (rng.random((7, 20)) < 0.5), 1)
    matrix[2, 4:12] = 1.0  # a run of equal values becomes one piece
    workload = matrix_workload(matrix)
    np.testing.assert_allclose(query_matrix(workload).toarray(), matrix)
    assert np.sum((workload.row == 2) & (workload.lo == 4) & (workload.hi == 11)) == 1
    x = rng.normal(size=20)
    np.testing.assert_allclose(answer(workload, x), matrix @ x)


# --------------------------------------------------------------------------------------------------
# Hilbert layout


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
def test_hilbert_order_is_a_connected_space_filling_curve(k: int) -> None:
    order = hilbert_order(k)
    side = 1 << k
    np.testing.assert_array_equal(np.sort(order), np.arange(side * side))
    row, col = np.divmod(order, side)
    assert np.all(np.abs(np.diff(row)) + np.abs(np.diff(col)) == 1)  # neighbours share an edge
    assert (row[0], col[0]) == (0, 0)
    assert (row[-1], col[-1]) == (0, side - 1)
    for j in range(1, k + 1):  # every aligned 2^j × 2^j block is one run of 4^j positions
        block = (row >> j) * (side >> j) + (col >> j)
        runs = np.count_nonzero(np.diff(block)) + 1
        assert runs == (side >> j) ** 2


def test_hilbert_order_for_k_1_lists_the_cells_in_curve_order() -> None:
    np.testing.assert_array_equal(hilbert_order(1), [0, 2, 3, 1])


@pytest.mark.parametrize("keep_padding", [True, False], ids=["padded", "compact"])
@pytest.mark.parametrize("shape", [(3, 5), (4, 4), (1, 7)], ids=["3x5", "4x4", "1x7"])
def test_hilbert_layout_round_trips_and_maps_rectangles(
    shape: tuple[int, int], keep_padding: bool
) -> None:
    layout = HilbertLayout.for_shape(shape, keep_padding=keep_padding)
    side = 1 << max(shape[0] - 1, shape[1] - 1, 0).bit_length()
    assert layout.n_positions == (side * side if keep_padding else shape[0] * shape[1])
    grid = np.arange(shape[0] * shape[1], dtype=float).reshape(shape) + 1
    vector = layout.to_1d(grid)
    np.testing.assert_array_equal(layout.to_2d(vector), grid)
    assert vector.sum() == grid.sum()  # padding positions are empty
    rng = np.random.default_rng(shape[0] * 10 + shape[1])
    r0, r1 = np.sort(rng.integers(0, shape[0], (2, 6)), axis=0)
    c0, c1 = np.sort(rng.integers(0, shape[1], (2, 6)), axis=0)
    query, lo, hi = layout.rectangle_pieces(r0, r1, c0, c1)
    workload = IntervalWorkload(
        n_cells=layout.n_positions, n_rows=6, row=query, lo=lo, hi=hi, weight=np.ones(lo.size)
    )
    expected = [grid[a : b + 1, c : d + 1].sum() for a, b, c, d in zip(r0, r1, c0, c1, strict=True)]
    np.testing.assert_allclose(answer(workload, vector), expected)


# --------------------------------------------------------------------------------------------------
# Every validator fires


def strategy_for_validation() -> HierarchicalStrategy:
    return greedy_h_strategy(ranges_workload([0, 1], [3, 2], n_cells=4), Partition.singletons(4))


VALIDATORS = {
    "epsilon-zero": (lambda: split_budget(0.0), "epsilon (0.0) must be finite and > 0"),
    "epsilon-inf": (lambda: split_budget(float("inf")), "epsilon (inf) must be finite and > 0"),
    "epsilon-nan": (lambda: split_budget(float("nan")), "epsilon (nan) must be finite and > 0"),
    "ratio-zero": (lambda: split_budget(1.0, ratio=0.0), "ratio (0.0) must lie strictly between"),
    "ratio-one": (lambda: split_budget(1.0, ratio=1), "ratio (1) must lie strictly between"),
    "measurement-eps": (
        lambda: PartitionSelector(epsilon=1.0, measurement_epsilon=-1.0),
        "measurement_epsilon (-1.0) must be finite and > 0",
    ),
    "selector-eps": (
        lambda: PartitionSelector(epsilon=0, measurement_epsilon=1.0),
        "epsilon (0) must be finite and > 0",
    ),
    "intervals": (
        lambda: PartitionSelector(epsilon=1, measurement_epsilon=1, intervals="some"),
        "intervals ('some') must be one of ('dyadic', 'all')",
    ),
    "scale-rule": (
        lambda: PartitionSelector(epsilon=1, measurement_epsilon=1, scale_rule="half"),
        "scale_rule ('half') must be one of ('per_interval', 'uniform')",
    ),
    "contribution-bound": (
        lambda: PartitionSelector(epsilon=1, measurement_epsilon=1, contribution_bound=0),
        "contribution_bound (0) must be an integer >= 1",
    ),
    "noise-offset": (
        lambda: PartitionSelector(epsilon=1, measurement_epsilon=1, noise_offset=-1.0),
        "noise_offset (-1.0) must be finite and >= 0",
    ),
    "selector-n-cells": (
        lambda: PartitionSelector(epsilon=1, measurement_epsilon=1).noise_scales(0),
        "n_cells (0) must be >= 1",
    ),
    "all-too-large": (
        lambda: least_cost_partition(np.zeros(ALL_INTERVALS_MAX_CELLS + 1), measurement_epsilon=1),
        f"n_cells ({ALL_INTERVALS_MAX_CELLS + 1}) must be <= {ALL_INTERVALS_MAX_CELLS}",
    ),
    "x-2d": (
        lambda: window_deviations(np.zeros((2, 2)), length=1),
        "x (shape (2, 2)) must be a non-empty 1-D array",
    ),
    "x-empty": (
        lambda: bucket_deviations(np.zeros(0), EXAMPLE_PARTITION),
        "x (shape (0,)) must be a non-empty 1-D array",
    ),
    "x-nan": (
        lambda: private_partition(
            np.array([1.0, np.nan]), epsilon=1, measurement_epsilon=1, sampler=ZeroNoise()
        ),
        "x must contain only finite values",
    ),
    "x-length": (
        lambda: EXAMPLE_PARTITION.bucket_totals(np.zeros(9)),
        "x has 9 cells but the partition covers 10",
    ),
    "window-length": (
        lambda: window_deviations(np.zeros(5), length=6),
        "length (6) must lie in [1, 5]",
    ),
    "boundaries-short": (
        lambda: Partition(boundaries=np.array([0])),
        "boundaries (shape (1,)) must be 1-D with at least 2 entries",
    ),
    "boundaries-float": (
        lambda: Partition(boundaries=np.array([0.0, 2.0])),
        "boundaries (dtype float64) must be integers",
    ),
    "boundaries-start": (
        lambda: Partition(boundaries=np.array([1, 3])),
        "boundaries[0] (1) must be 0",
    ),
    "boundaries-order": (
        lambda: Partition(boundaries=np.array([0, 2, 2, 5])),
        "boundaries must be strictly increasing",
    ),
    "singletons": (lambda: Partition.singletons(0), "n_cells (0) must be >= 1"),
    "expand-length": (
        lambda: EXAMPLE_PARTITION.expand([1.0, 2.0]),
        "bucket_values (shape (2,)) must have one entry per bucket (4)",
    ),
    "workload-hi": (
        lambda: ranges_workload([0], [10], n_cells=10),
        "lo and hi must lie in [0, n_cells) = [0, 10)",
    ),
    "workload-order": (
        lambda: ranges_workload([5], [4], n_cells=10),
        "every piece needs lo <= hi",
    ),
    "workload-shapes": (
        lambda: ranges_workload([0, 1], [4], n_cells=10),
        "lo (shape (2,)) and hi (shape (1,)) must be 1-D of one length",
    ),
    "workload-row": (
        lambda: IntervalWorkload(n_cells=5, n_rows=1, row=[1], lo=[0], hi=[2], weight=[1.0]),
        "row entries must lie in [0, n_rows) = [0, 1)",
    ),
    "workload-overlap": (
        lambda: IntervalWorkload(
            n_cells=5, n_rows=1, row=[0, 0], lo=[0, 2], hi=[2, 4], weight=[1.0, 1.0]
        ),
        "pieces of one row must not overlap",
    ),
    "workload-weight": (
        lambda: IntervalWorkload(n_cells=5, n_rows=1, row=[0], lo=[0], hi=[2], weight=[np.inf]),
        "weight must contain only finite values",
    ),
    "workload-lengths": (
        lambda: IntervalWorkload(n_cells=5, n_rows=1, row=[0], lo=[0, 1], hi=[2], weight=[1.0]),
        "row, lo, hi and weight must be 1-D of one length",
    ),
    "workload-int": (
        lambda: IntervalWorkload(n_cells=5, n_rows=1, row=[0], lo=[0.5], hi=[2], weight=[1.0]),
        "lo (dtype float64) must be integers",
    ),
    "workload-n-cells": (
        lambda: IntervalWorkload(n_cells=0, n_rows=1, row=[], lo=[], hi=[], weight=[]),
        "n_cells (0) must be >= 1",
    ),
    "workload-n-rows": (
        lambda: IntervalWorkload(n_cells=3, n_rows=0, row=[], lo=[], hi=[], weight=[]),
        "n_rows (0) must be >= 1",
    ),
    "workload-answer": (
        lambda: answer(ranges_workload([0], [1], n_cells=3), np.zeros(4)),
        "x has 4 cells but the workload has 3",
    ),
    "workload-partition": (
        lambda: greedy_h_strategy(ranges_workload([0], [1], n_cells=3), Partition.singletons(4)),
        "workload has 3 cells but the partition covers 4",
    ),
    "branching": (
        lambda: greedy_h_strategy(
            ranges_workload([0], [1], n_cells=3), Partition.singletons(3), branching=1
        ),
        "branching (1) must be an integer >= 2",
    ),
    "least-squares-length": (
        lambda: strategy_for_validation().least_squares(np.zeros(1)),
        "noisy_answers (shape (1,)) must have one entry per query",
    ),
    "answer-length": (
        lambda: strategy_for_validation().answer_buckets(np.zeros(3)),
        "bucket_counts (shape (3,)) must have one entry per bucket (4)",
    ),
    "sensitivity-norm": (
        lambda: strategy_for_validation().sensitivity(norm=3),
        "norm (3) must be 1 or 2",
    ),
    "strategy-scale": (
        lambda: laplace_scale(strategy_for_validation(), epsilon=-2.0),
        "epsilon (-2.0) must be finite and > 0",
    ),
    "strategy-leaves": (
        lambda: HierarchicalStrategy(
            partition=Partition.singletons(2),
            level_bounds=(np.array([0, 2]),),
            lambdas=(),
            error_trace=0.0,
        ),
        "level_bounds[0] must be 0 … n_buckets (2)",
    ),
    "strategy-root": (
        lambda: HierarchicalStrategy(
            partition=Partition.singletons(2),
            level_bounds=(np.array([0, 1, 2]),),
            lambdas=(),
            error_trace=0.0,
        ),
        "level_bounds[-1] ([0 1 2]) must be the root [0, 2]",
    ),
    "strategy-lambda-levels": (
        lambda: HierarchicalStrategy(
            partition=Partition.singletons(2),
            level_bounds=(np.array([0, 1, 2]), np.array([0, 2])),
            lambdas=(),
            error_trace=0.0,
        ),
        "lambdas has 0 levels but level_bounds has 1 above the leaves",
    ),
    "strategy-nested": (
        lambda: HierarchicalStrategy(
            partition=Partition.singletons(4),
            level_bounds=(np.arange(5), np.array([0, 2, 4]), np.array([0, 3, 4]), np.array([0, 4])),
            lambdas=(np.zeros(2), np.zeros(2), np.zeros(1)),
            error_trace=0.0,
        ),
        "level_bounds[2] must be nested in level 1",
    ),
    "strategy-lambda-shape": (
        lambda: HierarchicalStrategy(
            partition=Partition.singletons(2),
            level_bounds=(np.array([0, 1, 2]), np.array([0, 2])),
            lambdas=(np.zeros(2),),
            error_trace=0.0,
        ),
        "lambdas[0] (shape (2,)) must have one entry per node",
    ),
    "strategy-lambda-range": (
        lambda: HierarchicalStrategy(
            partition=Partition.singletons(2),
            level_bounds=(np.array([0, 1, 2]), np.array([0, 2])),
            lambdas=(np.array([1.0]),),
            error_trace=0.0,
        ),
        "lambdas[0] must lie in [0, 1)",
    ),
    "strategy-carried": (
        lambda: HierarchicalStrategy(
            partition=Partition.singletons(3),
            level_bounds=(np.arange(4), np.array([0, 2, 3]), np.array([0, 3])),
            lambdas=(np.array([0.0, 0.4]), np.array([0.0])),
            error_trace=0.0,
        ),
        "lambdas[0] must be 0 at carried (single-child) nodes",
    ),
    "hilbert-k": (lambda: hilbert_order(-1), "k (-1) must be an integer >= 0"),
    "hilbert-shape": (
        lambda: HilbertLayout.for_shape((0, 3)),
        "shape ((0, 3)) must be two integers >= 1",
    ),
    "hilbert-grid": (
        lambda: HilbertLayout.for_shape((2, 2)).to_1d(np.zeros((2, 3))),
        "grid (shape (2, 3)) must have shape (2, 2)",
    ),
    "hilbert-vector": (
        lambda: HilbertLayout.for_shape((2, 2)).to_2d(np.zeros(3)),
        "vector (shape (3,)) must have one entry per position (4)",
    ),
    "hilbert-rectangle-bounds": (
        lambda: HilbertLayout.for_shape((2, 2)).rectangle_pieces([0], [2], [0], [1]),
        "rectangles must lie inside the grid (2, 2)",
    ),
    "hilbert-rectangle-order": (
        lambda: HilbertLayout.for_shape((2, 2)).rectangle_pieces([1], [0], [0], [1]),
        "every rectangle needs row_lo <= row_hi and col_lo <= col_hi",
    ),
    "hilbert-rectangle-shapes": (
        lambda: HilbertLayout.for_shape((2, 2)).rectangle_pieces([0, 0], [1], [0], [1]),
        "row_lo, row_hi, col_lo and col_hi must be 1-D of one length",
    ),
}


@pytest.mark.parametrize(("build", "message"), VALIDATORS.values(), ids=VALIDATORS.keys())
def test_validators_fire(build, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build()
