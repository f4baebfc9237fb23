"""Statistical tests of the LDP protocol in mechanisms/local/: client sampling follows Q, and the
server's estimates are unbiased with the variance of Thm 3.4.

Every test has a fixed false-failure rate ALPHA = 1e-6 (Bonferroni over the queries or items it
checks) and a power check: the same statistic rejects a wrong scale.  Seeds are fixed, so the
suite is deterministic; the false-failure rate is what a fresh seed would give.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import threadpoolctl

from dprelease.mechanisms.local import baselines, estimation, randomizer

pytestmark = pytest.mark.statistical

ALPHA = 1e-6


@pytest.fixture(autouse=True)
def _single_blas_thread():
    """Small matrices on a shared machine: BLAS threads only contend."""
    with threadpoolctl.threadpool_limits(limits=1):
        yield


def prefix(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n)))


def chi_square_statistic(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = counts.sum() * probabilities
    return float(np.sum((counts - expected) ** 2 / expected))


# --------------------------------------------------------------------------------------------
# Client side: randomize samples column Q[:, item]
# --------------------------------------------------------------------------------------------

SAMPLING_CASES = {
    "randomized_response": (baselines.randomized_response(5, epsilon=1.0), 1.3),
    "hadamard": (baselines.hadamard(6, epsilon=1.0), 1.3),
    "hierarchical": (baselines.hierarchical(8, epsilon=1.0, branching=2), 1.3),
}


@pytest.mark.parametrize("case", sorted(SAMPLING_CASES), ids=sorted(SAMPLING_CASES))
def test_randomize_follows_the_strategy_column(case: str) -> None:
    strategy, wrong_factor = SAMPLING_CASES[case]
    wrong = {
        "randomized_response": baselines.randomized_response(5, epsilon=wrong_factor),
        "hadamard": baselines.hadamard(6, epsilon=wrong_factor),
        "hierarchical": baselines.hierarchical(8, epsilon=wrong_factor, branching=2),
    }[case]
    n, m = strategy.domain_size, strategy.num_outputs
    draws_per_item = 200_000
    items = np.repeat(np.arange(n), draws_per_item)
    responses = randomizer.randomize(items, strategy, rng=np.random.default_rng(2024))
    counts = np.bincount(items * m + responses, minlength=n * m).reshape(n, m)
    critical = scipy.stats.chi2.isf(ALPHA / n, df=m - 1)  # Bonferroni over the n items
    statistics = [chi_square_statistic(counts[u], strategy.Q[:, u]) for u in range(n)]
    assert max(statistics) <= critical
    # Power: the same draws against the columns of the strategy at a 30% larger epsilon.
    wrong_statistics = [chi_square_statistic(counts[u], wrong.Q[:, u]) for u in range(n)]
    assert max(wrong_statistics) > critical


# --------------------------------------------------------------------------------------------
# Server side: V y is unbiased for W x with the variance of Thm 3.4
# --------------------------------------------------------------------------------------------

DATA = np.array([300, 0, 120, 50, 400, 30, 0, 100])  # x: users per item, N = 1000
REPLICATES = 2000


@pytest.fixture(scope="module")
def simulation() -> dict[str, np.ndarray]:
    """REPLICATES independent runs of the protocol on the data vector DATA."""
    strategy = baselines.hierarchical(8, epsilon=1.0, branching=2)
    W = prefix(8)
    V = estimation.reconstruction(W, strategy)
    m = strategy.num_outputs
    items = np.tile(np.repeat(np.arange(8), DATA), REPLICATES)
    responses = randomizer.randomize(items, strategy, rng=np.random.default_rng(7))
    replicate = np.repeat(np.arange(REPLICATES), DATA.sum())
    counts = np.bincount(replicate * m + responses, minlength=REPLICATES * m).reshape(-1, m)
    estimates = [estimation.estimate(row, V) for row in counts]
    per_query_per_type = (V**2) @ strategy.Q - W**2  # Thm 3.4, one row per query
    variance = per_query_per_type @ DATA
    answers = np.array([e.answers for e in estimates])
    # The last prefix query counts every user: N is public and exact, its variance is 0.
    random = variance > 1e-9 * variance.max()
    np.testing.assert_array_equal(random, np.arange(8) < 7)
    np.testing.assert_allclose(answers[:, ~random], DATA.sum(), rtol=1e-12)
    return {
        "answers": answers[:, random],
        "variance_estimates": np.array([e.variance for e in estimates])[:, random],
        "truth": (W @ DATA)[random],
        "variance": variance[random],
        "total_variance": float(estimation.per_type_variance(W, strategy) @ DATA),
        "workload": W[random],
    }


def mean_z_scores(samples: np.ndarray, expected: np.ndarray, variance: np.ndarray) -> np.ndarray:
    return (samples.mean(axis=0) - expected) / np.sqrt(variance / samples.shape[0])


def test_estimates_are_unbiased(simulation: dict[str, np.ndarray]) -> None:
    num_queries = simulation["truth"].size
    critical = scipy.stats.norm.isf(ALPHA / (2 * num_queries))
    z = mean_z_scores(simulation["answers"], simulation["truth"], simulation["variance"])
    assert np.abs(z).max() <= critical
    # Power: a 2% scale error in the estimator is rejected.
    z_scaled = mean_z_scores(
        1.02 * simulation["answers"], simulation["truth"], simulation["variance"]
    )
    assert np.abs(z_scaled).max() > critical


def variance_statistics(samples: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """(R - 1) s^2 / σ^2 per query: χ²(R - 1) when the estimates are normal with variance σ²."""
    return (samples.shape[0] - 1) * samples.var(axis=0, ddof=1) / variance


def test_empirical_variance_matches_theorem_3_4(simulation: dict[str, np.ndarray]) -> None:
    num_queries = simulation["truth"].size
    low = scipy.stats.chi2.ppf(ALPHA / (2 * num_queries), df=REPLICATES - 1)
    high = scipy.stats.chi2.isf(ALPHA / (2 * num_queries), df=REPLICATES - 1)
    statistics = variance_statistics(simulation["answers"], simulation["variance"])
    assert low <= statistics.min() and statistics.max() <= high
    # Power: the formula scaled by 1.3 or 0.7 is rejected.
    assert variance_statistics(simulation["answers"], 1.3 * simulation["variance"]).min() < low
    assert variance_statistics(simulation["answers"], 0.7 * simulation["variance"]).max() > high
    # Thm 3.4's total is the sum of the per-query variances.
    assert simulation["variance"].sum() == pytest.approx(simulation["total_variance"], rel=1e-10)


def test_variance_estimate_has_its_documented_expectation(
    simulation: dict[str, np.ndarray],
) -> None:
    """E[estimate.variance] = Var + N^2/(N-1) Var_{u ~ x/N}(W_iu) (conservative)."""
    total = DATA.sum()
    weights = DATA / total
    W = simulation["workload"]
    spread = (W**2) @ weights - (W @ weights) ** 2
    expected = simulation["variance"] + total**2 / (total - 1) * spread
    samples = simulation["variance_estimates"]
    standard_error = samples.std(axis=0, ddof=1) / np.sqrt(samples.shape[0])
    critical = scipy.stats.norm.isf(ALPHA / (2 * expected.size))
    z = (samples.mean(axis=0) - expected) / standard_error
    assert np.abs(z).max() <= critical
    assert np.all(expected >= simulation["variance"])
    # Power: a 10% scale error in the expectation is rejected.
    assert np.abs((samples.mean(axis=0) - 1.1 * expected) / standard_error).max() > critical
