"""Per-item weights (issue 28): what each optimising mechanism minimises is
``Σ_t w_t tr(W_tᵀW_t (AᵀA)⁺)`` — checked against dense matrices on small domains — while every
figure reported of a strategy stays unweighted, and unit weights change nothing."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dprelease.catalog.planning.planner import plan_request
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms import eigen, lrm, marginal_space, optimized
from dprelease.mechanisms.primitives.marginal_objectives import marginal_weights_max_variance
from dprelease.mechanisms.primitives.marginal_strategies import (
    marginal_weights_l2,
    subset_workload,
)
from dprelease.mechanisms.primitives.operators import Prefix, Total
from dprelease.mechanisms.primitives.protocol import PlanRequest, Strategy
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

SHAPE = (3, 2, 3)
PAIRS = ((0, 1), (0, 2), (1, 2))


def _marginals(weights: dict[int, float] | None = None) -> Workload:
    """All 2-way marginals of ``SHAPE`` plus the 1-way ``(0,)``; ``weights`` by item index."""
    weights = weights or {}
    kept = (*PAIRS, (0,))
    return Workload(
        domain_shape=SHAPE,
        items=tuple(
            WorkloadItem.marginal(
                name=f"t{k}", domain_shape=SHAPE, kept=axes, weight=weights.get(k, 1.0)
            )
            for k, axes in enumerate(kept)
        ),
    )


def _dense_item(item: WorkloadItem) -> np.ndarray:
    return Workload(domain_shape=SHAPE, items=(item,)).dense_matrix()


def _brute_gram(workload: Workload) -> np.ndarray:
    """``Σ_t w_t W_tᵀW_t`` from each item's explicit query matrix."""
    return sum(item.weight * _dense_item(item).T @ _dense_item(item) for item in workload.items)


def _explicit(strategy: Strategy, num_cells: int) -> np.ndarray:
    """The strategy's ``A`` column by column (``A e_j``). O(N · cost of apply)."""
    return np.column_stack([strategy.apply(column) for column in np.eye(num_cells)])


def _weighted_trace(a: np.ndarray, gram: np.ndarray, *, norm: int) -> float:
    """``Δ(A)² tr(G (AᵀA)⁺)``: the weighted unit total of strategy ``A``."""
    sensitivity = np.linalg.norm(a, ord=norm, axis=0).max()
    return float(sensitivity**2 * np.trace(gram @ np.linalg.pinv(a.T @ a)))


def _request(spec_items: list[dict], *, privacy: dict[str, float], tmp: Path) -> PlanRequest:
    from dprelease.catalog.planning.planner import build_workload

    spec = parse_spec(
        {
            "name": "weights",
            "dataset": {"id": "weights", "budget": {"epsilon": 10, "delta": 1e-6}},
            "domain": {"a": {"min": 0, "max": 5}, "b": {"values": ["x", "y", "z"]}},
            "workload": spec_items,
            "privacy": privacy,
        }
    )
    return plan_request(spec, workload=build_workload(spec), requested=True)


def test_weighted_projections_are_traces_of_the_weighted_gram() -> None:
    workload = _marginals({0: 10.0, 3: 0.25})
    gram = _brute_gram(workload)
    np.testing.assert_allclose(workload.dense_gram(weighted=True), gram, rtol=1e-13, atol=1e-12)
    subset = subset_workload(workload, weighted=True)
    # g_T = tr(G_w Q_T), Q_T = ⊗ (I − J/n if i ∈ T else J/n)
    family = subset.family
    for position, mask in enumerate(family.masks_at(range(len(family)))):
        factors = [
            np.eye(n) - 1.0 / n if mask >> i & 1 else np.full((n, n), 1.0 / n)
            for i, n in enumerate(SHAPE)
        ]
        projector = factors[0]
        for factor in factors[1:]:
            projector = np.kron(projector, factor)
        expected = float(np.trace(gram @ projector))
        assert subset.projections[position] == pytest.approx(expected, rel=1e-12, abs=1e-9)
    unweighted = subset_workload(workload)  # the default: reported figures stay unweighted
    assert not np.allclose(unweighted.projections, subset.projections)


def test_closed_form_is_the_weighted_optimum_and_favours_the_heavy_table() -> None:
    plain, heavy = _marginals(), _marginals({0: 10.0})
    gram = _brute_gram(heavy)
    weights = marginal_weights_l2(subset_workload(heavy, weighted=True))
    strategy = marginal_space.MarginalSpaceStrategy(name="w", weights=weights)
    a = _explicit(strategy, math.prod(SHAPE))
    achieved = _weighted_trace(a, gram, norm=2)
    # the SVD bound of the weighted Gram: no L2 strategy has a lower weighted total
    spectrum = np.linalg.eigvalsh(gram)
    spectrum = np.where(spectrum > 1e-10 * spectrum.max(), spectrum, 0.0)  # round-off: rank < N
    bound = float(np.sqrt(spectrum).sum()) ** 2 / a.shape[1]
    assert achieved == pytest.approx(bound, rel=1e-9)
    assert weights.unit_total_error == pytest.approx(bound, rel=1e-9)
    # the unweighted design is worse on the weighted total, better on the plain one
    base = marginal_space.MarginalSpaceStrategy(
        name="u", weights=marginal_weights_l2(subset_workload(plain))
    )
    b = _explicit(base, math.prod(SHAPE))
    assert _weighted_trace(b, gram, norm=2) > achieved * (1 + 1e-3)
    assert _weighted_trace(b, _brute_gram(plain), norm=2) < _weighted_trace(
        a, _brute_gram(plain), norm=2
    )
    # the weighted table's cells get less variance (sensitivity 1 for both designs)
    first = heavy.items[0]
    assert strategy.uniform_unit_variance(first) < 0.9 * base.uniform_unit_variance(first)


