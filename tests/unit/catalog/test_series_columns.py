"""A series whose periods are the values of a column (``series.period: {column, values}``),
through the stage functions (no Prefect): the declared periods are the ledger's partitions, each
run releases the next declared value (from the catalog, never the data), a period is its rows
alone (filtered in the scan), its keyed fingerprint is that of its counts (independent of file
layout and row order), a changed past period is refused before any charge or noise, undeclared
and null period values follow ``on_out_of_domain`` without naming a value, each release charges
exactly its increments (event level) or the whole dataset (person level), show/verify name the
period by its value, budget names every declared period (released or not), the Dask reader
publishes what the local reader publishes, and an arrival (one export re-written in place, or one
new file per month, flat or in hive folders) releases the next month from the whole source."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import yaml
from typer.testing import CliRunner

from dprelease.catalog import partitions, release, series
from dprelease.catalog.confidential.check import check_data
from dprelease.catalog.confidential.marginal_source import count_marginals
from dprelease.catalog.confidential.source import count_cells, period_rows
from dprelease.catalog.engine import Execution
from dprelease.catalog.errors import DataError, SpecError
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.series import SeriesPlan, make_series_plan
from dprelease.catalog.series_audit import series_problems, series_summary
from dprelease.catalog.spec.load import load_spec, parse_spec
from dprelease.catalog.watch_state import WatchState
from dprelease.flows.cli import app
from dprelease.flows.deployed_release import check_arrived_file
from dprelease.flows.watch import ArrivalEvent, SpecResolver, Watcher, file_fingerprint
from dprelease.tasks.stages import load_spec_task
from tests.unit.catalog.test_series_report import run_period
from tests.unit.catalog.test_spec_series import MONTHS, raw_column_series, raw_series_spec

SECRET = "2031-07"
"""An undeclared period value planted in the data: it must appear in no message."""


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))


def month_rows(month: str, *, seed: int, rows: int = 60, people: bool = False) -> pa.Table:
    rng = np.random.default_rng(seed)  # public randomness: synthetic test data
    columns: dict[str, Any] = {
        "month": [month] * rows,
        "region": rng.choice(["n", "s", "e"], rows),
        "age": rng.integers(0, 4, rows),
    }
    if people:
        columns["pid"] = rng.integers(0, 25, rows)  # the same people in every month
    return pa.table(columns)


def write_months(path: Path, count: int, **kwargs: Any) -> pa.Table:
    """The source re-exported with the first ``count`` months (one file, months in order)."""
    table = pa.concat_tables(
        [month_rows(m, seed=k, **kwargs) for k, m in enumerate(MONTHS[:count])]
    )
    pq.write_table(table, path)
    return table


def column_spec(source: Path, **raw_overrides: Any) -> Any:
    raw = raw_column_series()
    raw["dataset"]["source"] = str(source)
    raw["series"]["time_workload"] = ["period", "cumulative"]
    return parse_spec(raw | raw_overrides)


def register_and_measure(spec: Any, catalog: Catalog, out: Path) -> series.SeriesStep:
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    directory = release.release_directory(out, release_id)
    step, _ = series.register(spec, plan, catalog, release_id=release_id, directory=directory)
    try:
        series.measure(spec, plan, step, catalog, release_id=release_id)
    except BaseException:
        catalog.update_release(release_id, status="failed")  # what the flow does (mark_stopped)
        raise
    return step


def release_tables(spec: Any, catalog: Catalog, out: Path) -> dict[str, pa.Table]:
    """One period measured and its tables estimated (no staging: what the tests compare)."""
    step = register_and_measure(spec, catalog, out)
    return series.reconstruct(spec, make_plan(spec), catalog, period=step.period)


def entries(catalog: Catalog, dataset_id: str) -> list[Any]:
    return catalog.ledger_entries(dataset_id) if dataset_id in catalog.dataset_ids() else []


def test_the_partitions_are_the_declared_periods_and_a_release_names_only_those_it_read(
    tmp_path: Path,
) -> None:
    spec = column_spec(tmp_path / "data.parquet")
    assert partitions.release_partitions(spec) == tuple(f"month={m}" for m in MONTHS)
    assert partitions.period_partitions(spec) == [f"month={m}" for m in MONTHS]
    details = {"series": {"charges": {"month=2026-02": 0.1, "month=2026-01": 0.2}}}
    assert partitions.charged_partitions(spec, files=None, details=details) == (
        "month=2026-01",
        "month=2026-02",
    )
    assert partitions.charged_partitions(spec, files=None, details={}) == tuple(
        f"month={m}" for m in MONTHS
    )
    assert "the periods of column 'month'" in str(partitions.assumption(spec))
    file_periods = parse_spec(
        raw_column_series() | {"series": None} | {"dataset": {"id": "d", "budget": {"rho": 1.0}}}
    )
    assert partitions.period_partitions(file_periods) == []


def test_periods_release_in_declared_order_each_charging_exactly_its_increments(
    tmp_path: Path,
) -> None:
    source = tmp_path / "data.parquet"
    values = ["jan", "feb", "mar"]  # declared order, not sorted order
    raw = raw_column_series(values=values)
    raw["dataset"]["source"] = str(source)
    spec = parse_spec(raw)
    # a backfill: the source holds every month before the first release; which period a run
    # releases comes from the catalog (the next declared value), never from the data
    pq.write_table(pa.concat_tables([month_rows(v, seed=k) for k, v in enumerate(values)]), source)
    catalog = Catalog()
    plan = make_series_plan(spec, make_plan(spec))
    for period in range(3):
        before = len(entries(catalog, spec.dataset.id))
        step = register_and_measure(spec, catalog, tmp_path / "out")
        assert step.period == period and step.periods == tuple(range(period + 1))
        charges = [e for e in entries(catalog, spec.dataset.id)[before:] if e.kind == "charge"]
        assert [e.partition for e in charges] == [f"month={v}" for v in values[: period + 1]]
        unit = charges[-1].cost.rho / plan.A[period, period] ** 2
        assert unit <= plan.rho_unit * (1 + 1e-12)
        for s, entry in enumerate(charges):
            assert entry.cost.rho == pytest.approx(plan.A[period, s] ** 2 * unit, rel=1e-12)
    recorded = series.recorded_periods(catalog, spec)
    assert [p.file_name for p in recorded] == [f"month={v}" for v in values]
    spent = {s.partition: s.spent.rho for s in catalog.partition_spending(spec.dataset.id)}
    assert set(spent) == {f"month={v}" for v in values}
    assert max(spent.values()) == pytest.approx(0.5, rel=1e-6)
    assert all(rho <= 0.5 + 1e-12 for rho in spent.values())
    count = len(entries(catalog, spec.dataset.id))
    with pytest.raises(SpecError, match="horizon of 3 periods"):
        register_and_measure(spec, catalog, tmp_path / "out")
    assert len(entries(catalog, spec.dataset.id)) == count


def _period_fingerprints(spec: Any, key: Any) -> list[str]:
    return [
        count_cells(spec, key=key, rows=period_rows(spec, t)).input_fingerprint for t in range(3)
    ]


def test_a_period_fingerprint_ignores_layout_and_order_and_changes_with_one_row(
    tmp_path: Path,
) -> None:
    key = Catalog().key
    table = pa.concat_tables([month_rows(m, seed=k) for k, m in enumerate(MONTHS)])
    one_file = tmp_path / "one.parquet"
    pq.write_table(table, one_file)
    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    order = np.random.default_rng(7).permutation(table.num_rows)  # public test randomness
    pq.write_table(table.take(order[:70]), shuffled / "a.parquet", row_group_size=16)
    pq.write_table(table.take(order[70:]), shuffled / "b.parquet")
    hive = tmp_path / "hive"  # the period column as the folder key: month=2026-01/part.parquet
    for month in MONTHS:
        (hive / f"month={month}").mkdir(parents=True)
        rows = table.filter(pa.compute.equal(table["month"], month)).drop_columns(["month"])
        pq.write_table(rows, hive / f"month={month}" / "part.parquet")
    fingerprints = [
        _period_fingerprints(column_spec(path), key) for path in (one_file, shuffled, hive)
    ]
    assert fingerprints[0] == fingerprints[1] == fingerprints[2]
    assert len(set(fingerprints[0])) == 3
    spec = column_spec(one_file)
    plan = make_plan(spec.model_copy(update={"mechanism": "marginal_space"}))
    marginals = [
        count_marginals(
            column_spec(path),
            subsets=plan.strategy.marginal_subsets,
            output_rows=plan.num_queries,
            key=key,
            rows=period_rows(spec, 0),
        ).input_fingerprint
        for path in (one_file, shuffled, hive)
    ]
    assert len(set(marginals)) == 1
    # one row of period 2 moved to another region: period 2's fingerprint changes, no other
    regions = table["region"].to_pylist()
    row = 60 + 5
    regions[row] = "n" if regions[row] != "n" else "s"
    changed = table.set_column(table.schema.get_field_index("region"), "region", pa.array(regions))
    pq.write_table(changed, one_file)
    after = _period_fingerprints(spec, key)
    assert after[1] != fingerprints[0][1]
    assert (after[0], after[2]) == (fingerprints[0][0], fingerprints[0][2])


def test_a_changed_past_period_is_refused_before_any_charge_or_noise(
    tmp_path: Path, zero_noise: Any
) -> None:
    source = tmp_path / "data.parquet"
    spec = column_spec(source)
    catalog = Catalog()
    first = write_months(source, 1)
    register_and_measure(spec, catalog, tmp_path / "out")
    # the re-export changed one row of the released month, and added the next month
    regions = first["region"].to_pylist()
    regions[0] = "n" if regions[0] != "n" else "e"
    edited = first.set_column(1, "region", pa.array(regions))
    pq.write_table(pa.concat_tables([edited, month_rows(MONTHS[1], seed=1)]), source)
    ledger = [e.receipt_id for e in entries(catalog, spec.dataset.id)]
    draws = len(zero_noise.calls)
    with pytest.raises(DataError) as info:
        register_and_measure(spec, catalog, tmp_path / "out")
    message = str(info.value)
    assert "rows of released period 1 (2026-01) in column 'month' changed" in message
    assert not any(ch.isdigit() for ch in message.split("(2026-01)")[1])  # no count
    assert [e.receipt_id for e in entries(catalog, spec.dataset.id)] == ledger
    assert len(zero_noise.calls) == draws  # no noise drawn
    # restored as released: the refused run's claim lapsed, period 2 is released
    pq.write_table(pa.concat_tables([first, month_rows(MONTHS[1], seed=1)]), source)
    assert register_and_measure(spec, catalog, tmp_path / "out").period == 1


def test_undeclared_and_null_period_values_follow_on_out_of_domain_naming_no_value(
    tmp_path: Path, zero_noise: Any
) -> None:
    source = tmp_path / "data.parquet"
    clean = write_months(source, 1)
    stray = pa.concat_tables([clean, month_rows(SECRET, seed=9, rows=7)])
    nulls = pa.concat_tables(
        [
            clean,
            month_rows(MONTHS[0], seed=9, rows=3).set_column(0, "month", pa.nulls(3, pa.string())),
        ]
    )
    catalog = Catalog()
    spec = column_spec(source)
    for table, needle in (
        (stray, "has values that are not series.period.values"),
        (nulls, "has null values"),
    ):
        pq.write_table(table, source)
        with pytest.raises(DataError, match=needle) as info:
            register_and_measure(spec, catalog, tmp_path / "out")
        assert SECRET not in str(info.value) and "7" not in str(info.value)
        assert [e.kind for e in entries(catalog, spec.dataset.id)] == ["series-plan"]
    assert zero_noise.calls == []
    # drop: the stray and null rows are left out; the period publishes the clean month's counts
    dropping = column_spec(source, on_out_of_domain="drop")
    published = []
    for table in (clean, pa.concat_tables([stray, nulls.slice(clean.num_rows)])):
        pq.write_table(table, source)
        home = tmp_path / f"catalog-{len(published)}.db"
        tables = release_tables(dropping, Catalog(f"sqlite:///{home}"), tmp_path / "out")
        published.append(tables["by_region.period"])
    assert published[0].equals(published[1])


def test_a_period_without_rows_is_refused_charging_nothing(tmp_path: Path) -> None:
    source = tmp_path / "data.parquet"
    spec = column_spec(source)
    catalog = Catalog()
    write_months(source, 1)
    register_and_measure(spec, catalog, tmp_path / "out")
    count = len(entries(catalog, spec.dataset.id))
    with pytest.raises(DataError, match=r"has no rows of period 2 \(2026-02\) \(column 'month'\)"):
        register_and_measure(spec, catalog, tmp_path / "out")  # month 2 not delivered yet
    assert len(entries(catalog, spec.dataset.id)) == count
    write_months(source, 2)
    assert register_and_measure(spec, catalog, tmp_path / "out").period == 1


def test_an_unchanged_source_is_skipped_and_the_next_export_releases_the_next_month(
    tmp_path: Path,
) -> None:
    source = tmp_path / "data.parquet"
    spec = column_spec(source)
    catalog = Catalog()
    write_months(source, 1)
    register_and_measure(spec, catalog, tmp_path / "out")
    plan = make_plan(spec)
    count = len(entries(catalog, spec.dataset.id))
    skipped = series.register(
        spec,
        plan,
        catalog,
        release_id="again",
        directory=tmp_path / "out" / "again",
        on_unchanged="skip",
    )
    assert isinstance(skipped, SkippedRelease)
    assert [(e.kind, e.cost.rho) for e in entries(catalog, spec.dataset.id)[count:]] == [
        ("skipped", 0.0)
    ]
    write_months(source, 2)
    step, _ = series.register(
        spec,
        plan,
        catalog,
        release_id="next",
        directory=tmp_path / "out" / "next",
        on_unchanged="skip",
    )
    assert step.period == 1 and set(step.charges) == {"month=2026-01", "month=2026-02"}


def test_person_level_column_periods_charge_the_whole_dataset_in_sequence(tmp_path: Path) -> None:
    source = tmp_path / "data.parquet"
    raw = raw_column_series()
    raw["dataset"] = {"id": "people", "source": str(source), "budget": {"rho": 2.0}}
    raw["privacy_unit"] = {"person_column": "pid", "max_rows": 2}
    spec = parse_spec(raw)
    plan = make_series_plan(spec, make_plan(spec))
    catalog = Catalog()
    for period in range(3):
        write_months(source, period + 1, people=True)
        before = len(entries(catalog, "people"))
        register_and_measure(spec, catalog, tmp_path / "out")
        charges = [e for e in entries(catalog, "people")[before:] if e.kind == "charge"]
        assert [e.partition for e in charges] == [None]
        multiplier = float(np.abs(plan.A[period, : period + 1]).sum()) ** 2
        assert charges[0].cost.rho == pytest.approx(multiplier * plan.rho_unit, rel=1e-6)
        assert charges[0].cost.rho <= multiplier * plan.rho_unit * (1 + 1e-12)
    assert catalog.spent("people").rho == pytest.approx(0.5, rel=1e-6)


def test_show_and_verify_name_the_period_by_its_value(tmp_path: Path) -> None:
    source = tmp_path / "data.parquet"
    spec = column_spec(source)
    catalog = Catalog()
    directories = []
    for count in (1, 2):
        write_months(source, count)
        directories.append(run_period(spec, catalog, tmp_path / "out"))
    manifest = json.loads((directories[1] / "manifest.json").read_text())
    details = manifest["mechanism"]["details"]["series"]
    assert (details["period_column"], details["period_value"]) == ("month", "2026-02")
    assert manifest["partitions"]["charged"] == ["month=2026-01", "month=2026-02"]
    assert manifest["input_files"] == ["data.parquet"]
    summary = series_summary(catalog, manifest["release_id"])
    assert summary is not None and summary["period_name"] == "month=2026-02"
    first = series_summary(catalog, directories[0].name)
    assert first is not None and first["period_name"] == "month=2026-01"
    assert series_problems(directories[1], catalog) == []
    assert "Period <b>2 (2026-02)</b> of <b>3</b>" in (directories[1] / "report.html").read_text()
    with catalog.engine.begin() as conn:  # the recorded period fingerprint altered
        conn.execute(
            sa.update(series.series_periods)
            .where(series.series_periods.c.period == 1)
            .values(input_fingerprint="0" * 64)
        )
    assert any("period fingerprint" in p for p in series_problems(directories[1], catalog))


def test_column_periods_counted_on_dask_publish_what_the_local_reader_publishes(
    tmp_path: Path, dask_address: str, zero_noise: Any
) -> None:
    hive = tmp_path / "hive"
    local_spec = column_spec(hive)
    on_dask = local_spec.model_copy(
        update={"execution": Execution(engine="dask", address=dask_address)}
    )
    local = Catalog(f"sqlite:///{tmp_path / 'local.db'}")
    mixed = Catalog(f"sqlite:///{tmp_path / 'mixed.db'}")
    for period, spec in ((0, local_spec), (1, on_dask)):
        folder = hive / f"month={MONTHS[period]}"
        folder.mkdir(parents=True)
        rows = month_rows(MONTHS[period], seed=period).drop_columns(["month"])
        pq.write_table(rows, folder / "part.parquet")
        expected = release_tables(local_spec, local, tmp_path / "local")
        got = release_tables(spec, mixed, tmp_path / "mixed")
        assert sorted(got) == sorted(expected)
        for name, table in expected.items():
            assert got[name].equals(table), (period, name)
    # period 1, counted locally, was re-read on the cluster and its counts' fingerprint agreed
    # (else the release of period 2 is refused as a changed past period)
    assert len(series.recorded_periods(mixed, local_spec)) == 2


def test_integer_periods_are_read_by_value_and_a_column_of_another_type_is_refused(
    tmp_path: Path, zero_noise: Any
) -> None:
    source = tmp_path / "years.parquet"
    raw = raw_column_series(column="year", values=[2024, 2025, 2026])
    raw["dataset"] |= {"source": str(source), "partitions": {"column": "year"}}
    raw["series"]["time_workload"] = ["period"]
    spec = parse_spec(raw)
    rng = np.random.default_rng(3)  # public randomness: synthetic test data
    years = pa.array(rng.choice([2024, 2025, 2026], 90), pa.int32())
    table = pa.table(
        {"year": years, "region": rng.choice(["n", "s", "e"], 90), "age": rng.integers(0, 4, 90)}
    )
    pq.write_table(table, source)
    assert period_rows(spec, 1).label == "period 2 (2025)"
    published = release_tables(spec, Catalog(), tmp_path / "out")["by_region.period"]
    rows = table.filter(pa.compute.equal(table["year"], 2024))["region"].to_pylist()
    exact = [rows.count(region) for region in published["region"].to_pylist()]
    np.testing.assert_allclose(published["estimate"].to_numpy(), exact, atol=1e-9)
    pq.write_table(table.set_column(0, "year", years.cast(pa.string())), source)
    with pytest.raises(DataError, match=r"column 'year' does not hold integer values, which "):
        count_cells(spec, key=Catalog().key, rows=period_rows(spec, 0))


def test_the_custodians_check_counts_undeclared_and_null_period_values(tmp_path: Path) -> None:
    source = tmp_path / "data.parquet"
    clean = write_months(source, 2)
    nulls = month_rows(MONTHS[0], seed=8, rows=3).set_column(0, "month", pa.nulls(3, pa.string()))
    pq.write_table(pa.concat_tables([clean, month_rows(SECRET, seed=9, rows=7), nulls]), source)
    report = check_data(column_spec(source))
    assert report.rows == clean.num_rows + 10 and report.rows_counted == clean.num_rows
    [null_line, outside_line] = report.problems
    assert null_line.startswith("column 'month': 3 null row(s)")
    assert "column 'month': 7 row(s) outside values" in outside_line and SECRET in outside_line


def test_budget_names_every_column_period_by_its_declared_value_before_its_release(
    tmp_path: Path,
) -> None:
    source = tmp_path / "data.parquet"
    spec = column_spec(source)
    catalog = Catalog()
    write_months(source, 1)
    register_and_measure(spec, catalog, tmp_path / "out")
    result = CliRunner().invoke(app, ["budget", spec.dataset.id, "--json"])
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(result.stdout)["datasets"][0]["series"]
    rows = summary["periods"]
    assert [r["partition"] for r in rows] == [f"month={m}" for m in MONTHS]
    assert [r["period_name"] for r in rows] == [f"month={m}" for m in MONTHS]
    assert [r["released"] for r in rows] == [True, False, False]
    assert rows[0]["spent_rho"] > 0 and [r["spent_rho"] for r in rows[1:]] == [0, 0]
    text = " ".join(CliRunner().invoke(app, ["budget", spec.dataset.id]).output.split())
    assert "month=2026-03" in text and "(not released)" not in text
    # the declared names are recorded in the plan (hash-chained); a file series' plan is as before
    plan = series.recorded_plan(catalog, spec)
    assert plan is not None and plan.period_names == tuple(f"month={m}" for m in MONTHS)
    assert SeriesPlan.from_json(plan.to_json()).digest() == plan.digest()
    file_spec = parse_spec(raw_series_spec())
    assert "period_names" not in make_series_plan(file_spec, make_plan(file_spec)).to_json()


def test_budget_names_a_person_level_column_period_before_and_after_its_release(
    tmp_path: Path,
) -> None:
    source = tmp_path / "data.parquet"
    raw = raw_column_series()
    raw["dataset"] = {"id": "people", "source": str(source), "budget": {"rho": 2.0}}
    raw["privacy_unit"] = {"person_column": "pid", "max_rows": 2}
    spec = parse_spec(raw)
    write_months(source, 1, people=True)
    register_and_measure(spec, Catalog(), tmp_path / "out")
    rows = json.loads(CliRunner().invoke(app, ["budget", "people", "--json"]).stdout)["datasets"][
        0
    ]["series"][0]["periods"]
    assert [r["partition"] for r in rows] == [None, None, None]  # charged to the whole dataset
    assert [r["period_name"] for r in rows] == [f"month={m}" for m in MONTHS]
    text = " ".join(CliRunner().invoke(app, ["budget", "people"]).output.split())
    assert "month=2026-01 (whole dataset)" in text and "month=2026-02 (not released)" in text


def _arrivals(watcher: Watcher) -> list[ArrivalEvent]:
    """Two polls: a file is announced once its size and mtime held still across them."""
    return watcher.poll() + watcher.poll()


def _release_arrival(spec_path: Path, event: ArrivalEvent, catalog: Catalog, out: Path) -> int:
    """What the arrival-triggered deployment runs before the period's stages: the announced
    file's fingerprint checked, the spec loaded with the arrived file as its override."""
    check_arrived_file(event.path, event.fingerprint)
    spec = load_spec_task.fn(str(spec_path), event.path)
    return register_and_measure(spec, catalog, out).period


