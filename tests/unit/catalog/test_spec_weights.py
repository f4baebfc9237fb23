"""Per-item ``weight`` (issue 28): the spec's rules, the fingerprints, what the plan reports and
how ``auto`` chooses by the weighted total; a spec without weights is unchanged to the byte."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning import planner as planning
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import expand_item
from dprelease.flows.cli import app

SIZES = {"a": 9, "b": 4, "c": 6, "d": 3}
GOLDEN_FINGERPRINT = "d2d108d8c3bd2047c668385ff9947638666f83167ce8d6b4a0abed23d1c3e665"
"""``fingerprint()`` of :func:`_raw` as the code before weights computed it (b91977f)."""


def _raw(weights: dict[str, float] | None = None, **overrides: Any) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"name": "pairs", "marginals": {"attributes": "all", "degree": 2}},
        {"name": "a", "marginal": ["a"]},
        {"name": "p", "prefix": "a"},
        {"name": "m", "mean": "a", "by": ["b"]},
    ]
    for item in items:
        if weights and item["name"] in weights:
            item["weight"] = weights[item["name"]]
    raw = {
        "name": "w",
        "dataset": {"id": "w", "budget": {"rho": 5}},
        "domain": {name: {"min": 0, "max": n - 1} for name, n in SIZES.items()},
        "workload": items,
        "privacy": {"rho": 0.5},
    }
    return raw | overrides


def _marginal_spec(weights: dict[str, float] | None = None, **overrides: Any) -> Any:
    raw = _raw(weights, **overrides)
    raw["workload"] = raw["workload"][:2]  # a workload of marginals (subset space)
    return parse_spec(raw)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))


@pytest.mark.parametrize("weight", [0, -2.5, math.inf, math.nan, 1e6 * 1.0001])
def test_a_weight_outside_its_range_is_refused_naming_item_value_and_rule(weight: float) -> None:
    with pytest.raises(
        SpecError,
        match=r"workload item 'a': weight \(.+\) must be a finite number > 0 and <= 1e\+06",
    ):
        parse_spec(_raw({"a": weight}))


def test_a_weight_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(SpecError, match="weight"):
        parse_spec(_raw({"a": "heavy"}))  # type: ignore[dict-item]


def test_weights_are_refused_with_max_variance_accuracy_and_the_local_model() -> None:
    with pytest.raises(
        SpecError,
        match="'a': weight applies to objective: total_variance; objective 'max_variance'",
    ):
        parse_spec(_raw({"a": 2.0}, objective="max_variance"))
    accuracy = _raw({"a": 2.0}, accuracy={"max_std_error": 5})
    del accuracy["privacy"]
    accuracy["workload"] = accuracy["workload"][:2]
    with pytest.raises(SpecError, match=r"'a': weight .* accuracy targets .* weigh nothing"):
        parse_spec(accuracy)
    local = _raw({"a": 2.0}, model="local", privacy={"epsilon": 1.0})
    local["dataset"]["budget"] = {"epsilon": 5}
    local["workload"] = local["workload"][1:2]
    with pytest.raises(SpecError, match="'a': weight applies to central releases"):
        parse_spec(local)


def test_without_weights_the_canonical_form_and_fingerprints_are_unchanged() -> None:
    spec = parse_spec(_raw())
    assert spec.fingerprint() == GOLDEN_FINGERPRINT
    assert "weight" not in spec.canonical_json()
    assert not spec.weighted
    weighted = parse_spec(_raw({"pairs": 3.0}))
    assert weighted.weighted
    assert json.loads(weighted.canonical_json())["workload"][0]["weight"] == 3.0
    assert weighted.fingerprint() != spec.fingerprint()
    # strategies are keyed by the workload fingerprint: a weight changes the plan
    assert weighted.workload_fingerprint() != spec.workload_fingerprint()
    other = parse_spec(_raw({"pairs": 4.0}))
    assert other.workload_fingerprint() != weighted.workload_fingerprint()


def test_every_expanded_table_and_derived_support_inherit_the_weight() -> None:
    spec = parse_spec(_raw({"pairs": 3.0, "m": 0.5, "p": 7.0}))
    parts = expand_item(spec, spec.workload[0])
    assert len(parts) == 6 and {part.weight for part in parts} == {3.0}
    workload = planning.build_workload(spec)
    weights = {item.name: item.weight for item in workload.items}
    assert [weights[part.name] for part in parts] == [3.0] * 6
    assert weights["a"] == 1.0 and weights["p"] == 7.0 and weights["m.moments"] == 0.5
    assert workload.weighted and not planning.build_workload(parse_spec(_raw())).weighted


def test_plan_reports_the_weighted_total_only_with_weights(tmp_path: Path) -> None:
    store = StrategyStore(tmp_path / "s")
    plain = planning.make_plan(_marginal_spec(), cache=store).to_json()
    assert all("weighted_total_variance" not in c for c in plain["candidates"])
    heavy = planning.make_plan(_marginal_spec({"a": 10.0}), cache=store)
    candidates = heavy.to_json()["candidates"]
    assert all("weighted_total_variance" in c for c in candidates)
    scored = [c for c in heavy.candidates if c.weighted_total_variance is not None]
    assert scored and all(c.status == "planned" for c in scored)
    # the rule: the least weighted total (ties within round-off go to the cheaper candidate)
    least = min(c.weighted_total_variance for c in scored)
    chosen = heavy.candidate(heavy.chosen)
    assert chosen.weighted_total_variance <= least * (1 + planning.WEIGHTED_TIE)
    assert "weighted total" in heavy.reason
    # reported figures stay unweighted: Σ weight · item total, the items' totals summing to rmse
    items = heavy.workload.items
    units = {i.name: heavy.strategy.item_unit_total(i, heavy.workload) for i in items}
    scale = chosen.total_variance / sum(units.values())
    expected = scale * sum(i.weight * units[i.name] for i in items)
    assert chosen.weighted_total_variance == pytest.approx(expected, rel=1e-12)
    assert chosen.rmse == pytest.approx(
        (chosen.total_variance / heavy.num_queries) ** 0.5, rel=1e-12
    )
    # the weight lowers the weighted table's error and raises the others'
    before = planning.make_plan(_marginal_spec(), cache=store).item_std_errors
    after = heavy.item_std_errors
    assert after["a"] < 0.8 * before["a"]
    assert all(after[name] > before[name] for name in after if name != "a")


def test_unit_weights_plan_exactly_as_no_weights(tmp_path: Path) -> None:
    """Gaussian auto (closed form), and Laplace marginal_space, whose template search draws its
    restarts from the public seed of the workload fingerprint (which weight 1 leaves alone)."""
    ones = {"pairs": 1.0, "a": 1.0}
    laplace = {"privacy": {"epsilon": 1.0}, "dataset": {"id": "w", "budget": {"epsilon": 5}}}
    for overrides in ({}, laplace | {"mechanism": "marginal_space"}):
        plain_spec, unit_spec = _marginal_spec(**overrides), _marginal_spec(ones, **overrides)
        assert unit_spec.workload_fingerprint() == plain_spec.workload_fingerprint()
        assert unit_spec.fingerprint() != plain_spec.fingerprint()  # the spec says weight: 1
        plain = planning.make_plan(plain_spec, cache=StrategyStore(tmp_path / "p"))
        unit = planning.make_plan(unit_spec, cache=StrategyStore(tmp_path / "u"))
        assert unit.chosen == plain.chosen
        assert unit.strategy_parameters == plain.strategy_parameters
        assert unit.item_std_errors == plain.item_std_errors
        assert not unit_spec.weighted  # weight 1 is no weight: no weighted total, plain choice
        unplanned = [dataclasses.replace(c, seconds=0.0) for c in unit.candidates]
        assert unplanned == [dataclasses.replace(c, seconds=0.0) for c in plain.candidates]
        assert unit.to_json()["candidates"][0].keys() == plain.to_json()["candidates"][0].keys()


def test_weights_flip_auto_s_choice() -> None:
    """``_choose`` by the weighted total under weights, by the plain total without."""

    def planned(name: str, total: float, weighted: float) -> planning._Planned:
        return planning._Planned(
            candidate=planning.Candidate(
                mechanism=name,
                rmse=total**0.5,
                total_variance=total,
                weighted_total_variance=weighted,
                seconds=0.0,
            )
        )

    options = [planned("identity", 10.0, 50.0), planned("hierarchical", 20.0, 30.0)]
    plain, _ = planning._choose(_marginal_spec(), options)
    heavy, reason = planning._choose(_marginal_spec({"a": 10.0}), options)
    assert plain.candidate.mechanism == "identity"
    assert heavy.candidate.mechanism == "hierarchical" and "weighted" in reason


def test_a_data_dependent_mechanism_is_refused_under_weights(tmp_path: Path) -> None:
    raw = _raw({"p": 5.0}, privacy={"epsilon": 1.0}, mechanism="dawa")
    raw["dataset"]["budget"] = {"epsilon": 5}
    raw["domain"] = {"a": {"min": 0, "max": 15}}
    raw["workload"] = [{"name": "p", "prefix": "a", "weight": 5.0}, {"name": "t", "total": True}]
    with pytest.raises(SpecError, match=r"'dawa' cannot run.*does not take item weights"):
        planning.make_plan(parse_spec(raw), cache=StrategyStore(tmp_path / "s"))
    plan = planning.make_plan(
        parse_spec(raw | {"mechanism": "auto"}), cache=StrategyStore(tmp_path / "s")
    )
    dawa = plan.candidate("dawa")
    assert dawa.status == "unavailable" and "item weights" in (dawa.note or "")
    # unit weights are no weights: DAWA stays a candidate
    raw["workload"][0]["weight"] = 1.0
    unit = planning.make_plan(
        parse_spec(raw | {"mechanism": "auto"}), cache=StrategyStore(tmp_path / "s")
    )
    assert "item weights" not in (unit.candidate("dawa").note or "")


def test_plan_command_shows_the_weighted_total(tmp_path: Path) -> None:
    raw = _raw({"a": 10.0})
    raw["workload"] = raw["workload"][:2]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    text = runner.invoke(app, ["plan", str(path)], terminal_width=250)
    assert text.exit_code == 0, text.output
    assert "weighted total" in text.output
    data = json.loads(runner.invoke(app, ["plan", str(path), "--json"]).stdout)
    assert all("weighted_total_variance" in c for c in data["candidates"])


@pytest.mark.parametrize(
    ("mechanism", "privacy"),
    [("marginal_space", {"rho": 0.5}), ("optimized", {"epsilon": 1.0}), ("eigen", {"rho": 0.5})],
)
def test_a_weighted_release_answers_the_workload_with_unweighted_errors(
    tmp_path: Path, zero_noise, mechanism: str, privacy: dict
) -> None:
    """Through the release stages (no Prefect), zero noise: the weighted strategy measures and
    reconstructs every table exactly, and each released standard error is the plan's."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dprelease.catalog import release
    from dprelease.catalog.ledger.store import Catalog

    rng = np.random.default_rng(5)  # public randomness: synthetic test data
    a, b = rng.integers(0, 6, 300), rng.integers(0, 3, 300)
    source = tmp_path / "d.parquet"
    pq.write_table(pa.table({"a": pa.array(a, pa.int16()), "b": pa.array(b, pa.int16())}), source)
    budget = {"epsilon": 5} if "epsilon" in privacy else {"rho": 5}
    spec = parse_spec(
        {
            "name": "w",
            "dataset": {"id": f"w-{mechanism}", "source": str(source), "budget": budget},
            "domain": {"a": {"min": 0, "max": 5}, "b": {"min": 0, "max": 2}},
            "workload": [
                {"name": "ab", "marginal": ["a", "b"]},
                {"name": "a", "marginal": ["a"], "weight": 25.0},
            ],
            "mechanism": mechanism,
            "privacy": privacy,
        }
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    plan = planning.make_plan(spec)
    release_id = release.new_release_id(spec)
    release.register(spec, plan, catalog, release_id=release_id)
    ingested = release.ingest(spec, plan, catalog)
    measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
    tables = release.reconstruct(spec, plan, measurement)
    counts = np.zeros((6, 3))
    np.add.at(counts, (a, b), 1)
    np.testing.assert_allclose(tables["ab"]["estimate"], counts.ravel(), atol=1e-7)
    np.testing.assert_allclose(tables["a"]["estimate"], counts.sum(axis=1), atol=1e-7)
    assert plan.item_std_errors is not None
    for name, table in tables.items():
        largest = float(np.max(np.asarray(table["std_error"])))
        assert largest == pytest.approx(plan.item_std_errors[name], rel=1e-9)
