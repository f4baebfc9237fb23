"""Strategies and the matrix-mechanism test vectors of seed-mm.md (Li thesis ch. 2-3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dprelease.mechanisms.optimized.templates import PIdentityFactor
from dprelease.mechanisms.primitives.linalg import psd_inverse
from dprelease.mechanisms.primitives.operators import (
    AllRanges,
    MatrixFactor,
    Ranges,
    Total,
    kron_apply,
    kron_dense,
)
from dprelease.mechanisms.primitives.strategies import (
    KronStrategy,
    build_kron_strategy,
    hierarchical_strategy,
    identity_strategy,
    wavelet_strategy,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference.error import item_unit_total, item_unit_variances

H4 = np.array(
    [
        [1, 1, 1, 1],
        [1, 1, 0, 0],
        [0, 0, 1, 1],
        [1, 0, 0, 0],
        [0, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 0, 1],
    ],
    dtype=float,
)
Y4 = np.array([[1, 1, 1, 1], [1, 1, -1, -1], [1, -1, 0, 0], [0, 0, 1, -1]], dtype=float)


def test_fig_2_2_workload_answers() -> None:
    """Fig. 2.1/2.2: cells gradyear(2011..2014) x gender(M, F); x = (2,0,0,1,0,1,2,0); W x = (6,3,1,2,-1).

    Each query is built as a Kronecker product of per-attribute factors, as the pipeline does.
    """
    x = np.array([2, 0, 0, 1, 0, 1, 2, 0], dtype=float)
    years_2011_2012 = Ranges(4, [0], [1])
    queries = [
        (Total(4), Total(2)),
        (years_2011_2012, Total(2)),
        (years_2011_2012, MatrixFactor(np.array([[0.0, 1.0]]))),  # female
        (years_2011_2012, MatrixFactor(np.array([[1.0, 0.0]]))),  # male
        (MatrixFactor(np.array([[0.0, 0.0, 1.0, -1.0]])), Total(2)),  # 2013 minus 2014
    ]
    answers = [kron_apply(list(factors), x)[0] for factors in queries]
    np.testing.assert_allclose(answers, [6, 3, 1, 2, -1])
    workload = np.vstack([kron_dense(list(factors)) for factors in queries])
    assert np.abs(workload).sum(0).max() == 3  # L1 = 3 (seed-mm.md §7.2)
    assert np.sqrt((workload**2).sum(0)).max() == pytest.approx(math.sqrt(3))  # L2 = sqrt(3)


def test_h4_and_y4_match_the_thesis_up_to_row_order() -> None:
    h = hierarchical_strategy(4).dense()
    y = wavelet_strategy(4).dense()
    assert sorted(map(tuple, h)) == sorted(map(tuple, H4))
    assert sorted(map(tuple, y)) == sorted(map(tuple, Y4))
    # Fig. 3.3 Grams
    np.testing.assert_allclose(h.T @ h, [[3, 2, 1, 1], [2, 3, 1, 1], [1, 1, 3, 2], [1, 1, 2, 3]])
    np.testing.assert_allclose(y.T @ y, [[3, 1, 0, 0], [1, 3, 0, 0], [0, 0, 3, 1], [0, 0, 1, 3]])


@pytest.mark.parametrize(
    ("strategy", "l1", "l2"),
    [
        (identity_strategy(4), 1, 1),
        (hierarchical_strategy(4), 3, math.sqrt(3)),
        (wavelet_strategy(4), 3, math.sqrt(3)),
    ],
    ids=["I4", "H4", "Y4"],
)
def test_example_2_4_sensitivities(strategy: MatrixFactor, l1: float, l2: float) -> None:
    assert strategy.sensitivity(norm=1) == pytest.approx(l1)
    assert strategy.sensitivity(norm=2) == pytest.approx(l2)


@pytest.mark.parametrize(
    ("family", "expected"),
    [("identity", 45_001_728.0), ("hierarchical", 47_330_162.9), ("wavelet", 40_179_272.3)],
)
def test_total_error_all_ranges_n512_laplace_eps1(family: str, expected: float) -> None:
    """seed-mm.md §7.3: TOTALERROR = 2/eps^2 * L1^2 * tr(W^T W (A^T A)^-1) at n = 512, eps = 1."""
    strategy = build_kron_strategy(family, attribute_roles=[(512, "ordered")])
    item = WorkloadItem(name="ranges", factors=(AllRanges(512),))
    total = 2.0 * strategy.sensitivity(noise="laplace") ** 2 * item_unit_total(item, strategy)
    assert total == pytest.approx(expected, rel=1e-8)
    per_query = (
        2.0 * strategy.sensitivity(noise="laplace") ** 2 * item_unit_variances(item, strategy)
    )
    assert per_query.sum() == pytest.approx(total, rel=1e-10)


def test_hierarchical_any_n_and_branching() -> None:
    for n, b in [(1, 2), (5, 2), (10, 3), (100, 4), (17, 16)]:
        h = hierarchical_strategy(n, branching=b).dense()
        assert h.shape[1] == n
        assert np.linalg.matrix_rank(h) == n  # contains the leaves: full column rank
        np.testing.assert_allclose(h[0], np.ones(n))  # root counts everything
        depth = 1
        size = n
        while size > 1:
            size = math.ceil(size / b)
            depth += 1
        assert h.sum(0).max() == depth  # L1 sensitivity = number of levels


def test_binary_hierarchy_sensitivity_is_one_plus_log2_n() -> None:
    for k in range(1, 10):
        assert hierarchical_strategy(2**k).sensitivity(norm=1) == 1 + k


def test_wavelet_non_power_of_two_keeps_full_column_rank() -> None:
    for n in (3, 5, 6, 85, 100):
        y = wavelet_strategy(n).dense()
        assert y.shape[1] == n
        assert np.linalg.matrix_rank(y) == n
        assert (np.abs(y).sum(1) > 0).all()  # no empty rows


def test_validation_fires() -> None:
    with pytest.raises(ValueError, match=r"branching \(1\) must be >= 2"):
        hierarchical_strategy(8, branching=1)
    with pytest.raises(ValueError, match=r"n \(0\) must be >= 1"):
        wavelet_strategy(0)
    with pytest.raises(ValueError, match="strategy family"):
        build_kron_strategy("magic", attribute_roles=[(4, "ordered")])


def test_kronecker_strategy_shortcuts_match_dense(rng: np.random.Generator) -> None:
    strategy = build_kron_strategy(
        "hierarchical", attribute_roles=[(5, "ordered"), (3, "categorical"), (4, "total")]
    )
    dense = kron_dense(strategy.factors)
    assert strategy.sensitivity(noise="laplace") == pytest.approx(np.abs(dense).sum(0).max())
    assert strategy.sensitivity(noise="gaussian") == pytest.approx(np.sqrt((dense**2).sum(0)).max())
    assert strategy.num_queries == dense.shape[0]
    x = rng.normal(size=dense.shape[1])
    np.testing.assert_allclose(strategy.apply(x), dense @ x, atol=1e-10)
    y = rng.normal(size=dense.shape[0])
    np.testing.assert_allclose(strategy.least_squares(y), np.linalg.pinv(dense) @ y, atol=1e-8)


def test_kronecker_strategy_with_a_pidentity_factor_matches_dense(rng: np.random.Generator) -> None:
    """The Θ-only p-Identity factor (Woodbury Gram inverse) inside a product strategy."""
    strategy = KronStrategy(
        name="optimized",
        factors=(PIdentityFactor(rng.random((2, 6)), noise="laplace"), identity_strategy(3)),
    )
    dense = kron_dense(strategy.factors)
    assert strategy.sensitivity(noise="laplace") == pytest.approx(np.abs(dense).sum(0).max())
    x, y = rng.normal(size=dense.shape[1]), rng.normal(size=dense.shape[0])
    np.testing.assert_allclose(strategy.apply(x), dense @ x, atol=1e-10)
    np.testing.assert_allclose(strategy.least_squares(y), np.linalg.pinv(dense) @ y, atol=1e-8)
    item = WorkloadItem(name="w", factors=(AllRanges(6), Total(3)))
    workload = Workload(items=(item,), domain_shape=(6, 3))
    gram_w = kron_dense(item.factors).T @ kron_dense(item.factors)
    expected = np.trace(gram_w @ np.linalg.inv(dense.T @ dense))
    assert strategy.item_unit_total(item, workload) == pytest.approx(expected, rel=1e-9)
    assert strategy.support_residual(workload) == 0.0


def test_least_squares_recovers_cells_without_noise(rng: np.random.Generator) -> None:
    x = rng.integers(0, 50, size=6 * 5).astype(float)
    for family in ("identity", "hierarchical", "wavelet"):
        strategy = build_kron_strategy(family, attribute_roles=[(6, "ordered"), (5, "ordered")])
        np.testing.assert_allclose(strategy.least_squares(strategy.apply(x)), x, atol=1e-9)


def test_kron_strategy_is_frozen() -> None:
    strategy = KronStrategy(name="identity", factors=(identity_strategy(3),))
    with pytest.raises(AttributeError):
        strategy.name = "other"  # type: ignore[misc]


def test_psd_inverse_matches_the_dense_pseudo_inverse(rng: np.random.Generator) -> None:
    """Cholesky path for a well-conditioned Gram, ``pinvh`` (full rank False) for a singular one."""
    factor = rng.standard_normal((9, 6))
    full = factor.T @ factor
    inverse, full_rank = psd_inverse(full)
    assert full_rank
    np.testing.assert_allclose(inverse, np.linalg.pinv(full), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(inverse, inverse.T)
    large = rng.standard_normal((400, 300))  # several 128-row tiles, the last one partial
    inverse, full_rank = psd_inverse(large.T @ large)
    assert full_rank
    np.testing.assert_allclose(inverse, np.linalg.inv(large.T @ large), rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(inverse, inverse.T)
    scaled_identity = np.diag(np.arange(1.0, 7.0))  # the O(n²) diagonal path
    inverse, full_rank = psd_inverse(scaled_identity)
    assert full_rank
    np.testing.assert_array_equal(inverse, np.linalg.inv(scaled_identity))
    with_zero = np.diag([1.0, 0.0, 2.0])  # singular diagonal: not full rank
    inverse, full_rank = psd_inverse(with_zero)
    assert not full_rank
    np.testing.assert_allclose(inverse, np.diag([1.0, 0.0, 0.5]), atol=1e-12)
    deficient = factor[:4].T @ factor[:4]  # rank 4 of 6
    inverse, full_rank = psd_inverse(deficient)
    assert not full_rank
    np.testing.assert_allclose(inverse, np.linalg.pinv(deficient, hermitian=True), atol=1e-9)


def test_support_residual_shortcut_matches_the_dense_residual(rng: np.random.Generator) -> None:
    """A full-rank factor skips its product (M AᵀA = I); a rank-deficient one is still computed,
    and both agree with ``‖G_W (I − (AᵀA)⁺ AᵀA)‖`` on dense Kronecker matrices."""
    items = (WorkloadItem(name="w", factors=(AllRanges(4), Total(3))),)
    full = KronStrategy(name="full", factors=(MatrixFactor(H4), MatrixFactor(np.eye(3))))
    halves = MatrixFactor(np.array([[1.0, 1, 0, 0], [0, 0, 1, 1]]))  # cannot answer [0, 1]
    deficient = KronStrategy(name="halves", factors=(halves, MatrixFactor(np.ones((1, 3)))))
    workload_dense = kron_dense(items[0].factors)
    gram_w = workload_dense.T @ workload_dense
    for strategy, supported in ((full, True), (deficient, False)):
        dense = kron_dense(strategy.factors)
        gram_a = dense.T @ dense
        dense_residual = np.abs(gram_w - gram_w @ np.linalg.pinv(gram_a) @ gram_a).max()
        residual = strategy.support_residual(Workload(items=items, domain_shape=(4, 3)))
        if supported:
            assert dense_residual < 1e-9 and residual == 0.0
        else:
            assert dense_residual > 0.1 and residual > 0.1
