"""Union-of-Kronecker strategies: every block-algebra shortcut against dense matrices."""

from __future__ import annotations

import numpy as np
import pytest

from dprelease.mechanisms.primitives.noise import NoiseKind
from dprelease.mechanisms.primitives.operators import (
    AllRanges,
    Identity,
    MatrixFactor,
    Prefix,
    Ranges,
    Total,
    kron_dense,
)
from dprelease.mechanisms.primitives.operators import gram_ij_parts as ij_coefficients
from dprelease.mechanisms.primitives.strategies import (
    hierarchical_strategy,
    identity_strategy,
    total_strategy,
    wavelet_strategy,
)
from dprelease.mechanisms.primitives.union import (
    UnionStrategy,
    UnionTerm,
    optimize_weights,
    per_item_terms,
    unit_error,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

SHAPE = (6, 2, 3)
WORKLOAD = Workload(
    domain_shape=SHAPE,
    items=(
        WorkloadItem(name="cdf", factors=(Prefix(6), Total(2), Total(3))),
        WorkloadItem(name="pair", factors=(Total(6), Identity(2), Identity(3))),
        WorkloadItem(name="ranges_by_sex", factors=(AllRanges(6), Identity(2), Total(3))),
        WorkloadItem(name="some", factors=(Ranges(6, [0, 3], [2, 5]), Total(2), Identity(3))),
    ),
)


def _strategy(weights: tuple[float, ...] = (1.0, 0.7, 2.0)) -> UnionStrategy:
    return UnionStrategy(
        name="test",
        domain_shape=SHAPE,
        terms=(
            UnionTerm(
                weight=weights[0],
                factors=(hierarchical_strategy(6), identity_strategy(2), total_strategy(3)),
            ),
            UnionTerm(
                weight=weights[1],
                factors=(total_strategy(6), identity_strategy(2), identity_strategy(3)),
            ),
            UnionTerm(
                weight=weights[2],
                factors=(wavelet_strategy(6), total_strategy(2), identity_strategy(3)),
            ),
        ),
    )


def _dense(strategy: UnionStrategy) -> np.ndarray:
    return np.vstack([t.weight * kron_dense(t.factors) for t in strategy.terms])


def test_structure_splits_only_identity_total_attributes() -> None:
    structure = _strategy().structure(WORKLOAD)
    assert structure.split_axes == (1, 2) and structure.dense_axes == (0,)
    assert [m for _, m, _ in structure.blocks] == [1, 2, 1, 2]


def test_products_sensitivity_match_dense(rng: np.random.Generator) -> None:
    strategy = _strategy()
    dense = _dense(strategy)
    x = rng.normal(size=dense.shape[1])
    y = rng.normal(size=dense.shape[0])
    np.testing.assert_allclose(strategy.apply(x), dense @ x, atol=1e-12)
    np.testing.assert_allclose(strategy.apply_transpose(y), dense.T @ y, atol=1e-12)
    assert strategy.sensitivity(noise="laplace") == pytest.approx(np.abs(dense).sum(0).max())
    assert strategy.sensitivity(noise="gaussian") == pytest.approx(np.sqrt((dense**2).sum(0)).max())
    assert strategy.num_queries == dense.shape[0]


def test_least_squares_matches_dense_pseudo_inverse(rng: np.random.Generator) -> None:
    strategy = _strategy()
    dense = _dense(strategy)
    y = rng.normal(size=dense.shape[0])
    np.testing.assert_allclose(
        strategy.least_squares(y, WORKLOAD), np.linalg.pinv(dense) @ y, atol=1e-10
    )


def test_item_variances_and_totals_match_dense() -> None:
    strategy = _strategy()
    dense = _dense(strategy)
    covariance = np.linalg.pinv(dense.T @ dense)
    for item in WORKLOAD.items:
        w = kron_dense(item.factors)
        expected = np.diag(w @ covariance @ w.T)
        np.testing.assert_allclose(
            strategy.item_unit_variances(item, WORKLOAD), expected, rtol=1e-9, atol=1e-12
        )
        assert strategy.item_unit_total(item, WORKLOAD) == pytest.approx(expected.sum(), rel=1e-9)
    gram = sum(kron_dense(i.factors).T @ kron_dense(i.factors) for i in WORKLOAD.items)
    expected_unit = np.abs(dense).sum(0).max() ** 2 * np.trace(gram @ covariance)
    assert unit_error(strategy, WORKLOAD, noise="laplace") == pytest.approx(expected_unit, rel=1e-9)
    assert strategy.support_residual(WORKLOAD) < 1e-9


def test_support_residual_detects_an_unsupported_workload() -> None:
    strategy = UnionStrategy(
        name="only-totals",
        domain_shape=SHAPE,
        terms=(
            UnionTerm(
                weight=1.0, factors=(total_strategy(6), identity_strategy(2), identity_strategy(3))
            ),
        ),
    )
    assert strategy.support_residual(WORKLOAD) > 0.1


def test_ij_coefficients() -> None:
    assert ij_coefficients(np.eye(4) * 2 + 3) == pytest.approx((2.0, 3.0))
    assert ij_coefficients(np.ones((3, 3))) == pytest.approx((0.0, 1.0))
    assert ij_coefficients(Prefix(4).gram()) is None


def test_optimized_weights_beat_equal_weights_and_prune_redundant_terms() -> None:
    terms = per_item_terms(WORKLOAD, ordered=(True, False, False), family="wavelet")
    equal = UnionStrategy(
        name="equal",
        domain_shape=SHAPE,
        terms=tuple(UnionTerm(weight=1.0, factors=f) for f in terms),
    )
    optimized = optimize_weights(WORKLOAD, terms, noise="laplace", name="optimized")
    assert unit_error(optimized, WORKLOAD, noise="laplace") <= unit_error(
        equal, WORKLOAD, noise="laplace"
    )
    assert optimized.support_residual(WORKLOAD) < 1e-8
    assert max(optimized.parameters["weights"]) == pytest.approx(1.0)
    again = optimize_weights(WORKLOAD, terms, noise="laplace", name="optimized")
    assert again.parameters["weights"] == optimized.parameters["weights"]  # deterministic


def test_per_item_terms_deduplicate_shapes() -> None:
    workload = Workload(
        domain_shape=(5, 2),
        items=(
            WorkloadItem(name="cdf", factors=(Prefix(5), Total(2))),
            WorkloadItem(name="ranges", factors=(AllRanges(5), Total(2))),
            WorkloadItem(name="by", factors=(Identity(5), Identity(2))),
        ),
    )
    terms = per_item_terms(workload, ordered=(True, False), family="hierarchical")
    assert len(terms) == 2
    assert isinstance(terms[0][0], MatrixFactor) and terms[0][0].m == 9  # H_5 has 9 nodes


def test_validation_fires() -> None:
    with pytest.raises(ValueError, match=r"term weight \(0.0\) must be finite and > 0"):
        UnionTerm(weight=0.0, factors=(identity_strategy(2),))
    with pytest.raises(ValueError, match="at least one term"):
        UnionStrategy(name="x", domain_shape=(2,), terms=())
    with pytest.raises(ValueError, match="differ from the domain"):
        UnionStrategy(
            name="x",
            domain_shape=(3,),
            terms=(UnionTerm(weight=1.0, factors=(identity_strategy(2),)),),
        )


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_weight_objective_gradient_matches_finite_differences(noise: NoiseKind) -> None:
    from dprelease.mechanisms.primitives.union import _WeightProblem

    terms = per_item_terms(WORKLOAD, ordered=(True, False, False), family="hierarchical")
    problem = _WeightProblem(WORKLOAD, terms, noise=noise)
    point = np.log(np.linspace(0.6, 1.7, len(terms)))  # unequal: one column attains the max
    value, gradient = problem.value_and_log_gradient(np.exp(point))
    assert value == pytest.approx(problem(np.exp(point)))
    step = 1e-6
    for t in range(len(terms)):
        shift = np.zeros_like(point)
        shift[t] = step
        numeric = (problem(np.exp(point + shift)) - problem(np.exp(point - shift))) / (2 * step)
        assert gradient[t] == pytest.approx(numeric, rel=1e-4, abs=1e-6 * abs(value))


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_weight_objective_on_range_bases_equals_the_unit_error(noise: NoiseKind) -> None:
    """The weight problem inverts each block on a basis of its (weight-independent) range; its
    value equals the union's unit error computed from the full singular blocks, at any weights."""
    from dprelease.mechanisms.primitives.union import _WeightProblem

    terms = per_item_terms(WORKLOAD, ordered=(True, False, False), family="hierarchical")
    problem = _WeightProblem(WORKLOAD, terms, noise=noise)
    full = SHAPE[0]
    assert any(block.shape[0] < full for block in problem.workload_blocks)  # some were singular
    rng = np.random.default_rng(11)
    for weights in (np.ones(len(terms)), np.exp(rng.uniform(-3.0, 3.0, len(terms)))):
        strategy = UnionStrategy(
            name="w",
            domain_shape=SHAPE,
            terms=tuple(
                UnionTerm(weight=float(w), factors=f) for w, f in zip(weights, terms, strict=True)
            ),
        )
        expected = unit_error(strategy, WORKLOAD, noise=noise)
        assert problem(weights) == pytest.approx(expected, rel=1e-9)
