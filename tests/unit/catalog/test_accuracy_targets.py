"""Accuracy first: a spec gives each table's ``max_std_error`` instead of a privacy level; the plan
finds the smallest level whose strategy meets every target, and a release charges exactly that
(no Prefect: the release stages in-process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.errors import BudgetExceededError, SpecError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.load import parse_spec

SIZES = {"a": 12, "b": 5, "c": 7}


def _raw(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "acc",
        "dataset": {"id": "acc", "budget": {"rho": 5}},
        "domain": {name: {"min": 0, "max": n - 1} for name, n in SIZES.items()},
        "workload": [
            {"name": "pairs", "marginals": {"attributes": "all", "degree": 2}},
            {"name": "b", "marginal": ["b"], "max_std_error": 2.0},
        ],
        "accuracy": {"max_std_error": 10.0},
    }
    raw.update(overrides)
    return raw


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))


# --- the spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"accuracy": None}, "give exactly one of privacy .* and accuracy"),
        ({"privacy": {"rho": 0.5}}, "give exactly one of privacy .* and accuracy"),
        ({"accuracy": {"max_std_error": 0.0}}, r"accuracy.max_std_error \(0.0\) must be a finite"),
        ({"accuracy": {"max_std_error": float("inf")}}, r"max_std_error \(inf\) must be a finite"),
        ({"accuracy": {"noise": "uniform"}}, "noise"),
        (
            {"workload": [{"name": "a", "marginal": ["a"], "max_std_error": -1.0}]},
            r"workload item 'a': max_std_error \(-1.0\) must be a finite",
        ),
        (
            {"workload": [{"name": "a", "marginal": ["a"]}], "accuracy": {"noise": "gaussian"}},
            "workload item 'a' has no target",
        ),
        (
            {"workload": [{"name": "m", "mean": "a"}]},
            "workload item 'm': accuracy targets apply to count tables",
        ),
        ({"objective": "total_variance"}, r"objective \('total_variance'\) must be max_variance"),
        (
            {"accuracy": {"max_std_error": 1.0, "max_half_width": 2.0}},
            "accuracy: give max_std_error or max_half_width, not both",
        ),
        (
            {
                "workload": [
                    {"name": "a", "marginal": ["a"], "max_std_error": 1.0, "max_half_width": 2.0}
                ]
            },
            "workload item 'a': give max_std_error or max_half_width, not both",
        ),
        (
            {"accuracy": {"max_half_width": -2.0}},
            r"accuracy.max_half_width \(-2.0\) must be a finite",
        ),
        (
            {"accuracy": {"max_half_width": 9.0, "confidence": 1.0}},
            r"accuracy.confidence \(1.0\) must be in \(0, 1\)",
        ),
        (
            {"accuracy": {"max_half_width": 9.0, "noise": "laplace"}},
            "max_half_width targets need accuracy.noise: gaussian",
        ),
    ],
    ids=[
        "neither",
        "both",
        "zero-default",
        "infinite-default",
        "unknown-noise",
        "negative-item",
        "no-target",
        "derived",
        "total-objective",
        "both-default-targets",
        "both-item-targets",
        "negative-half-width",
        "confidence-one",
        "half-width-laplace",
    ],
)
def test_an_invalid_accuracy_spec_is_refused_naming_the_field(overrides, message: str) -> None:
    raw = _raw(**overrides)
    raw = {key: value for key, value in raw.items() if value is not None}
    with pytest.raises(SpecError, match=message):
        parse_spec(raw)


def test_an_item_target_needs_an_accuracy_section() -> None:
    raw = _raw(privacy={"rho": 0.5})
    del raw["accuracy"]
    with pytest.raises(SpecError, match="workload item 'b': max_std_error needs an accuracy"):
        parse_spec(raw)


def test_accuracy_targets_are_for_central_releases() -> None:
    raw = _raw(model="local", workload=[{"name": "a", "prefix": "a"}])
    with pytest.raises(SpecError, match=r"accuracy targets apply to central releases"):
        parse_spec(raw)


def test_targets_expand_with_marginals_and_fall_back_to_the_default() -> None:
    spec = parse_spec(_raw())
    assert spec.item_targets() == {
        "pairs.a.b": 10.0,
        "pairs.a.c": 10.0,
        "pairs.b.c": 10.0,
        "b": 2.0,
    }
    assert spec.effective_objective == "max_variance" and spec.noise == "gaussian"
    with pytest.raises(ValueError, match="has no privacy level until it is planned"):
        spec.privacy_target()


def test_half_widths_are_standard_errors_at_the_confidence_level() -> None:
    """z_{0.975} = 1.959964: a 95% half-width of 19.6 is a standard error of 10.0."""
    raw = _raw(accuracy={"max_half_width": 19.5996398454})
    raw["workload"][1] = {"name": "b", "marginal": ["b"], "max_half_width": 3.0}
    targets = parse_spec(raw).item_targets()
    assert targets["pairs.a.b"] == pytest.approx(10.0, rel=1e-9)
    assert targets["b"] == pytest.approx(3.0 / 1.959963984540054, rel=1e-12)
    raw["accuracy"]["confidence"] = 0.5  # z_{0.75} = 0.674490
    assert parse_spec(raw).item_targets()["b"] == pytest.approx(3.0 / 0.6744897501960817)
    mixed = _raw(accuracy={"max_half_width": 19.5996398454})  # b keeps its own standard error
    assert parse_spec(mixed).item_targets()["b"] == 2.0


def test_specs_with_standard_error_targets_keep_their_canonical_form() -> None:
    canonical = json.loads(parse_spec(_raw()).canonical_json())
    assert canonical["accuracy"] == {"max_std_error": 10.0, "noise": "gaussian"}
    assert all("max_half_width" not in item for item in canonical["workload"])


def test_specs_without_targets_keep_their_canonical_form() -> None:
    raw = _raw(privacy={"rho": 0.5}, workload=[{"name": "a", "marginal": ["a"]}])
    del raw["accuracy"]
    canonical = json.loads(parse_spec(raw).canonical_json())
    assert "accuracy" not in canonical
    assert all("max_std_error" not in item for item in canonical["workload"])


# --- the plan --------------------------------------------------------------------------------


def test_the_plan_meets_every_target_at_the_smallest_level(tmp_path: Path) -> None:
    plan = make_plan(parse_spec(_raw()), cache=StrategyStore(tmp_path / "s"))
    assert set(plan.privacy) == {"rho"} and plan.objective == "max_variance"
    assert plan.targets is not None and plan.item_std_errors is not None
    for name, target in plan.targets.items():
        assert plan.item_std_errors[name] <= target
    binding = plan.binding_table
    assert binding is not None
    assert plan.item_std_errors[binding] >= plan.targets[binding] * (1 - 1e-6)  # smallest level
    # power: 1% less privacy loss misses the binding target
    below = make_plan(
        parse_spec(_raw()).with_privacy({"rho": plan.privacy["rho"] * 0.99}),
        cache=StrategyStore(tmp_path / "s"),
    )
    assert below.item_std_errors[binding] > plan.targets[binding]


def test_the_level_is_within_1_percent_of_a_bisection_over_rho(tmp_path: Path) -> None:
    """The closed-form level against the definition: the smallest ρ at which the same strategy
    family (the design weighted by the targets) meets every target, found by bisection."""
    spec = parse_spec(_raw(mechanism="marginal_space"))
    store = StrategyStore(tmp_path / "s")
    plan = make_plan(spec, cache=store)
    targets = spec.item_targets() or {}

    def meets(rho: float) -> bool:
        errors = make_plan(spec.with_privacy({"rho": rho}), cache=store).item_std_errors or {}
        return all(errors[name] <= target for name, target in targets.items())

    low, high = 1e-4, 100.0
    assert not meets(low) and meets(high)
    for _ in range(40):  # geometric bisection: the ratio high/low ends below 1.0001
        middle = (low * high) ** 0.5
        low, high = (low, middle) if meets(middle) else (middle, high)
    assert plan.privacy["rho"] == pytest.approx(high, rel=0.01)
    assert plan.privacy["rho"] <= high * (1 + 1e-6)


def test_the_weights_are_optimised_for_the_targets_not_scaled_up(tmp_path: Path) -> None:
    """A tight target on one table: the design weighted by the targets needs less ρ than the
    plain max-variance design (every table equal) scaled until the tight table meets its target."""
    store = StrategyStore(tmp_path / "s")
    targeted = make_plan(parse_spec(_raw()), cache=store)
    raw = _raw(privacy={"rho": 1.0}, objective="max_variance")
    del raw["accuracy"]
    raw["workload"] = [
        {k: v for k, v in item.items() if k != "max_std_error"} for item in raw["workload"]
    ]
    plain = make_plan(parse_spec(raw), cache=store)
    assert targeted.targets is not None and plain.item_std_errors is not None
    scaled_rho = max(
        (plain.item_std_errors[name] / target) ** 2 for name, target in targeted.targets.items()
    )  # variances scale as 1/ρ: ρ at which the plain design meets every target
    assert targeted.privacy["rho"] < 0.9 * scaled_rho


def test_laplace_targets_give_the_smallest_epsilon(tmp_path: Path) -> None:
    spec = parse_spec(
        _raw(
            mechanism="marginal_space",  # auto would also plan LRM (seconds per round)
            accuracy={"max_std_error": 10.0, "noise": "laplace"},
            dataset={"id": "l", "budget": {"epsilon": 5}},
        )
    )
    plan = make_plan(spec, cache=StrategyStore(tmp_path / "s"))
    assert set(plan.privacy) == {"epsilon"}
    assert plan.targets is not None and plan.item_std_errors is not None
    binding = plan.binding_table
    assert binding is not None
    assert (
        plan.targets[binding] * (1 - 1e-6) <= plan.item_std_errors[binding] <= plan.targets[binding]
    )


def test_unreachable_targets_are_refused_naming_the_table(tmp_path: Path) -> None:
    spec = parse_spec(_raw(workload=[{"name": "b", "marginal": ["b"], "max_std_error": 1e-4}]))
    with pytest.raises(SpecError, match=r"need rho=.*outside the supported range.*table 'b' binds"):
        make_plan(spec, cache=StrategyStore(tmp_path / "s"))


def test_a_data_dependent_mechanism_cannot_meet_targets(tmp_path: Path) -> None:
    spec = parse_spec(
        _raw(
            domain={"a": {"min": 0, "max": 63}},
            workload=[{"name": "a", "marginal": ["a"]}],
            mechanism="dawa",
            accuracy={"max_std_error": 10.0, "noise": "laplace"},
            dataset={"id": "d", "budget": {"epsilon": 5}},
        )
    )
    with pytest.raises(SpecError, match="'dawa' does not \\(it is data-dependent"):
        make_plan(spec, cache=StrategyStore(tmp_path / "s"))


# --- the release -----------------------------------------------------------------------------


def _data(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)  # public randomness: synthetic test data
    source = tmp_path / "d.parquet"
    columns = {name: pa.array(rng.integers(0, n, 300), pa.int16()) for name, n in SIZES.items()}
    pq.write_table(pa.table(columns), source)
    return source


def test_a_release_charges_exactly_the_planned_level_and_meets_the_targets(
    tmp_path: Path,
) -> None:
    spec = parse_spec(
        _raw(dataset={"id": "acc", "source": str(_data(tmp_path)), "budget": {"rho": 5}})
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    plan = make_plan(spec)
    planned = release.planned_spec(spec, plan)
    assert planned.privacy == plan.privacy and release.planned_spec(planned, plan) is planned
    release_id = release.new_release_id(planned)
    release.register(planned, plan, catalog, release_id=release_id)
    ingested = release.ingest(planned, plan, catalog)
    measurement = release.measure(ingested, planned, plan, catalog, release_id=release_id)
    assert catalog.spent("acc").rho == pytest.approx(plan.privacy["rho"], rel=1e-9)
    tables = release.reconstruct(planned, plan, measurement)
    assert plan.targets is not None
    for name, table in tables.items():
        assert table["std_error"].to_numpy().max() <= plan.targets[name]


def test_an_over_cap_release_is_refused_naming_the_binding_table(tmp_path: Path) -> None:
    spec = parse_spec(
        _raw(dataset={"id": "tight", "source": str(_data(tmp_path)), "budget": {"rho": 0.01}})
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    plan = make_plan(spec)
    planned = release.planned_spec(spec, plan)
    with pytest.raises(BudgetExceededError, match=r"table '.*' binds \(max_std_error .*\)"):
        release.register(planned, plan, catalog, release_id=release.new_release_id(planned))
    assert catalog.spent("tight").rho == 0.0
