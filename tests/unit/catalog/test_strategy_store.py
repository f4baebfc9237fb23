"""The on-disk strategy store: hits return the same strategy, changed workloads miss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from catalog import planning
from catalog.spec import parse_spec
from catalog.strategy_store import StrategyStore, strategy_key


def test_put_get_and_key_sensitivity(tmp_path: Path) -> None:
    store = StrategyStore(tmp_path)
    key = strategy_key(workload_fingerprint="abc", template="t", settings={"norm": 1})
    assert store.get(key) is None
    store.put(key, {"weights": [1.0, 0.5]})
    assert store.get(key) == {"key": key, "parameters": {"weights": [1.0, 0.5]}}
    assert strategy_key(workload_fingerprint="abd", template="t", settings={"norm": 1}) != key
    assert strategy_key(workload_fingerprint="abc", template="t", settings={"norm": 2}) != key
    (tmp_path / f"{key}.json").write_text("not json")
    assert store.get(key) is None  # a damaged entry is a miss, not a crash


def _spec(item_name: str) -> dict:
    return {
        "name": "s",
        "dataset": {"id": "s", "budget": {"epsilon": 5}},
        "domain": {"a": {"min": 0, "max": 15}, "b": {"values": [0, 1, 2]}},
        "workload": [
            {"name": item_name, "prefix": "a"},
            {"name": "b_only", "marginal": ["b"]},
        ],
        "privacy": {"epsilon": 1.0},
    }


def test_optimized_plan_is_reused_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    calls: list[int] = []
    original = planning.optimize_weights
    monkeypatch.setattr(
        planning, "optimize_weights", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    spec = parse_spec(_spec("cdf"))
    first = planning.make_plan(spec)
    computed = len(calls)
    assert computed > 0
    second = planning.make_plan(spec)
    assert len(calls) == computed  # a hit: no optimisation the second time
    assert second.candidate("optimized").rmse == pytest.approx(first.candidate("optimized").rmse)
    planning.make_plan(parse_spec(_spec("cdf_renamed")))  # another workload fingerprint: a miss
    assert len(calls) > computed
    assert len(list(tmp_path.glob("strategies/*.json"))) == 6  # optimized, eigen, lrm per workload


def test_dense_strategy_matches_numpy(rng: np.random.Generator) -> None:
    from mechanisms.dense import DenseStrategy
    from mechanisms.operators import Identity, Prefix
    from mechanisms.workload import Workload, WorkloadItem

    matrix = rng.normal(size=(9, 6))
    strategy = DenseStrategy(name="d", matrix=matrix)
    workload = Workload(domain_shape=(6,), items=(WorkloadItem(name="p", factors=(Prefix(6),)),))
    y = rng.normal(size=9)
    np.testing.assert_allclose(strategy.least_squares(y), np.linalg.pinv(matrix) @ y, atol=1e-10)
    covariance = np.linalg.inv(matrix.T @ matrix)
    prefix = np.tril(np.ones((6, 6)))
    np.testing.assert_allclose(
        strategy.item_unit_variances(workload.items[0]),
        np.diag(prefix @ covariance @ prefix.T),
        rtol=1e-9,
    )
    assert strategy.sensitivity(norm=1) == pytest.approx(np.abs(matrix).sum(0).max())
    assert strategy.support_residual(workload) < 1e-9
    narrow = DenseStrategy(name="n", matrix=np.ones((1, 6)))
    identity = Workload(domain_shape=(6,), items=(WorkloadItem(name="i", factors=(Identity(6),)),))
    assert narrow.support_residual(identity) > 0.1
    with pytest.raises(ValueError, match="finite 2-D"):
        DenseStrategy(name="bad", matrix=np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=r"norm \(3\) must be 1 or 2"):
        strategy.sensitivity(norm=3)


def test_planned_optimized_strategy_is_rebuilt_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever template wins (union, kron or marginals), the release rebuilds the planned strategy."""
    import itertools

    from mechanisms.error import expected_error

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    names = ["a", "b", "c", "d"]
    templates: set[str] = set()
    for workload in (
        [{"name": f"{x}{y}", "marginal": [x, y]} for x, y in itertools.combinations(names, 2)],
        [{"name": "cdf", "prefix": "a"}],
    ):
        spec = parse_spec(
            {
                "name": "r",
                "dataset": {"id": "r", "budget": {"rho": 5}},
                "domain": {n: {"min": 0, "max": 4} for n in names},
                "workload": workload,
                "privacy": {"rho": 0.5},
            }
        )
        plan = planning.make_plan(spec)
        built = planning.build_workload(spec)
        planned = planning.strategy_for(spec, "optimized", built)  # from the store, as planned
        templates.add(str(planned.parameters["template"]))
        rebuilt = planning.strategy_for(
            spec, "optimized", built, parameters=dict(planned.parameters)
        )
        variance = (
            plan.candidate("optimized").total_variance
            / expected_error(built, rebuilt, noise_variance=1.0).total_variance
        )
        # same strategy: the planned total variance is the rebuilt unit error × one noise variance
        assert variance == pytest.approx(plan.candidate("optimized").noise_scale ** 2, rel=1e-9)
    assert len(templates) == 2  # two different winning templates were rebuilt
