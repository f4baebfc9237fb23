"""A series' audit report charts each table's rows over the periods released so far: the figures
drawn are exactly the published ones (earlier periods' published table files and this release's
own), periods not published are left out and named, and a published file that no longer matches
its manifest is not drawn.  Each period runs through the stage functions (no Prefect) and is
published by a review, on SQLite and on a real PostgreSQL server (``catalog_url``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release, series
from dprelease.catalog.confidential.inputs import Ingested, describe_unit
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.publishing import series_report
from dprelease.catalog.publishing.series_report import SERIES_ROWS, series_history
from dprelease.catalog.review.decisions import review
from dprelease.catalog.spec.load import parse_spec
from tests.unit.catalog.test_spec_series import raw_series_spec

PARTS = ["period", "cumulative", "rolling2"]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))


def series_spec(folder: Path, **series_fields: Any) -> Any:
    raw = raw_series_spec()
    raw["dataset"]["source"] = str(folder)
    raw["series"] = {
        "period": "file",
        "horizon": 4,
        "time_workload": ["period", "cumulative", {"rolling": 2}],
    } | series_fields
    return parse_spec(raw)


def write_period(folder: Path, period: int, *, rows: int = 90) -> None:
    rng = np.random.default_rng(period)  # public randomness: synthetic test data
    table = pa.table({"region": rng.choice(["n", "s", "e"], rows), "age": rng.integers(0, 4, rows)})
    pq.write_table(table, folder / f"2026-{period:02d}.parquet")


def run_period(spec: Any, catalog: Catalog, out: Path) -> Path:
    """One period through the series stages and staging (what ``release_period`` runs)."""
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    directory = release.release_directory(out, release_id)
    step, before = series.register(spec, plan, catalog, release_id=release_id, directory=directory)
    measured, files, fingerprint = series.measure(spec, plan, step, catalog, release_id=release_id)
    tables = series.reconstruct(spec, plan, catalog, period=step.period)
    validation = series.validate(tables, plan, tuple(spec.series.part_names()), directory=directory)
    ingested = Ingested(
        data=None,
        input_fingerprint=fingerprint,
        files=tuple(files),
        privacy_unit=describe_unit(spec),
    )
    staged = release.stage(
        spec=spec,
        plan=plan,
        release_id=release_id,
        directory=directory,
        ingested=ingested,
        measurement=measured,
        tables=tables,
        validation=validation,
        spent_before=before,
        catalog=catalog,
    )
    return Path(staged.directory)


def series_data(report: Path) -> dict[str, Any]:
    found = re.search(
        r"<script type='application/json' id='series-data'>(.*?)</script>",
        report.read_text(),
        re.S,
    )
    assert found is not None, "no series data in the report"
    return json.loads(found.group(1))


def published(directory: Path, name: str, rows: int) -> dict[str, list[Any]]:
    table = pq.read_table(directory / "tables" / f"{name}.parquet").slice(0, rows)
    return {c: table[c].to_pylist() for c in ("estimate", "std_error", "ci_low", "ci_high")}


def test_the_report_charts_every_published_period_with_exactly_its_published_figures(
    tmp_path: Path, catalog_url: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog(catalog_url)
    spec = series_spec(data)
    shown: list[Path] = []  # each period's published directory, then the last one staged
    for period in (1, 2, 3):
        write_period(data, period)
        directory = run_period(spec, catalog, tmp_path / "out")
        if period < 3:
            done = review(catalog, directory.name, approve=True, reviewer="Ada", note="checked")
            assert done["status"] == "published"
            shown.append(Path(done["published_directory"]))
        else:
            shown.append(directory)
    report = shown[-1] / "report.html"
    figures = series_data(report)
    assert (figures["period"], figures["horizon"]) == (3, 4)
    manifest = json.loads((shown[-1] / "manifest.json").read_text())
    assert figures["plan_sha256"] == manifest["mechanism"]["details"]["series"]["plan_sha256"]
    assert sorted(figures["tables"]) == sorted(manifest["tables"])
    charts = 0
    for name, drawn in figures["tables"].items():
        assert drawn["periods"] == [1, 2, 3]
        assert drawn["release_ids"] == [d.name for d in shown]
        rows = min(drawn["table_rows"], SERIES_ROWS)
        charts += rows
        assert len(drawn["rows"]) == rows
        for k, directory in enumerate(shown):
            expected = published(directory, name, rows)
            for column, values in expected.items():
                assert [row[k] for row in drawn[column]] == values, (name, column, k)
    text = report.read_text()
    assert text.count("over periods'><svg") == charts
    assert "Period <b>3</b> of <b>4</b>" in text and "Not shown" not in text
    for part in PARTS:
        assert f"<h3>{part}</h3>" in text
    assert "<h4>by_region.cumulative</h4>" in text
    # the report re-rendered at publication shows the same history
    done = review(catalog, shown[-1].name, approve=True, reviewer="Ada", note="checked")
    again = series_data(Path(done["published_directory"]) / "report.html")
    assert again == figures


def test_unpublished_and_altered_periods_are_left_out_and_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = series_spec(data)
    write_period(data, 1)
    rejected = run_period(spec, catalog, tmp_path / "out")
    review(catalog, rejected.name, approve=False, reviewer="Ada", note="not this one")
    write_period(data, 2)
    second = run_period(spec, catalog, tmp_path / "out")
    figures = series_data(second / "report.html")
    assert {tuple(t["periods"]) for t in figures["tables"].values()} == {(2,)}
    text = (second / "report.html").read_text()
    assert "period 1: not published" in text
    target = Path(
        review(catalog, second.name, approve=True, reviewer="Ada", note="ok")["published_directory"]
    )
    # a published table file changed after publication: that period is not drawn
    altered = target / "tables" / "all.period.parquet"
    table = pq.read_table(altered)
    pq.write_table(table.set_column(0, "estimate", pa.array([1e6] * table.num_rows)), altered)
    write_period(data, 3)
    third = run_period(spec, catalog, tmp_path / "out")
    figures = series_data(third / "report.html")
    assert {tuple(t["periods"]) for t in figures["tables"].values()} == {(3,)}
    text = (third / "report.html").read_text()
    assert f"period 2 (release {second.name}): a published table file does not match" in text
    assert "period 2: not published" not in text


def test_a_period_whose_rows_are_another_layout_is_left_out(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog()
    spec = series_spec(data)
    write_period(data, 1)
    first = run_period(spec, catalog, tmp_path / "out")
    target = Path(
        review(catalog, first.name, approve=True, reviewer="Ada", note="ok")["published_directory"]
    )
    write_period(data, 2)
    second = run_period(spec, catalog, tmp_path / "out")
    manifest = json.loads((second / "manifest.json").read_text())
    tables = {n: pq.read_table(second / "tables" / f"{n}.parquet") for n in manifest["tables"]}
    history = series_history(manifest, tables, catalog)
    assert history is not None and [p.period for p in history.periods] == [1, 2]
    # the same published figures read against tables whose rows come in another order
    reordered = {
        n: t.take(list(range(t.num_rows))[::-1]) if t.num_rows > 1 else t for n, t in tables.items()
    }
    history = series_history(manifest, reordered, catalog)
    assert history is not None and [p.period for p in history.periods] == [2]
    assert history.left_out == (
        f"period 1 (release {target.name}): its tables' rows are not this release's rows "
        "(another cell layout)",
    )


def test_the_section_draws_at_most_its_chart_budget_and_names_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_period(data, 1)
    directory = run_period(series_spec(data), Catalog(), tmp_path / "out")
    manifest = json.loads((directory / "manifest.json").read_text())
    tables = {n: pq.read_table(directory / "tables" / f"{n}.parquet") for n in manifest["tables"]}
    history = series_history(manifest, tables, Catalog())
    assert history is not None
    monkeypatch.setattr(series_report, "SERIES_CHARTS", 4)  # by_region.period (3) + all.period
    html_text = series_report.series_section(history, list(tables), PARTS)
    assert html_text.count("over periods'><svg") == 4
    assert "Not charted (4 tables; the section draws at most 4 charts)" in html_text
    drawn = json.loads(html_text.split("id='series-data'>")[1].split("</script>")[0])
    assert sorted(drawn["tables"]) == ["all.period", "by_region.period"]


def test_a_release_that_is_not_a_period_has_no_series_history(tmp_path: Path) -> None:
    manifest = {"mechanism": {"details": {}}, "dataset_id": "d", "name": "n", "release_id": "r"}
    assert series_history(manifest, {}, Catalog()) is None
