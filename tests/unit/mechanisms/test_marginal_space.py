"""The marginal-space mechanism: every subset-space shortcut against the dense matrices.

Small domains (sizes 2, 3, 4; one with a size-1 attribute) so ``A``, ``W`` and ``(AᵀA)⁺`` can be
formed explicitly: answers (least squares), per-query variances, per-item totals, expected error
and ``A·x`` computed from marginals only must equal the dense computation, for the Laplace
(plain marginals) and the Gaussian (centred marginals) strategies.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dprelease.mechanisms.marginal_space import (
    MECHANISM,
    MarginalSpaceStrategy,
    marginal_of,
)
from dprelease.mechanisms.primitives.marginal_strategies import (
    marginal_weights_l1,
    marginal_weights_l2,
    subset_workload,
)
from dprelease.mechanisms.primitives.operators import Identity, Prefix, Total
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import (
    CandidateUnavailable,
    MatrixMechanism,
    PlanRequest,
    StoredStrategy,
)
from dprelease.mechanisms.primitives.subset_family import down_closure
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem, axes_of, item_subset


def marginal_item(shape: tuple[int, ...], axes: tuple[int, ...], name: str) -> WorkloadItem:
    return WorkloadItem(
        name=name,
        factors=tuple(Identity(n) if i in axes else Total(n) for i, n in enumerate(shape)),
    )


def marginals_workload(shape: tuple[int, ...], subsets: list[tuple[int, ...]]) -> Workload:
    items = tuple(marginal_item(shape, axes, f"m{''.join(map(str, axes))}") for axes in subsets)
    return Workload(domain_shape=shape, items=items)


def dense(operator_apply, n: int) -> np.ndarray:
    """Columns A·e_j of a linear map on n cells."""
    return np.column_stack([operator_apply(e) for e in np.eye(n)])


def plan_request(
    workload: Workload,
    *,
    target: PrivacyCost = PrivacyCost(measure="pure", epsilon=1.0),
    bound: int = 1,
    fingerprint: str = "ab" * 32,
) -> PlanRequest:
    return PlanRequest(
        workload=workload,
        ordered=(True,) * len(workload.domain_shape),
        target=target,
        contribution_bound=bound,
        options={},
        workload_fingerprint=fingerprint,
    )


class DictCache:
    def __init__(self) -> None:
        self.store: dict[str, StoredStrategy] = {}
        self.saves = 0

    def load(self, key: str) -> StoredStrategy | None:
        return self.store.get(key)

    def save(self, key: str, stored: StoredStrategy) -> None:
        self.saves += 1
        self.store[key] = stored


SHAPES = [(2, 3, 4), (3, 1, 2)]
WORKLOADS = [
    [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2)],  # all 1- and 2-way
    [(0, 1), (1, 2), ()],  # two 2-way marginals and the total
    [(0, 1, 2), (0,)],  # the full cell table and one 1-way
]


def strategies(workload: Workload) -> list[MarginalSpaceStrategy]:
    subset = subset_workload(workload)
    rng = np.random.default_rng(5)
    return [
        MarginalSpaceStrategy(name="t", weights=weights, parameters={})
        for weights in (marginal_weights_l1(subset, rng=rng), marginal_weights_l2(subset))
    ]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("subsets", WORKLOADS, ids=str)
def test_marginal_space_least_squares_equals_dense(
    shape: tuple[int, ...], subsets: list[tuple[int, ...]], rng: np.random.Generator
) -> None:
    workload = marginals_workload(shape, subsets)
    n = workload.num_cells
    for strategy in strategies(workload):
        a = dense(strategy.to_union().apply, n)
        x = rng.integers(0, 30, n).astype(np.float64)
        np.testing.assert_allclose(strategy.apply(x), a @ x, atol=1e-10)
        y = a @ x + rng.normal(size=a.shape[0])
        x_hat = np.linalg.pinv(a) @ y
        covariance = np.linalg.pinv(a.T @ a)
        answers = strategy.answers(y, workload)
        for item in workload.items:
            w = dense(item.answer, n)
            np.testing.assert_allclose(answers[item.name], w @ x_hat, atol=1e-9)
            exact = w @ covariance @ w.T
            np.testing.assert_allclose(
                strategy.item_unit_variances(item, workload), np.diag(exact), rtol=1e-9
            )
            assert strategy.item_unit_total(item, workload) == pytest.approx(np.trace(exact))


def test_expected_error_equals_the_dense_computation_and_the_full_vector_path() -> None:
    """Expected total error (evaluate) = σ²·tr(W (AᵀA)⁺ Wᵀ) with the dense A; the same strategy
    measured as a full-vector union (the matrix mechanism) predicts the same error."""
    shape = (2, 3, 4)
    workload = marginals_workload(shape, WORKLOADS[0])
    for target in (PrivacyCost(measure="pure", epsilon=1.0), PrivacyCost(measure="zcdp", rho=0.5)):
        request = plan_request(workload, target=target, bound=2)
        strategy = MECHANISM.plan(request, cache=DictCache())
        evaluation = MECHANISM.evaluate(strategy, request)
        a = dense(strategy.to_union().apply, workload.num_cells)
        w = np.vstack([dense(item.answer, workload.num_cells) for item in workload.items])
        norm = 1 if target.measure == "pure" else 2
        sensitivity = np.linalg.norm(a, ord=norm, axis=0).max() * 2
        assert evaluation.sensitivity == pytest.approx(sensitivity)
        variance = 2 * evaluation.noise_scale**2 if norm == 1 else evaluation.noise_scale**2
        dense_total = variance * np.trace(w @ np.linalg.pinv(a.T @ a) @ w.T)
        assert evaluation.total_variance == pytest.approx(dense_total, rel=1e-9)
        full_vector = MatrixMechanism().evaluate(strategy.to_union(), request)
        assert full_vector.total_variance == pytest.approx(evaluation.total_variance, rel=1e-9)


def test_gaussian_strategy_reaches_the_svd_bound() -> None:
    shape = (2, 3, 4)
    workload = marginals_workload(shape, WORKLOADS[0])
    weights = marginal_weights_l2(subset_workload(workload))
    singular = np.linalg.svd(
        np.vstack([dense(item.answer, workload.num_cells) for item in workload.items]),
        compute_uv=False,
    )
    bound = singular.sum() ** 2 / workload.num_cells
    assert weights.unit_total_error == pytest.approx(bound, rel=1e-9)


def test_components_refuse_an_unsupported_subset() -> None:
    shape = (2, 3, 4)
    workload = marginals_workload(shape, [(0,)])
    strategy = strategies(workload)[0]
    with pytest.raises(ValueError, match=r"measures no marginal covering \[\(1,\)\]"):
        strategy.components(np.zeros(strategy.num_queries), needed=[0b010])
    with pytest.raises(ValueError, match="y has 1 answers"):
        strategy.answers(np.zeros(1), workload)


def test_answers_refuse_a_non_marginal_item() -> None:
    shape = (4, 3)
    workload = marginals_workload(shape, [(0,)])
    strategy = strategies(workload)[0]
    other = Workload(
        domain_shape=shape, items=(WorkloadItem(name="cdf", factors=(Prefix(4), Total(3))),)
    )
    with pytest.raises(ValueError, match="item 'cdf' is not a marginal"):
        strategy.answers(np.zeros(strategy.num_queries), other)


def test_laplace_plan_beats_measuring_each_marginal_separately() -> None:
    """The planned L1 weights: clearly better than equal ε per marginal, in the plan's own units."""
    shape = (2, 30, 30, 5, 2)
    subsets = list(itertools.combinations(range(5), 2))
    workload = marginals_workload(shape, subsets)
    request = plan_request(workload, fingerprint="12" * 32)
    strategy = MECHANISM.plan(request, cache=DictCache())
    separate = len(subsets) ** 2 * workload.num_queries  # Δ₁ = K, unit noise per marginal cell
    assert strategy.weights.unit_total_error < 0.6 * separate
    unit_total = sum(strategy.item_unit_total(item, workload) for item in workload.items)
    assert strategy.sensitivity(noise="laplace") ** 2 * unit_total == pytest.approx(
        strategy.weights.unit_total_error, rel=1e-9
    )