def test_each_rewrite_of_one_export_is_announced_and_its_arrival_releases_the_next_month(
    tmp_path: Path,
) -> None:
    landing, specs = tmp_path / "landing", tmp_path / "specs"
    landing.mkdir()
    specs.mkdir()
    export = landing / "export.parquet"
    raw = raw_column_series() | {"trigger": "arrival"}
    raw["dataset"]["source"] = str(export)
    raw["series"]["time_workload"] = ["period", "cumulative"]
    spec_path = specs / "months.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    watcher = Watcher(
        landing,
        state=WatchState(f"sqlite:///{tmp_path / 'watch.db'}"),
        emitter=lambda event: None,
        resolve_datasets=SpecResolver(specs),
    )
    catalog = Catalog()
    for count in (1, 2, 3):
        write_months(export, count)  # re-written in place, one month more
        mtime = export.stat().st_mtime_ns + count * 1_000_000  # a coarse clock: still a change
        os.utime(export, ns=(mtime, mtime))
        [event] = _arrivals(watcher)
        assert (event.dataset_id, event.path) == ("monthly", str(export.resolve()))
        assert _release_arrival(spec_path, event, catalog, tmp_path / "out") == count - 1
        content = export.read_bytes()
        export.write_bytes(content)  # the same export written again: nothing announced
        os.utime(export, ns=(mtime + 500_000, mtime + 500_000))
        assert _arrivals(watcher) == []
    assert [p.file_name for p in series.recorded_periods(catalog, load_spec(spec_path))] == [
        f"month={m}" for m in MONTHS
    ]


