"""A series period by period through the stage functions (no Prefect): the horizon plan, its
record in the catalog, each release's charges per partition, the published rows, and every
refusal before anything is charged."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dprelease.catalog import release, series
from dprelease.catalog.confidential.choke_point import ProtectedCells, ProtectedMarginals
from dprelease.catalog.errors import BudgetExceededError, CatalogError, DataError, SpecError
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.series import SeriesPlan, make_series_plan
from dprelease.catalog.spec.load import parse_spec
from dprelease.flows.cli import app
from dprelease.mechanisms.continual import square_root_matrix
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.unit.catalog.test_spec_series import raw_series_spec


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))


def _write_period(folder: Path, period: int, *, seed: int, rows: int = 120) -> Path:
    rng = np.random.default_rng(seed)
    path = folder / f"2026-{period:02d}.parquet"
    table = pa.table({"region": rng.choice(["n", "s", "e"], rows), "age": rng.integers(0, 4, rows)})
    pq.write_table(table, path)
    return path


def _spec(folder: Path, **series: Any) -> Any:
    raw = raw_series_spec()
    raw["dataset"]["source"] = str(folder)
    raw["series"] = {"period": "file", "horizon": 3, "time_workload": ["cumulative"]} | series
    return parse_spec(raw)


def _release(spec: Any, catalog: Catalog, out: Path) -> tuple[Any, dict[str, pa.Table]]:
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    directory = release.release_directory(out, release_id)
    step, _ = series.register(spec, plan, catalog, release_id=release_id, directory=directory)
    measured, _, _ = series.measure(spec, plan, step, catalog, release_id=release_id)
    return measured, series.reconstruct(spec, plan, catalog, period=step.period)


def test_cumulative_counts_plan_the_square_root_and_each_period_pays_its_column(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    plan = make_series_plan(spec, make_plan(spec))
    assert plan.time_strategy == "square_root"
    np.testing.assert_allclose(plan.A, square_root_matrix(3))
    totals = plan.partition_totals()
    assert max(totals) == pytest.approx(0.5) and all(t <= 0.5 + 1e-12 for t in totals)
    again = SeriesPlan.from_json(json.loads(plan.canonical_json()))
    assert again.canonical_json() == plan.canonical_json()
    errors = plan.summary()["std_errors_by_period"]["all.cumulative"]
    assert errors == sorted(errors)  # cumulative error grows with the period


def test_person_level_pays_the_horizon_rho_in_sequence(tmp_path: Path) -> None:
    raw = raw_series_spec(privacy_unit={"person_column": "pid", "max_rows": 2})
    raw["dataset"] = {"id": "p", "source": str(tmp_path), "budget": {"rho": 2.0}}
    raw["series"]["time_workload"] = ["period", "cumulative"]
    spec = parse_spec(raw)
    plan = make_series_plan(spec, make_plan(spec))
    assert plan.time_strategy.startswith("optimised") or plan.time_strategy == "square_root"
    assert sum(plan.partition_totals()) == pytest.approx(0.5)
    assert plan.release_costs(0) == {None: pytest.approx(float(plan.A[0, 0]) ** 2)}


def test_periods_release_in_order_charging_each_partition_its_increment(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = _spec(data)
    plan = make_series_plan(spec, make_plan(spec))
    published = []
    for period in range(3):
        _write_period(data, period + 1, seed=period)
        before = len(catalog.ledger_entries(spec.dataset.id)) if period else 0
        _, tables = _release(spec, catalog, tmp_path / "out")
        entries = catalog.ledger_entries(spec.dataset.id)[before:]
        charges = [e for e in entries if e.kind == "charge"]
        unit = charges[-1].cost.rho / plan.A[period, period] ** 2
        assert [e.partition for e in charges] == [
            f"2026-{s + 1:02d}.parquet" for s in range(period + 1)
        ]
        for s, entry in enumerate(charges):
            assert entry.cost.rho == pytest.approx(plan.A[period, s] ** 2 * unit, rel=1e-12)
        assert unit <= plan.rho_unit
        assert sorted(tables) == ["all.cumulative", "by_region.cumulative"]
        published.append(tables["all.cumulative"].to_pydict())
    kinds = [e.kind for e in catalog.ledger_entries(spec.dataset.id)]
    assert kinds[0] == "series-plan" and kinds.count("series-plan") == 1
    plan_entry = catalog.ledger_entries(spec.dataset.id)[0]
    assert plan_entry.label == f"series-plan monthly sha256:{plan.digest()}"
    assert catalog.verify_chain() == []
    for spending in catalog.partition_spending(spec.dataset.id):
        assert spending.spent.rho <= 0.5 + 1e-12
    assert max(s.spent.rho for s in catalog.partition_spending(spec.dataset.id)) == (
        pytest.approx(0.5, rel=1e-6)
    )
    # re-reading period 2's published row from the recorded measurements gives the same figures
    again = series.reconstruct(spec, make_plan(spec), catalog, period=1)
    assert again["all.cumulative"].to_pydict() == published[1]


def _entries(catalog: Catalog, dataset_id: str) -> int:
    return len(catalog.ledger_entries(dataset_id)) if dataset_id in catalog.dataset_ids() else 0


def test_refusals_charge_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = _spec(data, horizon=2)
    for period in (1, 2):
        _write_period(data, period, seed=period)
        _release(spec, catalog, tmp_path / "out")
    count = _entries(catalog, spec.dataset.id)
    # a period released twice: no new file in the source
    with pytest.raises(SpecError, match="already released as period 2"):
        _release(spec, catalog, tmp_path / "out")
    # past the horizon: a third file arrives
    _write_period(data, 3, seed=3)
    with pytest.raises(SpecError, match="horizon of 2 periods"):
        _release(spec, catalog, tmp_path / "out")
    # a spec that changes the plan (another privacy level)
    changed = spec.model_copy(update={"privacy": {"rho": 0.25}})
    with pytest.raises(SpecError, match="changes the series' plan"):
        _release(changed, catalog, tmp_path / "out")
    assert _entries(catalog, spec.dataset.id) == count


def test_a_changed_past_period_is_refused_before_any_charge(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = _spec(data)
    _write_period(data, 1, seed=1)
    _release(spec, catalog, tmp_path / "out")
    _write_period(data, 1, seed=99)  # period 1's file rewritten after its release
    _write_period(data, 2, seed=2)
    count = _entries(catalog, spec.dataset.id)
    with pytest.raises(DataError, match=r"period 1 .*changed since its release"):
        _release(spec, catalog, tmp_path / "out")
    assert _entries(catalog, spec.dataset.id) == count


def test_plan_shows_the_horizon_plan_as_text_and_json(tmp_path: Path) -> None:
    raw = raw_series_spec()
    raw["series"]["time_workload"] = ["period", "cumulative"]
    path = tmp_path / "series.yaml"
    path.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    text = runner.invoke(app, ["plan", str(path)])
    assert text.exit_code == 0, text.output
    assert "series monthly: 12 periods" in text.output and "worst" in text.output
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)["series"]
    assert summary["horizon"] == 12
    assert set(summary["worst_std_error"]) == {
        "by_region.period",
        "all.period",
        "by_region.cumulative",
        "all.cumulative",
    }
    assert math.isclose(summary["rho_per_person_total"], 0.5, rel_tol=1e-9)
    assert len(summary["rho_by_partition"]) == 12


def test_person_level_releases_charge_the_whole_dataset_in_sequence(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    raw = raw_series_spec(privacy_unit={"person_column": "pid", "max_rows": 2})
    raw["dataset"] = {"id": "people", "source": str(data), "budget": {"rho": 2.0}}
    raw["series"] = {"period": "file", "horizon": 3, "time_workload": ["cumulative"]}
    spec = parse_spec(raw)
    plan = make_series_plan(spec, make_plan(spec))
    catalog = Catalog()
    for period in range(3):
        rng = np.random.default_rng(period)
        rows = 90
        table = pa.table(
            {
                "pid": rng.integers(0, 40, rows),  # the same people in every period
                "region": rng.choice(["n", "s", "e"], rows),
                "age": rng.integers(0, 4, rows),
            }
        )
        pq.write_table(table, data / f"2026-{period + 1:02d}.parquet")
        before = _entries(catalog, spec.dataset.id)
        _release(spec, catalog, tmp_path / "out")
        charges = [
            e for e in catalog.ledger_entries(spec.dataset.id)[before:] if e.kind == "charge"
        ]
        assert [e.partition for e in charges] == [None]
        multiplier = float(np.abs(plan.A[period, : period + 1]).sum()) ** 2
        assert charges[0].cost.rho <= multiplier * plan.rho_unit * (1 + 1e-12)
        assert charges[0].cost.rho >= multiplier * plan.rho_unit * (1 - 1e-6)
    assert catalog.spent(spec.dataset.id).rho == pytest.approx(0.5, rel=1e-6)
    assert catalog.spent(spec.dataset.id).rho <= 0.5


def test_charge_each_is_all_or_nothing(tmp_path: Path) -> None:
    catalog = Catalog()
    cap = PrivacyCost(measure="zcdp", rho=1.0)
    catalog.ensure_dataset("d", cap=cap, partitioned_by="file")
    zcdp = lambda rho: PrivacyCost(measure="zcdp", rho=rho)  # noqa: E731
    catalog.charge_each("d", {"a": zcdp(0.75)}, release_id="r1", label="one")
    with pytest.raises(BudgetExceededError, match="partition 'a'"):
        catalog.charge_each("d", {"b": zcdp(0.1), "a": zcdp(0.5)}, release_id="r2", label="two")
    assert [e.partition for e in catalog.ledger_entries("d")] == ["a"]
    with pytest.raises(CatalogError, match="at least one cost"):
        catalog.charge_each("d", {}, release_id="r3", label="none")


def test_a_combination_of_mismatched_parts_is_refused() -> None:
    cells = ProtectedCells(np.ones(4), domain_shape=(4,), contribution_bound=1)
    other = ProtectedCells(np.ones(2), domain_shape=(2,), contribution_bound=1)
    with pytest.raises(ValueError, match="one weight per part"):
        ProtectedCells.combination([cells, cells], [1.0])
    with pytest.raises(ValueError, match="one domain and contribution bound"):
        ProtectedCells.combination([cells, other], [1.0, 0.5])
    tables = ProtectedMarginals({(0,): [1.0, 2.0]}, domain_shape=(2, 3), contribution_bound=1)
    more = ProtectedMarginals(
        {(0,): [1.0, 2.0], (1,): [1.0, 1.0, 1.0]}, domain_shape=(2, 3), contribution_bound=1
    )
    with pytest.raises(ValueError, match="the same marginals"):
        ProtectedMarginals.combination([tables, more], [1.0, 1.0])
    bound = ProtectedMarginals({(0,): [1.0, 2.0]}, domain_shape=(2, 3), contribution_bound=2)
    with pytest.raises(ValueError, match="one domain and contribution bound"):
        ProtectedMarginals.combination([tables, bound], [1.0, 1.0])


def test_a_data_dependent_cell_mechanism_and_a_foreign_plan_format_are_refused(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    # DAWA needs Laplace noise, so no series spec plans it: the plan is edited to name it
    dawa = dataclasses.replace(make_plan(spec), chosen="dawa")
    with pytest.raises(SpecError, match="'dawa' is not a data-independent linear strategy"):
        make_series_plan(spec, dawa)
    plan = make_series_plan(spec, make_plan(spec))
    with pytest.raises(SpecError, match="series plan format"):
        SeriesPlan.from_json(plan.to_json() | {"format": "other/1"})


def test_a_duplicated_arrival_of_the_last_period_is_skipped_charging_nothing(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    first = _write_period(data, 1, seed=1)
    _release(_spec(data), catalog, tmp_path / "out")
    arrived = _spec(first)  # a triggered run: the arrived file is the source
    plan = make_plan(arrived)
    count = len(catalog.ledger_entries(arrived.dataset.id))
    skipped = series.register(
        arrived,
        plan,
        catalog,
        release_id="dup",
        directory=tmp_path / "out" / "dup",
        on_unchanged="skip",
    )
    assert isinstance(skipped, SkippedRelease)
    entries = catalog.ledger_entries(arrived.dataset.id)[count:]
    assert [(e.kind, e.cost.rho) for e in entries] == [("skipped", 0.0)]
    # the next period's file is released under the same policy
    second = _spec(_write_period(data, 2, seed=2))
    step, _ = series.register(
        second,
        plan,
        catalog,
        release_id="next",
        directory=tmp_path / "out" / "next",
        on_unchanged="skip",
    )
    assert step.period == 1


def test_a_period_claimed_by_a_running_release_is_refused_and_a_failed_claim_lapses(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = _spec(data)
    plan = make_plan(spec)
    _write_period(data, 1, seed=1)
    out = tmp_path / "out"
    step, _ = series.register(spec, plan, catalog, release_id="first", directory=out / "first")
    # a second run started before the first measured: refused, nothing charged, marked failed
    with pytest.raises(SpecError, match="period 1 is being released by another run"):
        series.register(spec, plan, catalog, release_id="second", directory=out / "second")
    assert catalog.release("second").status == "failed"
    assert [e.kind for e in catalog.ledger_entries(spec.dataset.id)] == ["series-plan"]
    # the first run failed before measuring: its claim lapses and a third run releases period 1
    catalog.update_release("first", status="failed")
    third, _ = series.register(spec, plan, catalog, release_id="third", directory=out / "third")
    assert third.period == step.period == 0
    series.measure(spec, plan, third, catalog, release_id="third")
    assert [p.release_id for p in series.recorded_periods(catalog, spec)] == ["third"]


def test_plan_shows_the_recorded_plan_once_the_series_started(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _write_period(data, 1, seed=1)
    raw = raw_series_spec()
    raw["dataset"]["source"] = str(data)
    path = tmp_path / "series.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))  # the domain order is the cell layout
    runner = CliRunner()
    before = json.loads(runner.invoke(app, ["plan", str(path), "--json"]).output)["series"]
    assert before["recorded"] is False
    _release(parse_spec(raw), Catalog(), tmp_path / "out")
    after = json.loads(runner.invoke(app, ["plan", str(path), "--json"]).output)["series"]
    assert after["recorded"] and after["follows_recorded"] and after["periods_released"] == 1
    recorded = series.recorded_plan(Catalog(), parse_spec(raw))
    assert recorded is not None and after["plan_sha256"] == recorded.digest()
    text = runner.invoke(app, ["plan", str(path)])
    assert "1 of 12 periods released" in " ".join(text.output.split())
    path.write_text(yaml.safe_dump(raw | {"privacy": {"rho": 0.25}}))
    changed = json.loads(runner.invoke(app, ["plan", str(path), "--json"]).output)["series"]
    assert changed["recorded"] and not changed["follows_recorded"]
    assert "its run would be refused" in " ".join(
        runner.invoke(app, ["plan", str(path)]).output.split()
    )


def test_later_periods_follow_the_recorded_cell_mechanism_whatever_auto_chooses(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = _spec(data)
    _write_period(data, 1, seed=1)
    _release(spec, catalog, tmp_path / "out")
    recorded = series.recorded_plan(catalog, spec)
    assert recorded is not None
    other = "identity" if recorded.cell_mechanism != "identity" else "hierarchical"
    # auto chose another cell mechanism this time (e.g. once the strategy store filled up)
    drifted = dataclasses.replace(
        make_plan(spec.model_copy(update={"mechanism": other})),
        workload_fingerprint=spec.workload_fingerprint(),
    )
    assert drifted.chosen == other
    with pytest.raises(SpecError, match="differs from the recorded plan's"):
        series.series_plan_for(spec, drifted, catalog)
    followed = series.cell_plan(spec, drifted, catalog)
    assert followed.chosen == recorded.cell_mechanism
    _write_period(data, 2, seed=2)
    step, _ = series.register(
        spec, followed, catalog, release_id="p2", directory=tmp_path / "out" / "p2"
    )
    assert step.period == 1


def test_the_series_accountant_charges_only_zcdp_costs() -> None:
    accountant = series.SeriesAccountant(
        Catalog(), dataset_id="d", release_id="r", multipliers={"a": 1.0}
    )
    with pytest.raises(CatalogError, match="a series charges zCDP costs"):
        accountant.charge(PrivacyCost(measure="pure", epsilon=1.0), label="laplace")
    assert not accountant.holds("anything")