def test_plan_is_cached_and_rebuilt_identically() -> None:
    workload = marginals_workload((2, 3, 4), WORKLOADS[0])
    request = plan_request(workload, fingerprint="cd" * 32)
    cache = DictCache()
    first = MECHANISM.plan(request, cache=cache)
    second = MECHANISM.plan(request, cache=cache)
    assert cache.saves == 1
    np.testing.assert_array_equal(first.weights.weights, second.weights.weights)
    assert first.parameters == second.parameters
    assert first.parameters["template"] == "marginals"
    assert MECHANISM.predicted_seconds(request) > 0


def test_unavailable_for_non_marginal_items_and_too_many_subsets() -> None:
    base = dict(
        ordered=(True,),
        target=PrivacyCost(measure="pure", epsilon=1.0),
        contribution_bound=1,
        options={},
        workload_fingerprint="ef" * 32,
    )
    workload = Workload(domain_shape=(4,), items=(WorkloadItem(name="cdf", factors=(Prefix(4),)),))
    request = PlanRequest(workload=workload, **base)
    assert MECHANISM.unavailable_reason(request) == (
        "answers marginals only; item 'cdf' has other queries"
    )
    with pytest.raises(CandidateUnavailable, match="marginals only"):
        MECHANISM.plan(request, cache=DictCache())
    wide = marginals_workload((2,) * 21, [(0, 1)])  # beyond the whole lattice: its closure
    assert (
        MECHANISM.unavailable_reason(
            PlanRequest(workload=wide, **{**base, "ordered": (True,) * 21})
        )
        is None
    )
    huge = marginals_workload((2,) * 30, [tuple(range(30))])
    reason = MECHANISM.unavailable_reason(
        PlanRequest(workload=huge, **{**base, "ordered": (True,) * 30})
    )
    assert reason == (
        "the tables have up to 1,073,741,824 attribute subsets below them; at most 20,000,000"
    )


def test_subset_helpers() -> None:
    assert down_closure([0b101]) == [0, 1, 4, 5]
    assert axes_of(0b110, 3) == (1, 2)
    assert item_subset(marginal_item((2, 3), (1,), "b")) == 0b10
    assert item_subset(WorkloadItem(name="p", factors=(Prefix(2), Total(3)))) is None
    x = np.arange(6.0)
    np.testing.assert_array_equal(marginal_of(x, (2, 3), (1,)), [3.0, 5.0, 7.0])
    assert marginal_of(x, (2, 3), ()) == 15.0
