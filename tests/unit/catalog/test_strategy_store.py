"""The on-disk strategy store: hits return the same strategy, changed workloads miss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dprelease.catalog.planning import planner as planning
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms import optimized as optimized_mechanism
from dprelease.mechanisms.primitives.noise import SENSITIVITY_NORM
from dprelease.mechanisms.primitives.operators import MatrixFactor
from dprelease.mechanisms.primitives.protocol import StoredStrategy, cache_key


def test_save_load_and_key_sensitivity(tmp_path: Path) -> None:
    store = StrategyStore(tmp_path)
    key = cache_key("t", "abc", {"norm": 1})
    assert store.load(key) is None
    stored = StoredStrategy(parameters={"weights": [1.0, 0.5]}, arrays={"A": np.eye(2)})
    store.save(key, stored)
    fresh = StrategyStore(tmp_path, max_entries=4)
    assert fresh.load(key).parameters == {"weights": [1.0, 0.5]}
    np.testing.assert_array_equal(StrategyStore(tmp_path / "other").load(key) or 0, 0)
    assert cache_key("t", "abd", {"norm": 1}) != key
    assert cache_key("t", "abc", {"norm": 2}) != key
    (tmp_path / f"{key}.npz").write_text("not an npz")
    assert StrategyStore(tmp_path).load(key) is None  # a damaged entry is a miss, not a crash


def test_store_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    import os

    store = StrategyStore(tmp_path, max_entries=3)
    keys = [cache_key("t", i) for i in range(4)]
    for age, key in enumerate(keys[:3]):
        store.save(key, StoredStrategy(parameters={"i": age}))
        os.utime(tmp_path / f"{key}.npz", (1_000_000 + age, 1_000_000 + age))
    assert store.load(keys[0]) is not None  # a hit refreshes the oldest entry
    store.save(keys[3], StoredStrategy(parameters={"i": 3}))
    assert sorted(store.keys()) == sorted([keys[0], keys[2], keys[3]])  # keys[1] was evicted
    with pytest.raises(ValueError, match=r"max_entries \(0\) must be >= 1"):
        StrategyStore(tmp_path, max_entries=0)


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
    original = optimized_mechanism.optimize_weights
    monkeypatch.setattr(
        optimized_mechanism,
        "optimize_weights",
        lambda *a, **k: calls.append(1) or original(*a, **k),
    )
    spec = parse_spec({**_spec("cdf"), "mechanism": "optimized"})
    first = planning.make_plan(spec)
    computed = len(calls)
    assert computed > 0
    second = planning.make_plan(spec)
    assert len(calls) == computed  # a hit: no optimisation the second time
    assert second.candidate("optimized").rmse == pytest.approx(first.candidate("optimized").rmse)
    planning.make_plan(parse_spec({**_spec("cdf_renamed"), "mechanism": "optimized"}))
    assert len(calls) > computed  # another workload fingerprint: a miss
    assert len(list(tmp_path.glob("strategies/*.npz"))) == 2  # one optimized entry per workload


def test_dense_strategy_matches_numpy(rng: np.random.Generator) -> None:
    from dprelease.mechanisms.primitives.dense import DenseStrategy
    from dprelease.mechanisms.primitives.operators import Identity, Prefix
    from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

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
    assert strategy.sensitivity(noise="laplace") == pytest.approx(np.abs(matrix).sum(0).max())
    assert strategy.support_residual(workload) < 1e-9
    narrow = DenseStrategy(name="n", matrix=np.ones((1, 6)))
    identity = Workload(domain_shape=(6,), items=(WorkloadItem(name="i", factors=(Identity(6),)),))
    assert narrow.support_residual(identity) > 0.1
    with pytest.raises(ValueError, match="finite 2-D"):
        DenseStrategy(name="bad", matrix=np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=r"noise \('uniform'\) must be one of"):
        strategy.sensitivity(noise="uniform")


def test_planned_optimized_strategy_is_rebuilt_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever template wins (union, kron or marginals), the release rebuilds the planned strategy."""
    import itertools

    from tests.reference.error import expected_error

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
                "mechanism": "optimized",
            }
        )
        plan = planning.make_plan(spec)
        built = planning.build_workload(spec)
        planned = plan.strategy  # the object measure and reconstruct receive
        templates.add(str(planned.parameters["template"]))
        request = planning.plan_request(spec, workload=built, requested=True)
        store = StrategyStore(tmp_path / "strategies")
        # optimized's own entry (a marginal workload also leaves the shared subset-weights entry)
        key = cache_key(
            "optimized",
            request.workload_fingerprint,
            {"norm": SENSITIVITY_NORM[request.noise], "b": 2},
        )
        store_entry = store.load(key)
        assert store_entry is not None
        rebuilt = optimized_mechanism._restore(request, store_entry, branching=2)
        variance = (
            plan.candidate("optimized").total_variance
            / expected_error(built, rebuilt, noise_variance=1.0).total_variance
        )
        for path in (tmp_path / "strategies").glob("*.npz"):
            path.unlink()  # the next workload starts from an empty store
        # same strategy: the planned total variance is the rebuilt unit error × one noise variance
        assert variance == pytest.approx(plan.candidate("optimized").noise_scale ** 2, rel=1e-9)
    assert len(templates) == 2  # two different winning templates were rebuilt


def test_kron_template_is_stored_as_theta_and_restored_exactly(rng: np.random.Generator) -> None:
    """A Kronecker template keeps Θ for p-Identity factors, nothing for identity ones and dense
    matrices otherwise; restoring gives the same factors, and entries written before Θ was kept
    (dense ``factor_i`` for every attribute) still restore."""
    from dprelease.mechanisms.optimized.templates import PIdentityFactor
    from dprelease.mechanisms.primitives.strategies import KronStrategy, identity_strategy

    pidentity = PIdentityFactor(rng.random((2, 6)), noise="laplace")
    other = MatrixFactor(rng.random((5, 4)))
    doubled = MatrixFactor(sp.csr_array(2.0 * np.eye(2)))  # sparse and diagonal, not I
    strategy = KronStrategy(
        name="optimized", factors=(pidentity, identity_strategy(3), other, doubled)
    )
    arrays = optimized_mechanism._factor_arrays(strategy)
    assert sorted(arrays) == ["factor_2", "factor_3", "theta_0"]
    assert arrays["theta_0"].shape == (2, 6)
    templates = {"factor_templates": ["pidentity", "identity", "fullrank", "fullrank"]}
    for stored in (
        StoredStrategy(parameters=templates, arrays=arrays),
        StoredStrategy(
            parameters={}, arrays={f"factor_{i}": f.dense() for i, f in enumerate(strategy.factors)}
        ),
    ):
        restored = optimized_mechanism._restore_factors(stored, (6, 3, 4, 2), noise="laplace")
        for before, after in zip(strategy.factors, restored, strict=True):
            np.testing.assert_allclose(after.dense(), before.dense(), rtol=1e-14)
    assert isinstance(
        optimized_mechanism._restore_factors(
            StoredStrategy(parameters=templates, arrays=arrays), (6, 3, 4, 2), noise="laplace"
        )[0],
        PIdentityFactor,
    )
    # an entry missing a factor that is not the identity is a bug: loud, never a silent identity
    incomplete = {k: v for k, v in arrays.items() if k != "factor_2"}
    with pytest.raises(ValueError, match=r"no array for attribute 2 and its template \(fullrank\)"):
        optimized_mechanism._restore_factors(
            StoredStrategy(parameters=templates, arrays=incomplete), (6, 3, 4, 2), noise="laplace"
        )
