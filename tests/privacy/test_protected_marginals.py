"""ProtectedMarginals keeps ProtectedCells' obligations: charge before noise, the cost it
calibrated, the strategy's actual sensitivity × the contribution bound, no accessor, no pickle,
no printed value, and a refusal before any charge when a needed marginal was not counted."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

from dprelease.catalog.confidential.choke_point import ProtectedCells, ProtectedMarginals
from dprelease.mechanisms.marginal_space import MarginalSpaceStrategy, marginal_of
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.marginal_strategies import (
    marginal_weights_l1,
    marginal_weights_l2,
    subset_workload,
)
from dprelease.mechanisms.primitives.operators import Identity, Total
from dprelease.mechanisms.primitives.privacy import BudgetExceededError, PrivacyCost
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.privacy.test_noise_and_session import _SpyAccountant, _SpySampler

SHAPE = (2, 3, 4)


def _strategy(*, gaussian: bool) -> MarginalSpaceStrategy:
    items = tuple(
        WorkloadItem(
            name=f"m{a}{b}",
            factors=tuple(Identity(n) if i in (a, b) else Total(n) for i, n in enumerate(SHAPE)),
        )
        for a, b in itertools.combinations(range(3), 2)
    )
    subset = subset_workload(Workload(domain_shape=SHAPE, items=items))
    weights = (
        marginal_weights_l2(subset)
        if gaussian
        else marginal_weights_l1(subset, rng=np.random.default_rng(2))
    )
    return MarginalSpaceStrategy(name="t", weights=weights, parameters={})


def _protected(x: np.ndarray, strategy: MarginalSpaceStrategy, bound: int) -> ProtectedMarginals:
    return ProtectedMarginals(
        {axes: marginal_of(x, SHAPE, axes) for axes in strategy.marginal_subsets},
        domain_shape=SHAPE,
        contribution_bound=bound,
    )


@pytest.mark.parametrize("gaussian", [False, True], ids=["laplace", "gaussian"])
def test_charges_before_noise_with_the_strategy_sensitivity(
    monkeypatch: pytest.MonkeyPatch, gaussian: bool
) -> None:
    events: list[str] = []
    monkeypatch.setattr(noise, "production_sampler", lambda: _SpySampler(events))
    strategy = _strategy(gaussian=gaussian)
    x = np.arange(24.0)
    accountant = _SpyAccountant(events)
    target = (
        PrivacyCost(measure="zcdp", rho=0.5)
        if gaussian
        else PrivacyCost(measure="pure", epsilon=1.0)
    )
    result = _protected(x, strategy, 3).measure(
        strategy, target=target, accountant=accountant, label="t"
    )
    assert events == ["charge", "noise"]
    assert accountant.charged == [result.noise.cost]
    norm = 2 if gaussian else 1
    a = np.column_stack([strategy.to_union().apply(e) for e in np.eye(24)])
    assert result.noise.sensitivity == pytest.approx(3 * np.linalg.norm(a, ord=norm, axis=0).max())
    np.testing.assert_allclose(result.values, a @ x, atol=1e-12)
    # the same strategy through the full-vector choke point releases the same answers
    cells = ProtectedCells(x, domain_shape=SHAPE, contribution_bound=3)
    same = cells.measure(strategy, target=target, accountant=_SpyAccountant([]), label="t")
    np.testing.assert_allclose(same.values, result.values, atol=1e-12)
    assert same.noise == result.noise


def test_refused_charge_draws_no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(noise, "production_sampler", lambda: _SpySampler(events))
    strategy = _strategy(gaussian=False)
    with pytest.raises(BudgetExceededError):
        _protected(np.ones(24), strategy, 1).measure(
            strategy,
            target=PrivacyCost(measure="pure", epsilon=1.0),
            accountant=_SpyAccountant(events, refuse=True),
            label="t",
        )
    assert events == ["charge"]


def test_a_marginal_not_counted_is_refused_before_any_charge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    monkeypatch.setattr(noise, "production_sampler", lambda: _SpySampler(events))
    strategy = _strategy(gaussian=True)
    partial = ProtectedMarginals(
        {(0, 1): np.ones((2, 3))}, domain_shape=SHAPE, contribution_bound=1
    )
    with pytest.raises(ValueError, match=r"reads marginals \[.*\] that were not counted"):
        partial.measure(
            strategy,
            target=PrivacyCost(measure="zcdp", rho=0.5),
            accountant=_SpyAccountant(events),
            label="t",
        )
    assert events == []


def test_protected_marginals_cannot_be_pickled_printed_or_changed() -> None:
    tables = {(0,): np.array([123456.0, 7.0]), (): np.array(123463.0)}
    protected = ProtectedMarginals(tables, domain_shape=(2, 5), contribution_bound=1)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(protected)
    assert "123456" not in repr(protected) and "redacted" in repr(protected)
    assert protected.subsets == ((0,), ())
    assert not any(
        not name.startswith("_ProtectedMarginals") and "table" in name for name in vars(protected)
    )
    tables[(0,)][0] = 0.0  # the caller's array is copied: later changes cannot reach the tables
    stored = vars(protected)["_ProtectedMarginals__tables"]
    assert stored[(0,)][0] == 123456.0 and not stored[(0,)].flags.writeable


def test_protected_marginals_validation_fires() -> None:
    with pytest.raises(ValueError, match=r"contribution_bound \(0\) must be >= 1"):
        ProtectedMarginals({}, domain_shape=(2,), contribution_bound=0)
    with pytest.raises(ValueError, match=r"marginal key \(1, 0\) must be strictly increasing"):
        ProtectedMarginals({(1, 0): np.ones(6)}, domain_shape=(2, 3), contribution_bound=1)
    with pytest.raises(ValueError, match=r"marginal key \(2,\) must be strictly increasing"):
        ProtectedMarginals({(2,): np.ones(2)}, domain_shape=(2, 3), contribution_bound=1)
    with pytest.raises(ValueError, match=r"has 5 entries; its marginal has 6 cells \(2, 3\)"):
        ProtectedMarginals({(0, 1): np.ones(5)}, domain_shape=(2, 3), contribution_bound=1)
