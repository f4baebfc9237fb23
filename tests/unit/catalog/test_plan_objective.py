"""The spec's ``objective``: what auto chooses by, what the subset-space planners optimise, what the
plan reports (the largest cell standard error per table), and that the default changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning import planner as planning
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms.primitives.marginal_strategies import MarginalWeights, SubsetStrategy

SIZES = {"a": 9, "b": 4, "c": 6, "d": 3}


def _spec(objective: str | None = None, **overrides: Any) -> Any:
    raw: dict[str, Any] = {
        "name": "objective",
        "dataset": {"id": "objective", "budget": {"rho": 5}},
        "domain": {name: {"min": 0, "max": n - 1} for name, n in SIZES.items()},
        "workload": [
            {"name": "pairs", "marginals": {"attributes": "all", "degree": 2}},
            {"name": "a", "marginal": ["a"]},
        ],
        "privacy": {"rho": 0.5},
    }
    if objective is not None:
        raw["objective"] = objective
    raw.update(overrides)
    return parse_spec(raw)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))


def test_an_unknown_objective_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError, match="objective"):
        _spec("least_squares")


def test_the_default_objective_leaves_every_fingerprint_unchanged() -> None:
    default, explicit, other = _spec(), _spec("total_variance"), _spec("max_variance")
    assert "objective" not in json.loads(default.canonical_json())
    assert default.fingerprint() == explicit.fingerprint() != other.fingerprint()
    # plans (the flow's cached plan task) and strategies are keyed by the workload fingerprint
    assert default.workload_fingerprint() == explicit.workload_fingerprint()
    assert default.workload_fingerprint() != other.workload_fingerprint()


def test_max_variance_equalises_the_tables_and_lowers_the_worst_cell(tmp_path: Path) -> None:
    store = StrategyStore(tmp_path / "strategies")
    total = planning.make_plan(_spec(), cache=store)
    worst = planning.make_plan(_spec("max_variance"), cache=store)
    assert total.objective == "total_variance" and worst.objective == "max_variance"
    assert total.chosen == worst.chosen == "marginal_space"
    assert "least largest cell variance" in worst.reason
    assert total.item_std_errors is not None and worst.item_std_errors is not None
    assert set(worst.item_std_errors) == set(total.item_std_errors)  # 6 pairs and 'a'
    # every table gets the optimum's largest variance (the dual makes them equal where binding)
    largest = worst.largest_std_error
    assert largest is not None
    assert largest[1] < 0.9 * max(total.item_std_errors.values())
    # power: the total-variance plan is the better one on the sum, so the objective matters
    assert total.candidate(total.chosen).rmse < worst.candidate(worst.chosen).rmse
    # the standard errors reported are those of the strategy that will be measured
    strategy = worst.strategy
    variance = worst.candidate(worst.chosen).largest_variance
    assert variance == pytest.approx(largest[1] ** 2, rel=1e-12)
    scale = variance / max(strategy.uniform_unit_variance(item) for item in worst.workload.items)
    for item in worst.workload.items:
        cells = scale * strategy.item_unit_variances(item, worst.workload)
        np.testing.assert_allclose(np.sqrt(cells), worst.item_std_errors[item.name], rtol=1e-9)


def test_the_objectives_are_stored_under_different_keys(tmp_path: Path) -> None:
    store = StrategyStore(tmp_path / "strategies")
    first = planning.make_plan(_spec("max_variance"), cache=store)
    again = planning.make_plan(_spec("max_variance"), cache=store)
    total = planning.make_plan(_spec(), cache=store)
    assert again.strategy_parameters == first.strategy_parameters
    assert (
        total.strategy_parameters["subset_weights"] != first.strategy_parameters["subset_weights"]
    )


def test_laplace_max_variance_is_no_worse_than_measuring_each_table_alone(tmp_path: Path) -> None:
    """ε-DP: the L1 template minimises the total and derives the 1-way table from the 900 cells of
    the 2-way one (its cells then have 30x the variance); measuring each table on its own with
    half the budget is far better for the worst cell, and ``max_variance`` must find it."""
    spec = _spec(
        domain={"a": {"min": 0, "max": 29}, "b": {"min": 0, "max": 29}},
        workload=[{"name": "ab", "marginal": ["a", "b"]}, {"name": "a", "marginal": ["a"]}],
        mechanism="marginal_space",
        privacy={"epsilon": 1.0},
        dataset={"id": "laplace", "budget": {"epsilon": 5}},
    )
    store = StrategyStore(tmp_path / "strategies")
    total = planning.make_plan(spec, cache=store)
    worst = planning.make_plan(spec.model_copy(update={"objective": "max_variance"}), cache=store)
    separate = MarginalWeights(
        domain_shape=(30, 30),
        basis="marginal",
        weights=np.array([0.0, 0.5, 0.0, 0.5]),  # bitmasks 0b01 (a) and 0b11 (a, b)
        noise="laplace",
        unit_total_error=0.0,
    )
    strategy = SubsetStrategy(name="separate", weights=separate)
    laplace_variance = 2.0 / 1.0**2  # 2 (Δ₁ / ε)², Δ₁ = 1
    separate_largest = laplace_variance * max(
        strategy.uniform_unit_variance(item) for item in worst.workload.items
    )
    assert worst.candidate("marginal_space").largest_variance <= separate_largest * (
        1 + 1e-6
    )  # OpenDP slack
    assert total.candidate("marginal_space").largest_variance > 5 * separate_largest


def test_data_dependent_plans_predict_no_standard_errors() -> None:
    spec = _spec(
        domain={"a": {"min": 0, "max": 63}},
        workload=[{"name": "a", "marginal": ["a"]}],
        mechanism="dawa",
        privacy={"epsilon": 1.0},
        dataset={"id": "o", "budget": {"epsilon": 5}},
    )
    plan = planning.make_plan(spec)
    assert plan.item_std_errors is None and plan.largest_std_error is None
    assert plan.to_json()["item_std_errors"] is None
