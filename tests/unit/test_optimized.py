"""Deterministic tests of the optimised strategy templates and the marginals algebra.

Test vectors: /work/shared/reference/seed-eigen.md §4 item 6 and §9 (SVD bounds; Identity, H and Y
error ratios) and anchors.md §2/§12 (HDMM's optimised errors, which ours must not exceed).  Every
structural shortcut (Kronecker error and sensitivity, marginals eigenvalues, Gram products,
pseudo-inverse, projections, measurements) is checked against the dense matrix.  Sizes stay small;
the large cases (n up to 4096) live in benchmarks/strategy_bench.py.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import scipy.optimize

from dprelease.mechanisms.optimized.search import (
    OptimizedStrategy,
    optimize_workload,
    predict_seconds,
    validate_terms,
)
from dprelease.mechanisms.optimized.templates import (
    PIdentityFactor,
    PIdentityObjective,
    column_sensitivity,
    gaussian_dual,
    gram_right_multiply,
    optimize_factor,
    optimize_pidentity_factor,
    predict_factor_seconds,
    predict_pidentity_seconds,
    structured_gram,
    unit_error,
)
from dprelease.mechanisms.primitives.lower_bound import validate_gram
from dprelease.mechanisms.primitives.marginal_strategies import (
    eigenspace_multiplicities,
    marginals_loss_and_gradient,
    marginals_sensitivity,
    marginals_unit_error,
    validate_domain_sizes,
    workload_projections,
)
from dprelease.mechanisms.primitives.subset_family import superset_sums
from tests.fake_clock import install_fake_clock
from tests.reference.lower_bound import svd_bound_terms as svd_bound
from tests.reference.marginal_algebra import (
    gram_coefficients,
    gram_eigenvalues,
    marginal_measurements,
    marginal_measurements_transpose,
    marginals_gram_apply,
    marginals_gram_pinv_apply,
    pseudo_inverse_coefficients,
    subset_mask,
    subsets_projections,
    superset_differences,
)
from tests.reference.optimized_search import (
    expected_total_error,
    factor_grams,
    optimize_full_rank,
    optimize_gaussian_full_rank,
    optimize_kron,
    optimize_marginals,
    optimize_pidentity,
    pidentity_loss_and_gradient,
)

# ------------------------------------------------------------------------------------------------
# Helpers: dense workloads and competitor strategies
# ------------------------------------------------------------------------------------------------


def all_range_gram(n: int) -> np.ndarray:
    """Gram of all n(n+1)/2 ranges: min(i, j) (n − max(i, j) + 1), 1-indexed."""
    i = np.arange(1, n + 1)
    return np.minimum.outer(i, i) * (n - np.maximum.outer(i, i) + 1.0)


def prefix_gram(n: int) -> np.ndarray:
    """Gram of the n prefix (CDF) queries: n − max(i, j) + 1."""
    i = np.arange(1, n + 1)
    return n - np.maximum.outer(i, i) + 1.0


def test_structured_gram_products_equal_the_dense_product() -> None:
    """The O(p n) products for all-range and prefix Grams (any positive multiple) equal ``X @ G``;
    anything else, even one entry off, takes the dense product."""
    rng = np.random.default_rng(4)  # public randomness: test matrices
    x = rng.random((6, 33))
    ranges = np.array(  # the all-range matrix itself, row by row
        [[1.0 if a <= i <= b else 0.0 for i in range(33)] for a in range(33) for b in range(a, 33)]
    )
    prefixes = np.tril(np.ones((33, 33)))
    cases = [
        (ranges.T @ ranges, "ranges"),
        (0.37 * all_range_gram(33), "ranges"),
        (prefixes.T @ prefixes, "prefix"),
        (5.0 * prefix_gram(33), "prefix"),
    ]
    for gram, kind in cases:
        recognised = structured_gram(gram)
        assert recognised is not None and recognised[0] == kind
        np.testing.assert_allclose(
            gram_right_multiply(gram)(x.copy(), np.empty_like(x)), x @ gram, rtol=1e-12
        )
    perturbed = all_range_gram(33)
    perturbed[3, 5] = perturbed[5, 3] = perturbed[3, 5] + 1.0
    assert structured_gram(perturbed) is None
    assert structured_gram(all_range_gram(33) + prefix_gram(33)) is None
    np.testing.assert_allclose(
        gram_right_multiply(perturbed)(x.copy(), np.empty_like(x)), x @ perturbed, rtol=1e-12
    )


def dense_kron(matrices: tuple[np.ndarray, ...]) -> np.ndarray:
    out = np.ones((1, 1))
    for matrix in matrices:
        out = np.kron(out, matrix)
    return out


def dense_workload_gram(terms: list[tuple[np.ndarray, ...]]) -> np.ndarray:
    return sum(dense_kron(term) for term in terms)


def dense_error(gram: np.ndarray, strategy: np.ndarray, *, norm: int) -> float:
    columns = np.abs(strategy).sum(axis=0) if norm == 1 else np.sqrt((strategy**2).sum(axis=0))
    return float(columns.max() ** 2 * np.trace(gram @ np.linalg.pinv(strategy.T @ strategy)))


def hierarchical(n: int) -> np.ndarray:
    """H_n: binary hierarchy of dyadic blocks including the leaves ((2n − 1) × n)."""
    rows, block = [], n
    while block >= 1:
        for start in range(0, n, block):
            row = np.zeros(n)
            row[start : start + block] = 1.0
            rows.append(row)
        block //= 2
    return np.array(rows)


def wavelet(n: int) -> np.ndarray:
    """Y_n: unnormalised Haar with a total row (n × n)."""
    matrix = np.ones((1, 1))
    while matrix.shape[1] < n:
        size = matrix.shape[1]
        matrix = np.vstack([np.kron(matrix, [[1.0, 1.0]]), np.kron(np.eye(size), [[1.0, -1.0]])])
    return matrix


def random_gram(rng: np.random.Generator, n: int, rows: int | None = None) -> np.ndarray:
    w = rng.standard_normal((rows or n + 2, n))
    return w.T @ w


def marginal_basis(mask: int, sizes: tuple[int, ...]) -> np.ndarray:
    return dense_kron(
        tuple(np.eye(n) if mask >> i & 1 else np.ones((n, n)) for i, n in enumerate(sizes))
    )


def marginal_query(mask: int, sizes: tuple[int, ...]) -> np.ndarray:
    return dense_kron(
        tuple(np.eye(n) if mask >> i & 1 else np.ones((1, n)) for i, n in enumerate(sizes))
    )


def marginal_terms(subsets: list[tuple[int, ...]], sizes: tuple[int, ...]):
    return [
        tuple(np.eye(n) if i in subset else np.ones((n, n)) for i, n in enumerate(sizes))
        for subset in subsets
    ]


def dense_strategy(
    factors: tuple[np.ndarray, ...], *, noise: str = "gaussian"
) -> OptimizedStrategy:
    """Wrap given per-attribute matrices so expected_total_error can evaluate them."""
    return OptimizedStrategy(
        kind="kron",
        domain_sizes=tuple(f.shape[1] for f in factors),
        objective_noise=noise,
        total_error=float("nan"),
        sensitivity=float("nan"),
        restarts=0,
        seconds=0.0,
        factors=factors,
        factor_templates=("identity",) * len(factors),
    )


# ------------------------------------------------------------------------------------------------
# Expected error: test vectors and the Kronecker shortcut
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected_ratio"),
    [("identity", 2.0174), ("hierarchical", 1.6258), ("wavelet", 1.2709)],
    ids=["identity", "H16", "Y16"],
)
def test_error_ratios_all_range_16(name: str, expected_ratio: float) -> None:
    """seed-eigen.md §9: TOTALERROR / SVDB under L2 sensitivity for ALLRANGE(16)."""
    strategy = {"identity": np.eye(16), "hierarchical": hierarchical(16), "wavelet": wavelet(16)}
    terms = [(all_range_gram(16),)]
    error = expected_total_error(terms, dense_strategy((strategy[name],)), noise="gaussian")
    assert error / svd_bound(terms) == pytest.approx(expected_ratio, abs=6e-5)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_identity_rmse_all_range_256(noise: str) -> None:
    """anchors.md §2: Identity on AllRange(256) has rmse 9.274 under either normalisation."""
    n = 256
    error = expected_total_error([(all_range_gram(n),)], dense_strategy((np.eye(n),)), noise=noise)
    assert math.sqrt(error / (n * (n + 1) / 2)) == pytest.approx(9.274, abs=5e-4)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_kron_error_and_sensitivity_equal_dense(noise: str) -> None:
    """Factors with negative entries (allowed under both norms): Π-of-factors vs the dense A."""
    rng = np.random.default_rng(3)
    factors = (rng.standard_normal((5, 3)), rng.standard_normal((6, 4)) - 0.5)
    terms = [(random_gram(rng, 3), random_gram(rng, 4)), (np.ones((3, 3)), all_range_gram(4))]
    dense_a = dense_kron(factors)
    norm = 1 if noise == "laplace" else 2
    expected = dense_error(dense_workload_gram(terms), dense_a, norm=norm)
    assert expected_total_error(terms, dense_strategy(factors), noise=noise) == pytest.approx(
        expected, rel=1e-9
    )
    dense_sensitivity = column_sensitivity(dense_a, noise=noise)
    product = np.prod([column_sensitivity(f, noise=noise) for f in factors])
    assert product == pytest.approx(dense_sensitivity, rel=1e-12)


def test_unit_error_pseudo_inverse_path_and_support() -> None:
    """Singular strategy Grams: pinv error when supported, inf when not."""
    total = np.ones((1, 4))
    assert unit_error(np.ones((4, 4)), total.T @ total) == pytest.approx(1.0, rel=1e-9)
    assert unit_error(np.eye(4), total.T @ total) == math.inf


# ------------------------------------------------------------------------------------------------
# Gradient checks (every template objective)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_pidentity_gradient(noise: str) -> None:
    rng = np.random.default_rng(11)
    n, p = 12, 3
    gram = all_range_gram(n) / n
    theta = rng.random(p * n) + 0.1
    if noise == "gaussian":
        theta -= 0.5  # negative entries are allowed under L2
    error = scipy.optimize.check_grad(
        lambda x: pidentity_loss_and_gradient(x, gram, p, noise)[0],
        lambda x: pidentity_loss_and_gradient(x, gram, p, noise)[1],
        theta,
    )
    gradient_norm = np.linalg.norm(pidentity_loss_and_gradient(theta, gram, p, noise)[1])
    assert error <= 1e-5 * max(1.0, gradient_norm)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_pidentity_loss_equals_dense(noise: str) -> None:
    rng = np.random.default_rng(12)
    n, p = 9, 4
    gram = prefix_gram(n)
    theta = rng.random((p, n)) - (0.5 if noise == "gaussian" else 0.0)
    strategy = PIdentityFactor(theta, noise=noise).dense()
    assert column_sensitivity(strategy, noise=noise) == pytest.approx(1.0, rel=1e-12)
    loss, _ = pidentity_loss_and_gradient(theta.ravel(), gram, p, noise)
    expected = dense_error(gram, strategy, norm=1 if noise == "laplace" else 2)
    assert loss == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_marginals_gradient(noise: str) -> None:
    rng = np.random.default_rng(13)
    sizes = (2, 3, 4)
    projections = workload_projections(
        [
            (random_gram(rng, 2), np.eye(3), random_gram(rng, 4)),
            (np.ones((2, 2)), *marginal_terms([(1,)], (3, 4))[0]),
        ]
    )
    projections = projections / projections.max()
    weights = rng.random(8) + 0.2
    error = scipy.optimize.check_grad(
        lambda w: marginals_loss_and_gradient(w, projections, sizes, noise)[0],
        lambda w: marginals_loss_and_gradient(w, projections, sizes, noise)[1],
        weights,
    )
    gradient_norm = np.linalg.norm(
        marginals_loss_and_gradient(weights, projections, sizes, noise)[1]
    )
    assert error <= 1e-5 * max(1.0, gradient_norm)


# ------------------------------------------------------------------------------------------------
# Marginals algebra against dense matrices
# ------------------------------------------------------------------------------------------------

SIZES = (2, 3, 4)


def test_marginals_eigenvalues_equal_dense_spectrum() -> None:
    rng = np.random.default_rng(21)
    coefficients = rng.standard_normal(8)  # negative coefficients too
    dense = sum(c * marginal_basis(s, SIZES) for s, c in enumerate(coefficients))
    counts = eigenspace_multiplicities(SIZES).astype(int)
    spectrum = np.repeat(gram_eigenvalues(coefficients, SIZES), counts)
    np.testing.assert_allclose(np.sort(spectrum), np.linalg.eigvalsh(dense), atol=1e-10)
    assert counts.sum() == 24
    np.testing.assert_allclose(
        gram_coefficients(gram_eigenvalues(coefficients, SIZES), SIZES), coefficients, atol=1e-12
    )


def test_superset_transforms_invert_and_match_definition() -> None:
    values = np.random.default_rng(22).standard_normal(16)
    sums = superset_sums(values, 4)
    expected = [sum(values[s] for s in range(16) if s & u == u) for u in range(16)]
    np.testing.assert_allclose(sums, expected, atol=1e-12)
    np.testing.assert_allclose(superset_differences(sums, 4), values, atol=1e-12)


def test_marginals_gram_apply_equals_dense() -> None:
    rng = np.random.default_rng(23)
    coefficients = rng.standard_normal(8)
    vector = rng.standard_normal(24)
    dense = sum(c * marginal_basis(s, SIZES) for s, c in enumerate(coefficients))
    np.testing.assert_allclose(marginals_gram_apply(coefficients, SIZES, vector), dense @ vector)


@pytest.mark.parametrize("singular", [False, True], ids=["full-rank", "singular"])
def test_marginals_pinv_apply_equals_dense_pinv(singular: bool) -> None:
    rng = np.random.default_rng(24)
    weights = rng.random(8) + 0.1
    if singular:
        weights[[3, 7]] = 0.0  # no identity, no {0,1} marginal: rank deficient
    dense = sum(w**2 * marginal_basis(s, SIZES) for s, w in enumerate(weights))
    vector = rng.standard_normal(24)
    np.testing.assert_allclose(
        marginals_gram_pinv_apply(weights, SIZES, vector),
        np.linalg.pinv(dense) @ vector,
        atol=1e-10,
    )
    coefficients = pseudo_inverse_coefficients(weights**2, SIZES)
    pinv = sum(c * marginal_basis(s, SIZES) for s, c in enumerate(coefficients))
    np.testing.assert_allclose(dense @ pinv @ dense, dense, atol=1e-9)  # Moore–Penrose


def test_marginals_measurements_and_sensitivity_equal_dense() -> None:
    """Including a negative weight: sensitivity uses |w| (L1) and w² (L2)."""
    rng = np.random.default_rng(25)
    weights = np.array([0.5, 0.0, -0.7, 0.2, 0.0, 1.1, 0.3, -0.4])
    stacked = np.vstack([w * marginal_query(s, SIZES) for s, w in enumerate(weights) if w != 0])
    vector = rng.standard_normal(24)
    answers = marginal_measurements(weights, SIZES, vector)
    np.testing.assert_allclose(answers, stacked @ vector)
    np.testing.assert_allclose(
        marginal_measurements_transpose(weights, SIZES, answers), stacked.T @ answers
    )
    for noise in ("laplace", "gaussian"):
        assert marginals_sensitivity(weights, noise=noise) == pytest.approx(
            column_sensitivity(stacked, noise=noise), rel=1e-12
        )
    np.testing.assert_allclose(
        stacked.T @ stacked, sum(w**2 * marginal_basis(s, SIZES) for s, w in enumerate(weights))
    )


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_marginals_error_on_arbitrary_terms_equals_dense(noise: str) -> None:
    rng = np.random.default_rng(26)
    terms = [
        (random_gram(rng, 2), random_gram(rng, 3), np.eye(4)),
        (np.eye(2), np.ones((3, 3)), prefix_gram(4)),
    ]
    weights = rng.random(8) + 0.1
    strategy = OptimizedStrategy(
        kind="marginals", domain_sizes=SIZES, objective_noise=noise, total_error=float("nan"),
        sensitivity=float("nan"), restarts=0, seconds=0.0, weights=weights,
    )  # fmt: skip
    stacked = np.vstack([w * marginal_query(s, SIZES) for s, w in enumerate(weights)])
    expected = dense_error(dense_workload_gram(terms), stacked, norm=1 if noise == "laplace" else 2)
    assert expected_total_error(terms, strategy, noise=noise) == pytest.approx(expected, rel=1e-9)


def test_marginals_unsupported_workload_has_infinite_error() -> None:
    weights = np.zeros(8)
    weights[0] = 1.0  # only the grand total
    projections = workload_projections([tuple(np.eye(n) for n in SIZES)])
    assert marginals_unit_error(weights, projections, SIZES) == math.inf


def test_subsets_and_terms_give_the_same_projections() -> None:
    subsets = [(0, 1), (2,), ()]
    np.testing.assert_allclose(
        subsets_projections(subsets, SIZES),
        workload_projections(marginal_terms(subsets, SIZES)),
        atol=1e-9,
    )
    assert subset_mask((0, 2), 3) == 0b101


# ------------------------------------------------------------------------------------------------
# Full-rank Gaussian optimum
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gram", "m", "hdmm_rmse"),
    [(all_range_gram(128), 128 * 129 / 2, 2.599), (prefix_gram(128), 128, 2.312)],
    ids=["all-range-128", "prefix-128"],
)
def test_full_rank_beats_hdmm_and_is_certified(
    gram: np.ndarray, m: float, hdmm_rmse: float
) -> None:
    """anchors.md §2 (oned.csv, L2): ours ≤ HDMM, ≥ the SVD bound, within the dual gap."""
    result = optimize_full_rank(gram, tolerance=1e-5)
    assert math.sqrt(result.total_error / m) <= hdmm_rmse
    assert result.lower_bound is not None
    assert svd_bound([(gram,)]) <= result.lower_bound * (1 + 1e-12)
    assert result.lower_bound <= result.total_error <= result.lower_bound * (1 + 1e-5)
    (strategy,) = result.factors
    assert column_sensitivity(strategy, noise="gaussian") == pytest.approx(1.0, rel=1e-9)
    assert expected_total_error([(gram,)], result, noise="gaussian") == pytest.approx(
        result.total_error, rel=1e-8
    )


def test_gaussian_dual_gradient_and_weak_duality() -> None:
    """g(μ) = 2 tr √(D^½ G D^½) − Σμ has gradient diag(X_μ) − 1, and never exceeds a primal."""
    rng = np.random.default_rng(30)
    gram = random_gram(rng, 7, rows=9)

    def dual_function(mu: np.ndarray) -> float:
        value, _ = gaussian_dual(gram, np.sqrt(mu))
        return 2.0 * math.sqrt(value * mu.sum()) - mu.sum()

    def dual_gradient(mu: np.ndarray) -> np.ndarray:
        _, primal = gaussian_dual(gram, np.sqrt(mu))
        return np.diag(primal) - 1.0

    mu = rng.random(7) + 0.5
    assert scipy.optimize.check_grad(dual_function, dual_gradient, mu) <= 1e-5
    for _ in range(5):
        weights = rng.random(7) + 0.1
        bound, primal = gaussian_dual(gram, weights)
        correlation = random_gram(rng, 7, rows=3) + np.eye(7)
        correlation /= np.sqrt(np.outer(np.diag(correlation), np.diag(correlation)))
        for candidate in (np.eye(7), correlation, primal / np.diag(primal).max()):
            assert bound <= unit_error(gram, candidate) * (1 + 1e-10)


def test_full_rank_matches_complete_pidentity() -> None:
    """With p = n the Gaussian p-Identity covers every unit-diagonal X: same optimum."""
    rng = np.random.default_rng(31)
    gram = random_gram(rng, 8, rows=5)  # rank deficient on purpose
    gram += np.diag(rng.random(8))
    full = optimize_full_rank(gram, tolerance=1e-8)
    complete = optimize_pidentity(gram, p=8, noise="gaussian", rng=rng, restarts=2)
    assert full.total_error <= complete.total_error * (1 + 1e-6)
    assert complete.total_error <= full.total_error * (1 + 1e-3)


def test_full_rank_handles_unused_cells_and_zero_workload() -> None:
    gram = np.zeros((5, 5))
    gram[:3, :3] = all_range_gram(3)
    solution = optimize_gaussian_full_rank(gram)
    np.testing.assert_allclose(np.diag(solution.strategy_gram), 1.0)
    assert solution.unit_error == pytest.approx(
        optimize_gaussian_full_rank(all_range_gram(3)).unit_error
    )
    assert optimize_gaussian_full_rank(np.zeros((3, 3))).unit_error == 0.0


# ------------------------------------------------------------------------------------------------
# Optimisers: bounds, Kronecker alternation, union choice, reproducibility
# ------------------------------------------------------------------------------------------------


def test_laplace_pidentity_beats_identity_and_hierarchy() -> None:
    n = 64
    gram = all_range_gram(n)
    result = optimize_pidentity(
        gram, p=4, noise="laplace", rng=np.random.default_rng(1), restarts=1
    )
    rows, columns = result.factors[0].shape  # a row of Θ driven to 0 is left out
    assert n < rows <= n + 4 and columns == n
    assert np.all(result.factors[0] >= 0)
    assert column_sensitivity(result.factors[0], noise="laplace") == pytest.approx(1.0, rel=1e-12)
    assert result.total_error < 0.8 * float(np.trace(gram))  # identity: tr(G)
    assert expected_total_error([(gram,)], result, noise="laplace") == pytest.approx(
        result.total_error, rel=1e-8
    )


def test_identity_wins_ties_and_unused_rows_are_dropped() -> None:
    """Small all-range workloads: no Laplace p-Identity beats the identity (Θ = 0 is a local
    minimum), and the identity is then returned without empty extra rows."""
    gram = all_range_gram(12)
    solution, _, _ = optimize_factor(gram, noise="laplace", rng=np.random.default_rng(0), p=2)
    assert solution.template == "identity"
    np.testing.assert_array_equal(solution.strategy, np.eye(12))
    theta = np.zeros((3, 4))
    theta[1] = [0.0, 1.0, 2.0, 0.0]
    strategy = PIdentityFactor(theta, noise="laplace").dense()
    assert strategy.shape == (5, 4)
    np.testing.assert_allclose(strategy[4], [0.0, 0.5, 2.0 / 3.0, 0.0])


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_pidentity_factor_equals_its_dense_matrix(noise: str) -> None:
    """Θ-only p-Identity factor: every product, norm and the Woodbury Gram inverse against the
    dense ``[I; Θ] diag(1/s)``; all-zero rows of Θ are left out."""
    rng = np.random.default_rng(5)
    theta = rng.random((4, 9)) if noise == "laplace" else rng.standard_normal((4, 9))
    theta[2] = 0.0
    factor = PIdentityFactor(theta, noise=noise)
    dense = factor.dense()
    used = np.delete(theta, 2, axis=0)
    scales = 1 + used.sum(axis=0) if noise == "laplace" else np.sqrt(1 + (used**2).sum(axis=0))
    np.testing.assert_allclose(dense, np.vstack([np.eye(9), used]) / scales, rtol=1e-14)
    assert factor.shape == (12, 9)
    np.testing.assert_allclose(factor.gram(), dense.T @ dense, rtol=1e-12)
    inverse, full_rank = factor.gram_inverse()
    assert full_rank
    np.testing.assert_allclose(inverse, np.linalg.inv(dense.T @ dense), rtol=1e-9, atol=1e-12)
    x, y = rng.standard_normal((9, 3)), rng.standard_normal((12, 2))
    np.testing.assert_allclose(factor.matmat(x), dense @ x, rtol=1e-12)
    np.testing.assert_allclose(factor.rmatmat(y), dense.T @ y, rtol=1e-12)
    np.testing.assert_allclose(factor.matvec(x[:, 0]), dense @ x[:, 0], rtol=1e-12)
    for norm in (1, 2):
        expected = (np.abs(dense) ** norm).sum(axis=0) ** (1 / norm)
        np.testing.assert_allclose(factor.column_norms(norm=norm), expected, rtol=1e-12)
    assert factor.sensitivity(norm=1 if noise == "laplace" else 2) == pytest.approx(1.0)
    assert factor.max_abs() == pytest.approx(np.abs(dense).max())
    np.testing.assert_allclose(factor.row_norms_squared(), (dense**2).sum(axis=1), rtol=1e-12)
    zero = PIdentityFactor(np.zeros((2, 9)), noise=noise)  # Θ = 0 is the identity
    assert zero.shape == (9, 9)
    np.testing.assert_array_equal(zero.gram_inverse()[0], np.eye(9))
    with pytest.raises(ValueError, match="theta must be >= 0"):
        PIdentityFactor(-theta - 1.0, noise="laplace")
    with pytest.raises(ValueError, match=r"theta \(shape \(9,\)\) must be a p × n matrix"):
        PIdentityFactor(theta[0], noise=noise)
    with pytest.raises(ValueError, match="norm"):
        factor.column_norms(norm=3)


def test_kron_template_keeps_pidentity_factors_as_theta() -> None:
    """A Kronecker template's operators equal its dense factors; p-Identity ones are Θ-only and
    identity ones sparse."""
    terms = [(all_range_gram(64), np.eye(3))]
    result = optimize_kron(terms, noise="laplace", rng=np.random.default_rng(3))
    assert result.factor_templates == ("pidentity", "identity")
    operators = result.factor_operators()
    assert isinstance(operators[0], PIdentityFactor)
    assert result.thetas[0] is not None and result.thetas[1] is None
    for operator, dense in zip(operators, result.factors, strict=True):
        np.testing.assert_allclose(operator.dense(), dense, rtol=1e-12, atol=1e-15)


def test_kron_single_term_gaussian_is_certified_optimal() -> None:
    terms = [(all_range_gram(16), prefix_gram(8))]
    result = optimize_kron(terms, noise="gaussian", rng=np.random.default_rng(0))
    assert result.factor_templates == ("fullrank", "fullrank")
    assert result.lower_bound is not None
    assert result.lower_bound <= result.total_error <= result.lower_bound * (1 + 3e-5)
    assert svd_bound(terms) <= result.lower_bound
    assert expected_total_error(terms, result, noise="gaussian") == pytest.approx(
        result.total_error, rel=1e-8
    )


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_kron_union_improves_on_identity_and_reports_its_error(noise: str) -> None:
    terms = [(all_range_gram(32), np.eye(6)), (np.ones((32, 32)), prefix_gram(6))]
    result = optimize_kron(terms, noise=noise, rng=np.random.default_rng(2), ps=[2, None])
    identity_error = expected_total_error(
        terms, dense_strategy((np.eye(32), np.eye(6))), noise=noise
    )
    assert result.total_error < identity_error
    assert expected_total_error(terms, result, noise=noise) == pytest.approx(
        result.total_error, rel=1e-8
    )
    assert result.sensitivity == pytest.approx(1.0, rel=1e-9)


MARGINAL_SIZES = (3, 4, 5, 2)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_marginals_template_on_two_way_marginals(noise: str) -> None:
    subsets = [(0, 1), (1, 2), (2, 3), (0, 3)]
    terms = marginal_terms(subsets, MARGINAL_SIZES)
    by_subsets = optimize_marginals(
        subsets, MARGINAL_SIZES, noise=noise, rng=np.random.default_rng(4)
    )
    by_terms = optimize_marginals(terms, MARGINAL_SIZES, noise=noise, rng=np.random.default_rng(4))
    assert by_subsets.total_error == pytest.approx(by_terms.total_error, rel=1e-6)
    assert expected_total_error(terms, by_terms, noise=noise) == pytest.approx(
        by_terms.total_error, rel=1e-8
    )
    assert by_terms.sensitivity == pytest.approx(1.0, rel=1e-12)
    workload_itself = np.zeros(16)
    for subset in subsets:
        workload_itself[subset_mask(subset, 4)] = 1.0
    baseline = marginals_sensitivity(workload_itself, noise=noise) ** 2 * marginals_unit_error(
        workload_itself, workload_projections(terms), MARGINAL_SIZES
    )
    assert by_terms.total_error <= baseline * (1 + 1e-9)
    assert svd_bound(terms) <= by_terms.total_error


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize(
    "workload",
    ["all-range-32", "prefix-x-identity", "marginals-3x4x5x2", "range-and-marginal-union"],
)
def test_svd_bound_never_above_optimised_error(noise: str, workload: str) -> None:
    terms = {
        "all-range-32": [(all_range_gram(32),)],
        "prefix-x-identity": [(prefix_gram(8), np.eye(5))],
        "marginals-3x4x5x2": marginal_terms([(0, 1), (2,), (1, 3)], MARGINAL_SIZES),
        "range-and-marginal-union": [(all_range_gram(8), np.ones((4, 4))), (np.eye(8), np.eye(4))],
    }[workload]
    result = optimize_workload(terms, noise=noise, rng=np.random.default_rng(5))
    assert svd_bound(terms) <= result.total_error * (1 + 1e-12)
    assert result.total_error == pytest.approx(min(result.details.values()), rel=1e-12)
    assert expected_total_error(terms, result, noise=noise) == pytest.approx(
        result.total_error, rel=1e-7
    )


def test_optimize_workload_prefers_marginals_for_marginal_workloads() -> None:
    terms = marginal_terms([(0, 1), (1, 2), (0, 2)], (6, 6, 6))
    result = optimize_workload(terms, noise="gaussian", rng=np.random.default_rng(6))
    assert result.kind == "marginals"
    assert set(result.details) == {"kron", "marginals"}


@pytest.mark.parametrize(
    "optimiser",
    ["pidentity-laplace", "pidentity-gaussian", "kron-laplace", "marginals-laplace"],
)
def test_optimisation_is_reproducible_for_a_seed(optimiser: str) -> None:
    def run(seed: int) -> OptimizedStrategy:
        rng = np.random.default_rng(seed)
        if optimiser == "pidentity-laplace":
            return optimize_pidentity(all_range_gram(24), p=3, noise="laplace", rng=rng)
        if optimiser == "pidentity-gaussian":
            return optimize_pidentity(prefix_gram(24), p=3, noise="gaussian", rng=rng)
        if optimiser == "kron-laplace":
            return optimize_kron(
                [(all_range_gram(8), prefix_gram(6))], noise="laplace", rng=rng, restarts=2
            )
        return optimize_marginals([(0, 1), (1, 2)], (3, 4, 5), noise="laplace", rng=rng)

    first, second = run(42), run(42)
    assert first.total_error == second.total_error
    for a, b in zip(first.factors, second.factors, strict=True):
        np.testing.assert_array_equal(a, b)
    if first.weights is not None:
        np.testing.assert_array_equal(first.weights, second.weights)


def test_strategy_arrays_are_read_only() -> None:
    result = optimize_pidentity(
        all_range_gram(8), p=1, noise="laplace", rng=np.random.default_rng(0)
    )
    with pytest.raises(ValueError, match="read-only"):
        result.factors[0][0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        result.thetas[0][0, 0] = 1.0  # type: ignore[index]


# ------------------------------------------------------------------------------------------------
# Validators: every one fires
# ------------------------------------------------------------------------------------------------

RNG = np.random.default_rng(0)
GOOD = all_range_gram(4)


VALIDATOR_CASES = [
    (lambda: validate_gram(np.ones((2, 3))), "must be a non-empty square matrix"),
    (lambda: validate_gram(np.array([[1.0, np.nan], [np.nan, 1.0]])), "must be finite"),
    (lambda: validate_gram(np.array([[1.0, 2.0], [0.0, 1.0]])), "must be symmetric"),
    (lambda: validate_gram(-np.eye(2)), "negative diagonal entry"),
    (lambda: validate_terms([]), "terms must be a non-empty sequence"),
    (lambda: validate_terms([()]), "terms[0] must be a non-empty tuple"),
    (lambda: validate_terms([(GOOD,), (np.eye(3),)]), "terms[1] has attribute sizes (3,)"),
    (
        lambda: optimize_pidentity(GOOD, p=1, noise="poisson", rng=RNG),
        "noise ('poisson') must be one of",
    ),
    (lambda: optimize_pidentity(GOOD, p=0, noise="laplace", rng=RNG), "p (0) must be in [1, 4n]"),
    (
        lambda: optimize_pidentity(GOOD, p=1, noise="laplace", rng=RNG, restarts=0),
        "restarts (0) must be >= 1",
    ),
    (lambda: optimize_full_rank(GOOD, tolerance=0.0), "tolerance (0.0) must be > 0"),
    (lambda: optimize_full_rank(GOOD, max_iterations=0), "max_iterations (0) must be >= 1"),
    (lambda: optimize_kron([(GOOD,)], noise="laplace", rng=RNG, ps=[1, 1]), "ps has 2 entries"),
    (
        lambda: optimize_kron([(GOOD,)], noise="laplace", rng=RNG, ps=[99]),
        "ps entry (99) must be in [1, 4n]",
    ),
    (lambda: optimize_marginals([], (2,), noise="laplace", rng=RNG), "workload must not be empty"),
    (lambda: optimize_marginals([(0,), (np.eye(2),)], (2,), noise="laplace", rng=RNG), "not a mix"),
    (
        lambda: optimize_marginals([(np.eye(3),)], (2,), noise="laplace", rng=RNG),
        "domain_sizes is (2,)",
    ),
    (
        lambda: optimize_marginals([(5,)], (2,), noise="laplace", rng=RNG),
        "attribute index (5) must be in [0, 1)",
    ),
    (lambda: validate_domain_sizes(()), "the marginals algebra needs 1 to 20"),
    (lambda: validate_domain_sizes((2, 0)), "must all be >= 1"),
    (lambda: marginals_gram_apply(np.ones(3), (2,), np.ones(2)), "must have length 2^d = 2"),
    (lambda: marginals_gram_apply(np.ones(2), (2,), np.ones(3)), "must have shape (2,)"),
    (lambda: marginals_gram_pinv_apply(np.ones(3), (2,), np.ones(2)), "must have length 2^d = 2"),
    (lambda: marginal_measurements_transpose(np.ones(2), (2,), np.ones(2)), "are too short"),
    (lambda: marginal_measurements_transpose(np.ones(2), (2,), np.ones(4)), "must have length 3"),
    (lambda: PIdentityFactor(-np.ones((1, 2)), noise="laplace").dense(), "theta must be >= 0"),
    (lambda: PIdentityFactor(np.ones(2), noise="gaussian").dense(), "must be a p × n matrix"),
    (lambda: column_sensitivity(np.eye(2), noise="l3"), "noise ('l3') must be one of"),
    (
        lambda: factor_grams(
            OptimizedStrategy(
                kind="marginals",
                domain_sizes=(3,),
                objective_noise="laplace",
                total_error=0.0,
                sensitivity=1.0,
                restarts=1,
                seconds=0.0,
                weights=np.ones(2),
            )
        ),
        "has no per-attribute factors",
    ),
    (
        lambda: expected_total_error([(np.eye(3),)], dense_strategy((np.eye(2),)), noise="laplace"),
        "the strategy has (2,)",
    ),
]


@pytest.mark.parametrize(
    ("call", "message"), VALIDATOR_CASES, ids=[message for _, message in VALIDATOR_CASES]
)
def test_validators_fire(call, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# ------------------------------------------------------------------------------------------------
# Time limits, progress, Ctrl-C and cost prediction
# ------------------------------------------------------------------------------------------------

UNION_TERMS = [
    (all_range_gram(16), prefix_gram(8)),
    (np.eye(16), np.ones((8, 8))),
    (np.ones((16, 16)), all_range_gram(8)),
]


def _ticking(clock, seconds: float, fractions: list[float]):
    """A progress callback that lets ``seconds`` pass on every report."""

    def tick(fraction: float, message: str) -> None:
        assert isinstance(message, str) and message
        fractions.append(fraction)
        clock.advance(seconds)

    return tick


def _valid(terms, result: OptimizedStrategy, noise: str) -> None:
    """Supports the workload, reports its own exact error, no worse than the identity."""
    recomputed = expected_total_error(terms, result, noise=noise)
    assert math.isfinite(result.total_error)
    assert recomputed == pytest.approx(result.total_error, rel=1e-8)
    identity = sum(math.prod(float(np.trace(g)) for g in term) for term in terms)
    assert result.total_error <= identity * (1 + 1e-12)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_pidentity_time_limit_returns_the_best_point_so_far(
    noise: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = install_fake_clock(monkeypatch)
    fractions: list[float] = []
    gram = all_range_gram(32)
    result = optimize_pidentity(
        gram,
        p=2,
        noise=noise,
        rng=np.random.default_rng(0),
        restarts=2,
        time_limit=5.0,
        progress=_ticking(clock, 1.0, fractions),
    )
    assert result.stopped_early
    assert 1 <= result.iterations <= 6
    _valid([(gram,)], result, noise)
    assert result.total_error < float(np.trace(gram))  # a few iterations already beat identity
    assert all(0.0 <= f <= 1.0 for f in fractions)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_kron_union_time_limit_is_consistent(noise: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = install_fake_clock(monkeypatch)
    fractions: list[float] = []
    result = optimize_kron(
        UNION_TERMS,
        noise=noise,
        rng=np.random.default_rng(0),
        restarts=2,
        time_limit=4.0,
        progress=_ticking(clock, 1.0, fractions),
    )
    assert result.stopped_early
    _valid(UNION_TERMS, result, noise)
    assert all(0.0 <= f <= 1.0 for f in fractions)


def test_full_rank_time_limit_keeps_its_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = install_fake_clock(monkeypatch)
    fractions: list[float] = []
    gram = prefix_gram(48)
    full = optimize_full_rank(gram)
    stopped = optimize_full_rank(gram, time_limit=1.5, progress=_ticking(clock, 1.0, fractions))
    assert stopped.stopped_early and not full.stopped_early
    assert stopped.iterations < full.iterations
    _valid([(gram,)], stopped, "gaussian")
    assert stopped.lower_bound is not None and full.lower_bound is not None
    assert stopped.lower_bound <= full.total_error * (1 + 1e-9)  # still a valid lower bound
    assert stopped.total_error >= full.total_error * (1 - 1e-9)
    assert all(0.0 <= f <= 1.0 or math.isnan(f) for f in fractions)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_zero_time_limit_still_returns_a_strategy(noise: str) -> None:
    workload = optimize_workload(
        UNION_TERMS, noise=noise, rng=np.random.default_rng(0), time_limit=0.0
    )
    assert workload.stopped_early and set(workload.details) == {"kron"}
    _valid(UNION_TERMS, workload, noise)
    marginals = optimize_marginals(
        [(0, 1), (1, 2)], (3, 4, 5), noise=noise, rng=np.random.default_rng(0), time_limit=0.0
    )
    assert marginals.stopped_early and math.isfinite(marginals.total_error)
    gram = all_range_gram(12)
    assert optimize_full_rank(gram, time_limit=0.0).total_error == pytest.approx(np.trace(gram))
    single = optimize_pidentity(
        gram, p=1, noise=noise, rng=np.random.default_rng(0), time_limit=0.0
    )
    assert single.stopped_early and single.total_error == pytest.approx(np.trace(gram))


def test_generous_time_limit_changes_nothing() -> None:
    fractions: list[float] = []
    plain = optimize_workload(UNION_TERMS, noise="laplace", rng=np.random.default_rng(3))
    limited = optimize_workload(
        UNION_TERMS,
        noise="laplace",
        rng=np.random.default_rng(3),
        time_limit=1e6,
        progress=lambda f, m: fractions.append(f),
    )
    assert not plain.stopped_early and not limited.stopped_early
    assert plain.total_error == limited.total_error and dict(plain.details) == dict(limited.details)
    for a, b in zip(plain.factors, limited.factors, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fractions and fractions[-1] == 1.0
    assert all(0.0 <= f <= 1.0 or math.isnan(f) for f in fractions)


def test_ctrl_c_propagates_from_the_optimisers() -> None:
    def interrupt(fraction: float, message: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        optimize_workload(UNION_TERMS, noise="laplace", rng=RNG, progress=interrupt)
    with pytest.raises(KeyboardInterrupt):
        optimize_full_rank(prefix_gram(24), time_limit=60.0, progress=interrupt)


def test_predictors_grow_with_size() -> None:
    assert predict_factor_seconds(1, noise="laplace") == 0.0
    for noise in ("laplace", "gaussian"):
        small = predict_seconds((64,), noise=noise)
        large = predict_seconds((1024,), noise=noise)
        assert 0 < small < large
        assert predict_seconds((64, 32), num_terms=3, noise=noise) > predict_seconds(
            (64, 32), noise=noise
        )
    assert predict_factor_seconds(8192, noise="gaussian") == pytest.approx(
        predict_pidentity_seconds(8192)
    )


PREDICTOR_CASES = [
    (lambda: predict_seconds((4,), noise="poisson"), "noise ('poisson') must be one of"),
    (lambda: predict_seconds((4,), noise="laplace", num_terms=0), "num_terms (0) must be >= 1"),
    (lambda: predict_seconds((4, 0), noise="laplace"), "must all be >= 1"),
]


@pytest.mark.parametrize(
    ("call", "message"), PREDICTOR_CASES, ids=[message for _, message in PREDICTOR_CASES]
)
def test_predictor_validators(call, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# Seeds whose Laplace start, before the cancellation guard, ran Θ off to 1e9–1e13 on this workload
# (its last two cells are only ever summed) and reported unit errors of -96 to -6e11.
@pytest.mark.parametrize("seed", [60, 464, 1119])
def test_pidentity_never_trusts_a_loss_lost_to_cancellation(seed: int) -> None:
    workload = np.array([[1.0, -1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    gram = workload.T @ workload
    theta, error, _, _ = optimize_pidentity_factor(
        gram, p=1, noise="laplace", rng=np.random.default_rng(seed), restarts=1
    )
    strategy = PIdentityFactor(theta, noise="laplace").dense()
    dense = (
        unit_error(gram, strategy.T @ strategy) * column_sensitivity(strategy, noise="laplace") ** 2
    )
    assert 0.0 < error < np.trace(gram)  # better than the identity, and a true error
    assert error == pytest.approx(dense, rel=1e-6)


def test_pidentity_objective_refuses_a_point_whose_loss_cancelled() -> None:
    workload = np.array([[1.0, -1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    objective = PIdentityObjective(workload.T @ workload, p=1, noise="laplace")
    moderate, _ = objective(np.array([0.0, 0.0, 1e3, 1e3]))
    assert 0.0 < moderate < 3.0
    loss, gradient = objective(np.array([0.0, 0.0, 1e9, 1e9]))
    assert loss == math.inf
    assert not gradient.any()
