"""Subset-space strategies (mechanisms.primitives.marginal_strategies) against dense matrices.

On small domains every subset-space quantity (projections, strategy Gram eigenvalues, sensitivity
in both norms, total and per-query error, support) is compared with the explicit strategy matrix
and the dense Gram; the L2 design must equal the SVD bound on marginal workloads (Li thesis
Thm 4.9, ``reference/marginals.md``); the searches must respect their time limit and report it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dprelease.mechanisms.primitives.lower_bound import svd_bound, svd_bound_gram
from dprelease.mechanisms.primitives.marginal_strategies import (
    MarginalWeights,
    SubsetWorkload,
    marginal_weights_l1,
    marginal_weights_l2,
    marginal_weights_template,
    subset_strategy,
    subset_unit_error,
    subset_workload,
)
from dprelease.mechanisms.primitives.operators import (
    AllRanges,
    Identity,
    Prefix,
    Total,
    kron_dense,
    kron_matrices,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference.marginal_algebra import superset_differences

SHAPE = (2, 3, 4)


def _marginals(shape: tuple[int, ...], subsets) -> Workload:
    return Workload(
        domain_shape=shape,
        items=tuple(
            WorkloadItem(
                name="-".join(map(str, s)) or "total",
                factors=tuple(Identity(n) if i in s else Total(n) for i, n in enumerate(shape)),
            )
            for s in subsets
        ),
    )


def _one_and_two_way(shape: tuple[int, ...] = SHAPE) -> Workload:
    d = len(shape)
    return _marginals(shape, [s for k in (1, 2) for s in itertools.combinations(range(d), k)])


def _general() -> Workload:
    return Workload(
        domain_shape=SHAPE,
        items=(
            WorkloadItem(name="mixed", factors=(Identity(2), Prefix(3), AllRanges(4))),
            WorkloadItem(name="marginal", factors=(Total(2), Identity(3), Total(4))),
        ),
    )


def _explicit_strategy(weights: MarginalWeights) -> np.ndarray:
    union = subset_strategy(weights, name="s").to_union()
    return np.vstack([t.weight * kron_dense(t.factors) for t in union.terms])


def _dense_error(workload: Workload, strategy: np.ndarray, *, norm: int) -> float:
    gram = workload.dense_gram()
    columns = np.abs(strategy).sum(0) if norm == 1 else np.sqrt((strategy**2).sum(0))
    return float(columns.max() ** 2 * np.trace(gram @ np.linalg.pinv(strategy.T @ strategy)))


def _l1(workload: Workload, **options) -> MarginalWeights:
    return marginal_weights_l1(workload, rng=np.random.default_rng(3), restarts=2, **options)


# --- the workload in subset space ------------------------------------------------------------------


@pytest.mark.parametrize("workload", [_one_and_two_way(), _general()], ids=["marginals", "general"])
def test_projections_are_traces_of_the_gram_on_each_eigenspace(workload: Workload) -> None:
    gram = workload.dense_gram()
    subset = subset_workload(workload)
    for mask in range(2 ** len(SHAPE)):
        projector = kron_matrices(
            [
                np.eye(n) - 1.0 / n if mask >> i & 1 else np.full((n, n), 1.0 / n)
                for i, n in enumerate(SHAPE)
            ]
        )
        assert subset.projections[mask] == pytest.approx(
            np.trace(gram @ projector), rel=1e-10, abs=1e-9
        )
    assert subset.diagonal == (workload.items[0].name != "mixed")


def test_marginal_gram_is_diagonal_with_the_subset_eigenvalues() -> None:
    workload = _one_and_two_way()
    subset = subset_workload(workload)
    eigenvalues = np.sort(np.linalg.eigvalsh(workload.dense_gram()))
    expected = np.sort(np.repeat(subset.eigenvalues(), subset.multiplicities().astype(int)))
    np.testing.assert_allclose(eigenvalues, expected, atol=1e-9)
    assert subset.own_subsets == (1, 2, 4, 3, 5, 6)


# --- L2: Eigen-Design in subset space ---------------------------------------------------------------


@pytest.mark.parametrize(
    "shape", [(2, 3, 4), (3, 3), (5,), (2, 1, 3)], ids=["2x3x4", "3x3", "5", "with-size-1"]
)
def test_l2_design_equals_the_svd_bound_on_marginal_workloads(shape: tuple[int, ...]) -> None:
    d = len(shape)
    workload = _marginals(
        shape, [s for k in range(d + 1) for s in itertools.combinations(range(d), k)]
    )
    result = marginal_weights_l2(workload)
    bound = svd_bound_gram(workload.dense_gram())
    assert result.unit_total_error == pytest.approx(bound, rel=1e-10)
    assert result.lower_bound == pytest.approx(bound, rel=1e-10)
    assert _dense_error(workload, _explicit_strategy(result), norm=2) == pytest.approx(
        bound, rel=1e-8
    )


def test_l2_design_is_exact_on_a_general_workload_but_not_the_bound() -> None:
    workload = _general()
    result = marginal_weights_l2(workload)
    dense = _dense_error(workload, _explicit_strategy(result), norm=2)
    assert result.unit_total_error == pytest.approx(dense, rel=1e-9)
    assert result.lower_bound is None
    assert result.unit_total_error > svd_bound(workload) * (1 + 1e-3)


def test_plain_marginals_cannot_reach_the_bound_for_one_way_marginals() -> None:
    """The plain weights the L2 optimum would need are the Möbius inverse of √λ: negative here."""
    workload = _marginals((3, 4), [(0,), (1,)])
    subset = subset_workload(workload)
    needed = superset_differences(np.sqrt(subset.eigenvalues()), 2)
    assert needed.min() < 0
    template = marginal_weights_template(workload, noise="gaussian", rng=np.random.default_rng(0))
    assert template.unit_total_error > marginal_weights_l2(workload).unit_total_error * 1.001


# --- the strategy against the dense matrices --------------------------------------------------------


@pytest.mark.parametrize("basis", ["centred", "marginal"])
@pytest.mark.parametrize("workload", [_one_and_two_way(), _general()], ids=["marginals", "general"])
def test_subset_strategy_error_sensitivity_and_variances_equal_dense(basis, workload) -> None:
    rng = np.random.default_rng(11)
    weights = MarginalWeights(
        domain_shape=SHAPE,
        basis=basis,
        weights=rng.random(2 ** len(SHAPE)) + 0.05,
        noise="gaussian",
        unit_total_error=0.0,  # not used by the strategy's own evaluation
    )
    strategy = subset_strategy(weights, name="s")
    a = _explicit_strategy(weights)
    assert strategy.num_queries == a.shape[0]
    assert strategy.sensitivity(noise="gaussian") == pytest.approx(
        np.sqrt((a**2).sum(0)).max(), rel=1e-12
    )
    assert strategy.sensitivity(noise="laplace") == pytest.approx(np.abs(a).sum(0).max(), rel=1e-12)
    np.testing.assert_allclose(np.sqrt((a**2).sum(0)), np.sqrt((a**2).sum(0)).max(), rtol=1e-12)
    covariance = np.linalg.pinv(a.T @ a)
    for item in workload.items:
        w = kron_dense(item.factors)
        variances = np.einsum("ij,jk,ik->i", w, covariance, w)
        np.testing.assert_allclose(strategy.item_unit_variances(item), variances, rtol=1e-8)
        assert strategy.item_unit_total(item) == pytest.approx(variances.sum(), rel=1e-9)
    dense = _dense_error(workload, a, norm=2)
    subset = subset_workload(workload)
    assert subset_unit_error(weights, subset.projections) == pytest.approx(dense, rel=1e-9)
    assert strategy.support_residual(workload) == 0.0


def test_unsupported_eigenspace_is_reported() -> None:
    weights = np.zeros(8)
    weights[0b011] = 1.0  # the marginal over attributes 0 and 1 only
    strategy = subset_strategy(
        MarginalWeights(
            domain_shape=SHAPE,
            basis="marginal",
            weights=weights,
            noise="laplace",
            unit_total_error=1.0,
        ),
        name="narrow",
    )
    assert strategy.support_residual(_marginals(SHAPE, [(0, 1)])) == 0.0
    assert strategy.support_residual(_marginals(SHAPE, [(2,)])) == 1.0


def test_least_squares_through_the_union_recovers_the_answers_without_noise() -> None:
    workload = _one_and_two_way()
    x = np.random.default_rng(5).integers(0, 20, size=workload.num_cells).astype(float)
    for result in (marginal_weights_l2(workload), _l1(workload)):
        strategy = subset_strategy(result, name="s")
        answers = strategy.answers(strategy.apply(x), workload)
        for item in workload.items:
            np.testing.assert_allclose(answers[item.name], item.answer(x), atol=1e-8)


# --- L1 template ------------------------------------------------------------------------------------


def test_l1_weights_match_dense_and_beat_measuring_each_marginal() -> None:
    workload = _one_and_two_way((3, 4, 5, 2))
    result = _l1(workload)
    assert result.basis == "marginal" and result.noise == "laplace" and not result.stopped_early
    a = _explicit_strategy(result)
    assert result.unit_total_error == pytest.approx(_dense_error(workload, a, norm=1), rel=1e-8)
    assert result.sensitivity(noise="laplace") == pytest.approx(1.0, rel=1e-12)
    separately = len(workload.items) ** 2 * workload.num_queries  # Δ₁ = K, variance K² per query
    assert result.unit_total_error < separately
    assert result.unit_total_error >= svd_bound(workload) * (1 - 1e-9)


def test_time_limit_returns_the_best_so_far_and_says_so() -> None:
    workload = _marginals((3, 4, 5, 2, 3, 2, 4), list(itertools.combinations(range(7), 2)))
    messages: list[tuple[float, str]] = []
    result = marginal_weights_l1(
        workload,
        rng=np.random.default_rng(1),
        restarts=50,
        time_limit=0.05,
        progress=lambda fraction, message: messages.append((fraction, message)),
    )
    assert result.stopped_early
    assert math.isfinite(result.unit_total_error)
    strategy = subset_strategy(result, name="s")
    total = sum(strategy.item_unit_total(item) for item in workload.items)
    assert result.unit_total_error == pytest.approx(total, rel=1e-9)
    assert 1 <= len(messages) < 51
    assert all(0 < fraction <= 1 and "marginals template" in text for fraction, text in messages)
    full = marginal_weights_l1(workload, rng=np.random.default_rng(1), restarts=1)
    assert not full.stopped_early


def test_l2_reports_progress_once() -> None:
    messages: list[tuple[float, str]] = []
    marginal_weights_l2(_one_and_two_way(), progress=lambda f, m: messages.append((f, m)))
    assert messages == [(1.0, "subset-space Eigen-Design: 7 centred marginals")]


def test_parameters_round_trip() -> None:
    result = _l1(_one_and_two_way())
    rebuilt = MarginalWeights.from_parameters(SHAPE, result.to_parameters())
    np.testing.assert_array_equal(rebuilt.weights, result.weights)
    assert rebuilt.unit_total_error == result.unit_total_error
    assert subset_strategy(result, name="s").parameters["template"] == "marginals"
    l2 = marginal_weights_l2(_one_and_two_way())
    assert subset_strategy(l2, name="s").parameters["template"] == "subset-eigen"


# --- validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: marginal_weights_l2(_one_and_two_way(), time_limit=0), r"time_limit \(0\)"),
        (lambda: _l1(_one_and_two_way(), time_limit=-1.0), r"time_limit \(-1.0\)"),
        (
            lambda: marginal_weights_template(
                _one_and_two_way(), noise="uniform", rng=np.random.default_rng(0)
            ),
            r"noise \('uniform'\) must be one of",
        ),
        (lambda: marginal_weights_l1(_one_and_two_way(), rng=np.random.default_rng(0), restarts=-1), r"restarts \(-1\)"),
        (
            lambda: MarginalWeights(
                domain_shape=SHAPE, basis="other", weights=np.ones(8), noise="gaussian", unit_total_error=1.0
            ),
            r"basis \('other'\)",
        ),
        (
            lambda: MarginalWeights(
                domain_shape=SHAPE, basis="centred", weights=np.ones(7), noise="gaussian", unit_total_error=1
            ),
            r"weights must be 8 finite values >= 0 \(one per subset\)",
        ),
        (
            lambda: MarginalWeights(
                domain_shape=SHAPE, basis="centred", weights=np.zeros(8), noise="gaussian", unit_total_error=1
            ),
            "must not all be 0",
        ),
        (
            lambda: MarginalWeights(
                domain_shape=SHAPE, basis="centred", weights=np.ones(8), noise="uniform", unit_total_error=1
            ),
            r"noise \('uniform'\) must be one of",
        ),
        (
            lambda: subset_workload(_marginals((2,) * 30, [tuple(range(30))])),
            "up to 1,073,741,824 attribute subsets below them; at most 20,000,000",
        ),
        (
            lambda: marginal_weights_l2(
                SubsetWorkload(
                    domain_shape=(2,), projections=np.zeros(2), diagonal=True, own_subsets=(1,)
                )
            ),
            "no non-zero query",
        ),
    ],
    ids=[
        "l2-time-limit", "l1-time-limit", "norm", "restarts", "basis", "weights-shape",
        "weights-zero", "weights-norm", "too-many-subsets", "empty-workload",
    ],
)  # fmt: skip
def test_validation_fires(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_adult_l2_design_is_at_the_bound_in_seconds() -> None:
    """Issue 19 target: all 1–3-way marginals of the 14 Adult attributes within 1% of the bound
    (here exactly at it), with no N-sized array (N = 6.4e17)."""
    sizes = (85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2)
    subsets = [s for k in (1, 2, 3) for s in itertools.combinations(range(14), k)]
    workload = _marginals(sizes, subsets)
    result = marginal_weights_l2(workload)
    bound = svd_bound(workload)
    assert bound is not None
    assert result.unit_total_error == pytest.approx(bound, rel=1e-10)
    assert math.sqrt(result.unit_total_error / workload.num_queries) == pytest.approx(
        10.665, abs=5e-4
    )
    strategy = subset_strategy(result, name="eigen")
    total = sum(strategy.item_unit_total(item) for item in workload.items)
    assert strategy.sensitivity(noise="gaussian") ** 2 * total == pytest.approx(bound, rel=1e-10)
