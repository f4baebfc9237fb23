"""A report of thousands of tables (issue 28, build item 5): from ``report.SPLIT_FROM`` tables the
page's tables part is a searchable index and every table has its own page, which ``verify``
covers like any other file of the release.  The threshold is lowered to test on a few tables."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.publishing import artifacts, report
from dprelease.catalog.publishing.artifacts import verify, write_table
from tests.unit.catalog.test_report import manifest as report_manifest
from tests.unit.catalog.test_report import render, spec_with, tables_of
from tests.unit.catalog.test_review import RELEASE, build_staged

ODD = "odd<b>&'\"#? name"  # every character an HTML attribute, text or URL must escape


def named_tables() -> dict[str, pa.Table]:
    spec = spec_with(
        {"age": {"min": 0, "max": 9}, "sex": {"values": [0, 1]}},
        [
            {"name": "by_sex", "marginal": ["sex"]},
            {"name": "age_by_sex", "marginal": ["age", "sex"]},
            {"name": "by_age", "marginal": ["age"]},
        ],
    )
    tables = tables_of(spec)
    return {**tables, ODD: tables["by_sex"]}


def test_below_the_threshold_every_section_stays_on_the_one_page() -> None:
    tables = named_tables()
    assert len(tables) < report.SPLIT_FROM
    text = render(tables)
    assert text.count("<section class='tbl'") == len(tables) and "table-search" not in text


def test_above_the_threshold_the_page_is_an_index_with_a_search_box(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(report, "SPLIT_FROM", 2)
    tables = named_tables()
    text = render(tables)
    assert "<section class='tbl'" not in text and "id='table-search'" in text
    rows = re.findall(r"<div class='ir' data-name='([^']*)'>", text)
    assert len(rows) == len(tables)
    for name in tables:
        page = quote(f"report/{name}.html")
        assert f"href='{page}'" in text or f"href='{page.replace('&', '&amp;')}'" in text
    for section in ("summary", "budget", "method", "tables", "validation", "review"):
        assert f"<section id='{section}'>" in text  # the audit content is all still there
    assert report.SEARCH_SCRIPT in text and "arrival files hold disjoint sets" in text


def test_names_are_escaped_in_the_index_and_on_their_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "SPLIT_FROM", 2)
    tables = named_tables()
    text = render(tables)
    assert "odd<b>" not in text and "odd&lt;b&gt;&amp;&#x27;&quot;#? name" in text
    assert "href='report/odd%3Cb%3E%26%27%22%23%3F%20name.html'" in text
    pages = dict(report.table_pages(report_manifest(), tables))
    page = pages[f"report/{ODD}.html"]
    assert "odd<b>" not in page
    assert "href='../tables/odd%3Cb%3E%26%27%22%23%3F%20name.csv'" in page


def test_the_index_shows_each_tables_predicted_error_and_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(report, "SPLIT_FROM", 2)
    tables = named_tables()
    plan = {"item_std_errors": {"by_sex": 1.25, "by_age": 3.5}, "targets": {"by_age": 4.0}}
    index = report.searchable_index(tables, plan)
    row = re.search(r"data-name='by_age'>(.*?)</div>", index)
    assert row is not None
    cells = re.findall(NUMBER, row.group(1))
    assert cells == ["10", "3.5", "4"]  # rows, predicted std. error, target
    unknown = re.search(r"data-name='age_by_sex'>(.*?)</div>", index)
    assert unknown is not None
    assert re.findall(NUMBER, unknown.group(1)) == ["20", "", ""]


NUMBER = r"<span class='num'>([^<]*)</span>"


def page_rows(page: str) -> dict[str, Any]:
    found = re.search(r"<script type='application/json' id='data-\d+'>(.*?)</script>", page)
    assert found is not None
    return json.loads(found.group(1))


def full_manifest(directory: Path, names: list[str]) -> dict[str, Any]:
    """The staged release's manifest with what the report reads, and its tables."""
    manifest = artifacts.read_manifest(directory)
    manifest.pop("artifacts", None)
    base = report_manifest()
    return {
        **base,
        **manifest,
        "tables": names,
        "plan": {
            "chosen": "identity",
            "reason": "only candidate",
            "lower_bound_rmse": 1.0,
            "lower_bound_note": "bound",
            "candidates": [{"mechanism": "identity", "rmse": 1.5}],
        },
        "budget": {k: {"epsilon": 1.0} for k in ("cap", "before", "after", "remaining")},
        "review": {**manifest["review"], "trail": []},
    }