def test_an_arriving_file_starts_the_release_of_the_whole_source_of_a_column_series(
    tmp_path: Path,
) -> None:
    """One new file per month (flat, or hive folders holding the period in their name): the
    release reads the whole source, so the past months its strategy row needs are there."""
    for layout in ("flat", "hive"):
        source = tmp_path / layout
        raw = raw_column_series() | {"trigger": "arrival"}
        raw["dataset"] |= {"id": f"months-{layout}", "source": str(source)}
        raw["series"]["time_workload"] = ["period", "cumulative"]
        spec_path = tmp_path / f"{layout}.yaml"
        spec_path.write_text(yaml.safe_dump(raw))
        catalog = Catalog()
        for period, month in enumerate(MONTHS[:2]):
            rows = month_rows(month, seed=period)
            if layout == "hive":
                arrived = source / f"month={month}" / "part.parquet"
                rows = rows.drop_columns(["month"])
            else:
                arrived = source / f"{month}.parquet"
            arrived.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, arrived)
            event = ArrivalEvent(
                dataset_id=f"months-{layout}",
                path=str(arrived),
                fingerprint=file_fingerprint(arrived),
                size=arrived.stat().st_size,
            )
            assert _release_arrival(spec_path, event, catalog, tmp_path / "out") == period
            loaded = load_spec_task.fn(str(spec_path), str(arrived))
            assert loaded.dataset.source == str(source)
    file_series = tmp_path / "files.yaml"  # file periods: the arrived file is the next period
    file_series.write_text(yaml.safe_dump(raw_series_spec() | {"trigger": "arrival"}))
    arrived = str(tmp_path / "landing" / "2026-03.parquet")
    assert load_spec_task.fn(str(file_series), arrived).dataset.source == arrived