def test_unit_weights_give_the_unweighted_design_bit_for_bit() -> None:
    ones = _marginals({k: 1.0 for k in range(4)})
    assert not ones.weighted
    weighted = marginal_weights_l2(subset_workload(ones, weighted=True))
    plain = marginal_weights_l2(subset_workload(_marginals()))
    assert np.array_equal(weighted.weights, plain.weights)
    assert weighted.unit_total_error == plain.unit_total_error


def test_max_variance_refuses_weights() -> None:
    with pytest.raises(ValueError, match="max_variance takes no item weights"):
        marginal_weights_max_variance(_marginals({1: 2.0}))


@pytest.mark.parametrize("weight", [0.0, -1.0, math.inf, math.nan])
def test_a_workload_refuses_a_weight_that_is_not_positive_and_finite(weight: float) -> None:
    item = WorkloadItem.marginal(name="t", domain_shape=SHAPE, kept=(0,), weight=weight)
    with pytest.raises(ValueError, match=r"item 't': weight \(.*\) must be a finite number > 0"):
        Workload(domain_shape=SHAPE, items=(item,))
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        WorkloadItem.marginal(name="u", domain_shape=SHAPE, kept=(0,)).with_weight(weight)


def test_with_weight_keeps_a_marginal_a_marginal() -> None:
    item = WorkloadItem.marginal(name="t", domain_shape=SHAPE, kept=(2, 0)).with_weight(3.0)
    assert item.kept == (0, 2) and item.weight == 3.0


def test_weighted_gram_terms_and_matrix_count_each_item_weight_times() -> None:
    prefix = WorkloadItem(name="cdf", factors=(Prefix(3), Total(2), Total(3)), weight=4.0)
    workload = Workload(domain_shape=SHAPE, items=(*_marginals({1: 0.5}).items, prefix))
    gram = _brute_gram(workload)
    terms = workload.gram_terms(weighted=True)
    summed = sum(np.kron(np.kron(t[0], t[1]), t[2]) for t in terms)
    np.testing.assert_allclose(summed, gram, rtol=1e-13, atol=1e-12)
    rows = workload.dense_matrix(weighted=True)
    np.testing.assert_allclose(rows.T @ rows, gram, rtol=1e-13, atol=1e-12)
    # unweighted forms untouched
    np.testing.assert_array_equal(workload.dense_gram(), _brute_gram(_unit(workload)))


def _unit(workload: Workload) -> Workload:
    return Workload(
        domain_shape=workload.domain_shape,
        items=tuple(item.with_weight(1.0) for item in workload.items),
    )


ITEMS = [
    {"name": "cdf", "prefix": "a", "weight": 20.0},
    {"name": "ab", "marginal": ["a", "b"]},
]


@pytest.mark.parametrize("privacy", [{"epsilon": 1.0}, {"rho": 0.5}])
def test_optimized_minimises_the_dense_weighted_trace(privacy: dict, tmp_path: Path) -> None:
    request = _request(ITEMS, privacy=privacy, tmp=tmp_path)
    workload = request.workload
    assert workload.weighted
    strategy = optimized.MECHANISM.plan(request, cache=StrategyStore(tmp_path / "s"))
    notes = strategy.parameters["unit_errors"]
    assert notes["union"] == "skipped: the union template does not take item weights"
    norm = 1 if "epsilon" in privacy else 2
    a = _explicit(strategy, workload.num_cells)
    achieved = _weighted_trace(a, workload.dense_gram(weighted=True), norm=norm)
    best = min(v for v in notes.values() if isinstance(v, float))
    assert achieved == pytest.approx(best, rel=1e-6)
    # and it beats the strategy optimised for the unweighted workload on the weighted total
    plain = _request(
        [{k: v for k, v in i.items() if k != "weight"} for i in ITEMS],
        privacy=privacy,
        tmp=tmp_path,
    )
    other = optimized.MECHANISM.plan(plain, cache=StrategyStore(tmp_path / "p"))
    other_total = _weighted_trace(
        _explicit(other, workload.num_cells), workload.dense_gram(weighted=True), norm=norm
    )
    assert achieved < other_total


def test_eigen_and_lrm_optimise_the_weighted_objective(tmp_path: Path) -> None:
    for mechanism, privacy in ((eigen.MECHANISM, {"rho": 0.5}), (lrm.MECHANISM, {"epsilon": 1.0})):
        norm = 1 if "epsilon" in privacy else 2
        weighted = _request(ITEMS, privacy=privacy, tmp=tmp_path)
        plain = _request(
            [{k: v for k, v in i.items() if k != "weight"} for i in ITEMS],
            privacy=privacy,
            tmp=tmp_path,
        )
        gram = weighted.workload.dense_gram(weighted=True)
        totals = [
            _weighted_trace(
                mechanism.plan(r, cache=StrategyStore(tmp_path / f"{mechanism.name}{k}")).matrix,
                gram,
                norm=norm,
            )
            for k, r in enumerate((weighted, plain))
        ]
        assert totals[0] < totals[1], mechanism.name