def split_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A staged release above the (lowered) threshold, report written by ``write_report``."""
    monkeypatch.setattr(report, "SPLIT_FROM", 2)
    staged = build_staged(tmp_path)
    tables = named_tables()
    for name, table in tables.items():
        write_table(staged.directory, name, table)
    (staged.directory / "validation" / "results.json").write_text(
        json.dumps({"success": True, "tables": {}})
    )
    manifest = full_manifest(staged.directory, list(tables))
    report.write_report(staged.directory, manifest, staged.catalog)
    digest = artifacts.write_manifest(staged.directory, manifest)
    staged.catalog.update_release(RELEASE, manifest_sha256=digest)
    return staged, tables


def test_write_report_writes_one_page_per_table_with_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged, tables = split_release(tmp_path, monkeypatch)
    written = sorted(p.name for p in (staged.directory / "report").iterdir())
    assert written == sorted(f"{name}.html" for name in tables)
    page = (staged.directory / "report" / "age_by_sex.html").read_text()
    assert page.count("<section class='tbl'") == 1 and "href='../report.html#tables'" in page
    assert page_rows(page)["n"] == tables["age_by_sex"].num_rows
    assert "table-search" in (staged.directory / "report.html").read_text()


def test_every_table_page_is_covered_by_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged, _ = split_release(tmp_path, monkeypatch)
    assert verify(staged.directory, staged.catalog) == []
    recorded = artifacts.read_manifest(staged.directory)["artifacts"]
    assert f"report/{ODD}.html" in recorded and "report/by_age.html" in recorded
    page = staged.directory / "report" / "by_age.html"
    page.write_text(page.read_text().replace("Download CSV", "Download"))
    with pytest.raises(VerificationError) as caught:
        verify(staged.directory, staged.catalog)
    assert caught.value.problems == (
        f"artifact report/by_age.html was modified (sha256 {artifacts.sha256_file(page)[:12]}…, "
        f"manifest says {recorded['report/by_age.html'][:12]}…)",
    )
    page.unlink()
    with pytest.raises(VerificationError) as caught:
        verify(staged.directory, staged.catalog)
    assert caught.value.problems == ("missing artifact report/by_age.html",)


def test_re_rendering_below_the_threshold_removes_the_table_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged, tables = split_release(tmp_path, monkeypatch)
    monkeypatch.setattr(report, "SPLIT_FROM", 100)
    manifest = full_manifest(staged.directory, list(tables))
    report.write_report(staged.directory, manifest, staged.catalog)
    assert list((staged.directory / "report").iterdir()) == []
    text = (staged.directory / "report.html").read_text()
    assert text.count("<section class='tbl'") == len(tables)


def many_table_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int):
    """A staged release (in the CLI's home) whose manifest lists ``count`` tables, every one
    written, so ``verify`` passes."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
    staged = build_staged(home)
    table = pa.table({"estimate": [1.0, 2.0]})
    names = [f"t{k:03d}" for k in range(count)]
    for name in names:
        write_table(staged.directory, name, table)
    manifest = artifacts.read_manifest(staged.directory)
    manifest.pop("artifacts")
    digest = artifacts.write_manifest(staged.directory, {**manifest, "tables": names})
    staged.catalog.update_release(RELEASE, manifest_sha256=digest)
    return staged, names


def test_show_folds_thousands_of_table_paths_into_one_line_and_json_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from dprelease.flows.cli import app
    from dprelease.flows.cli.review import SHOWN_TABLES

    staged, names = many_table_release(tmp_path, monkeypatch, 3 * SHOWN_TABLES)
    runner = CliRunner()
    text = runner.invoke(app, ["show", RELEASE])
    assert text.exit_code == 0, text.output
    listed = [line for line in text.stdout.splitlines() if line.strip().startswith("table t")]
    assert [line.split()[1] for line in listed] == [f"{n}:" for n in names[:SHOWN_TABLES]]
    assert f"… and {2 * SHOWN_TABLES} more tables in the same folder" in text.stdout
    assert str(staged.directory / "report.html") in text.stdout  # what follows is still there
    shown = json.loads(runner.invoke(app, ["show", RELEASE, "--json"]).stdout)
    assert [k for k in shown["paths"] if k.startswith("table ")] == [f"table {n}" for n in names]


def test_a_failed_verify_names_the_first_problems_and_counts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged, names = many_table_release(tmp_path, monkeypatch, artifacts.SHOWN_PROBLEMS + 5)
    assert verify(staged.directory, staged.catalog) == []
    for name in names:
        (staged.directory / "tables" / f"{name}.csv").write_text("estimate\n9\n")
    with pytest.raises(VerificationError) as caught:
        verify(staged.directory, staged.catalog)
    assert len(caught.value.problems) == len(names)
    message = str(caught.value)
    assert f"({len(names)} problems)" in message and "tables/t000.csv was modified" in message
    assert f"t{artifacts.SHOWN_PROBLEMS:03d}.csv" not in message
    assert "… and 5 more (`dprelease verify --json` lists every problem)" in message


def test_axis_labels_are_formatted_once_per_value_as_per_row() -> None:
    """Labels come from the distinct values (a 4,525-table release made 13.5M per-row calls);
    nulls, dictionary columns and whole floats read as they did row by row."""
    from dprelease.catalog.publishing import report_charts

    table = pa.table(
        {
            "a": pa.array([1.0, None, 2.5, 1.0, 3.0]),
            "b": pa.array(["x", "y", None, "x", "y"]).dictionary_encode(),
            "estimate": [1.0, 2.0, 3.0, 4.0, 5.0],
        }
    )
    axes = {axis.name: axis for axis in report_charts.table_model(table)}
    assert report_charts.axis_labels(table, axes["a"]) == ["1", "", "2.5", "1", "3"]
    assert report_charts.axis_labels(table, axes["b"]) == ["x", "y", "", "x", "y"]
    grid = pa.table({"a": [0, 0, 1, 1, 2, 2], "b": ["q", "p"] * 3, "estimate": [1.0] * 6})
    assert report_charts._grid(grid, report_charts.table_model(grid)) == (
        ["0", "1", "2"],
        ["q", "p"],  # first appearance, not sorted
        (3, 2),
    )
