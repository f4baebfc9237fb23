"""show, budget and verify of a series: ``dprelease show`` names the series, period t of T, the
plan digest and each partition's charge next to the plan's; ``dprelease budget`` shows per
period's partition the planned rho over the horizon and what is spent so far; ``verify`` checks a
period's release against the recorded plan (digest, period row, charges, and its published rows
re-derived from the recorded measurements) and fails on each alteration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.series_audit import (
    recorded_plans,
    series_problems,
    verify_release_and_series,
)
from dprelease.catalog.spec.load import parse_spec
from dprelease.flows.cli import app
from tests.unit.catalog.test_series_report import run_period, series_spec, write_period
from tests.unit.catalog.test_spec_series import raw_series_spec

runner = CliRunner()


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))


def two_periods(tmp_path: Path) -> tuple[Catalog, list[Path]]:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = series_spec(data)
    directories = []
    for period in (1, 2):
        write_period(data, period)
        directories.append(run_period(spec, catalog, tmp_path / "out"))
    return catalog, directories


def test_show_names_the_series_period_plan_and_each_partitions_charge(tmp_path: Path) -> None:
    catalog, directories = two_periods(tmp_path)
    plan = recorded_plans(catalog, "monthly")[0]
    shown = runner.invoke(app, ["show", directories[1].name, "--json"])
    assert shown.exit_code == 0, shown.output
    series = json.loads(shown.stdout)["series"]
    assert (series["name"], series["period"], series["horizon"]) == ("monthly", 2, 4)
    assert series["plan_sha256"] == plan.digest() and series["file"] == "2026-02.parquet"
    ledger = {
        e.partition: e.cost.rho
        for e in catalog.ledger_entries("monthly")
        if e.release_id == directories[1].name and e.kind == "charge"
    }
    assert {c["partition"]: c["rho"] for c in series["charges"]} == ledger
    for charge, s in zip(series["charges"], (0, 1), strict=True):
        assert charge["planned_rho"] == pytest.approx(plan.A[1, s] ** 2 * plan.rho_unit)
        assert charge["rho"] <= charge["planned_rho"] * (1 + 1e-9)
    text = runner.invoke(app, ["show", directories[1].name]).output
    assert "series:     monthly, period 2 of 4" in text and plan.digest() in text
    assert "partition 2026-01.parquet: rho=" in text and "(plan: " in text


def test_budget_shows_each_periods_planned_rho_and_spending_so_far(tmp_path: Path) -> None:
    catalog, _ = two_periods(tmp_path)
    plan = recorded_plans(catalog, "monthly")[0]
    result = runner.invoke(app, ["budget", "monthly", "--json"])
    assert result.exit_code == 0, result.output
    (series,) = json.loads(result.stdout)["datasets"][0]["series"]
    assert (series["name"], series["periods_released"], series["horizon"]) == ("monthly", 2, 4)
    rows = series["periods"]
    assert [r["planned_rho"] for r in rows] == pytest.approx(plan.partition_totals())
    assert [r["partition"] for r in rows] == ["2026-01.parquet", "2026-02.parquet", None, None]
    spending = {p.partition: p.spent.rho for p in catalog.partition_spending("monthly")}
    for row in rows[:2]:
        assert row["spent_rho"] == pytest.approx(spending[row["partition"]], rel=1e-12)
        assert 0 < row["spent_rho"] <= row["planned_rho"] * (1 + 1e-9)
    assert [r["spent_rho"] for r in rows[2:]] == [0, 0]
    text = runner.invoke(app, ["budget", "monthly"]).output
    assert "series monthly: 2 of 4 periods released" in text and "(not released)" in text


def test_a_catalog_without_series_tables_lists_no_series_and_creates_none() -> None:
    catalog = Catalog()
    assert recorded_plans(catalog, "plain") == []
    assert not sa.inspect(catalog.engine).has_table("series_plans")


def test_verify_checks_a_period_against_the_recorded_plan(tmp_path: Path) -> None:
    catalog, directories = two_periods(tmp_path)
    last = directories[1]
    assert series_problems(last, catalog) == []
    assert runner.invoke(app, ["verify", str(last)]).exit_code == 0

    # a published figure changed, and the manifest and catalog hashes rewritten to match: the file
    # checks pass, the series check re-derives the rows from the recorded measurements
    path = last / "tables" / "by_region.cumulative.parquet"
    table = pq.read_table(path)
    estimate = table.column_names.index("estimate")
    shifted = pa.array([v + 1.0 for v in table["estimate"].to_pylist()])
    pq.write_table(table.set_column(estimate, "estimate", shifted), path)
    manifest = artifacts.read_manifest(last)
    manifest.pop("artifacts")
    digest = artifacts.write_manifest(last, manifest)
    catalog.update_release(last.name, manifest_sha256=digest)
    problems = series_problems(last, catalog)
    assert problems == [
        "series table 'by_region.cumulative': its rows are not the estimates the recorded plan "
        f"(sha256 {recorded_plans(catalog, 'monthly')[0].digest()[:12]}…) derives from the "
        "recorded measurements"
    ]
    result = runner.invoke(app, ["verify", str(last), "--json"])
    assert result.exit_code != 0
    assert json.loads(result.stdout)["problems"] == problems

    # a manifest naming another plan digest, and another period
    manifest = artifacts.read_manifest(last)
    manifest.pop("artifacts")
    manifest["mechanism"]["details"]["series"]["plan_sha256"] = "0" * 64
    manifest["mechanism"]["details"]["series"]["period"] = 1
    artifacts.write_manifest(last, manifest)
    problems = series_problems(last, catalog)
    assert any("is not the recorded plan's" in p for p in problems)
    assert any("period 1 is not recorded as this release" in p for p in problems)


def test_verify_ignores_a_release_that_is_not_a_period(tmp_path: Path) -> None:
    directory = tmp_path / "r"
    directory.mkdir()
    artifacts.write_manifest(directory, {"release_id": "r", "mechanism": {"details": {}}})
    assert series_problems(directory, Catalog()) == []


def test_a_person_level_series_shows_and_budgets_each_release_against_the_whole_dataset(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    raw = raw_series_spec(privacy_unit={"person_column": "pid", "max_rows": 2})
    raw["dataset"] = {"id": "people", "source": str(data), "budget": {"rho": 2.0}}
    raw["series"] = {"period": "file", "horizon": 3, "time_workload": ["cumulative"]}
    spec = parse_spec(raw)
    catalog = Catalog()
    directories = []
    for period in (1, 2):
        rng = np.random.default_rng(period)  # public randomness: synthetic test data
        table = pa.table(
            {
                "pid": rng.integers(0, 40, 90),  # the same people in every period
                "region": rng.choice(["n", "s", "e"], 90),
                "age": rng.integers(0, 4, 90),
            }
        )
        pq.write_table(table, data / f"2026-{period:02d}.parquet")
        directories.append(run_period(spec, catalog, tmp_path / "out"))
    plan = recorded_plans(catalog, "people")[0]
    shown = json.loads(runner.invoke(app, ["show", directories[1].name, "--json"]).stdout)
    (charge,) = shown["series"]["charges"]
    assert charge["partition"] is None and shown["series"]["unit"] == "person"
    assert charge["rho"] == pytest.approx(charge["planned_rho"], rel=1e-6)
    budget = json.loads(runner.invoke(app, ["budget", "people", "--json"]).stdout)
    (series,) = budget["datasets"][0]["series"]
    assert [r["planned_rho"] for r in series["periods"]] == pytest.approx(plan.partition_totals())
    assert sum(plan.partition_totals()) == pytest.approx(0.5)
    by_release = {
        e.release_id: e.cost.rho for e in catalog.ledger_entries("people") if e.kind == "charge"
    }
    assert [r["spent_rho"] for r in series["periods"]] == [
        by_release[directories[0].name],
        by_release[directories[1].name],
        0,
    ]
    assert [r["partition"] for r in series["periods"]] == [None, None, None]
    assert [r["released"] for r in series["periods"]] == [True, True, False]
    for directory in directories:
        assert series_problems(directory, catalog) == []


def test_verify_reports_an_altered_plan_and_an_unreadable_manifest_once(tmp_path: Path) -> None:
    catalog, directories = two_periods(tmp_path)
    with catalog.engine.begin() as conn:  # the recorded plan edited outside dprelease
        conn.execute(sa.text("UPDATE series_plans SET plan_sha256 = :d"), {"d": "0" * 64})
    with pytest.raises(VerificationError) as info:
        verify_release_and_series(directories[1], catalog)
    assert [p for p in info.value.problems if "series" in p] == [
        "series 'monthly': the recorded plan does not match its ledger entry (receipt "
        f"{catalog.ledger_entries('monthly')[0].receipt_id}); the catalog was altered"
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(VerificationError) as info:
        verify_release_and_series(empty, catalog)
    assert info.value.problems == (f"{empty} has no manifest.json",)
