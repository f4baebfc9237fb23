"""The audit report as a publication (catalog/publishing/report.py, catalog/publishing/report_charts.py): complete
tables in compact page data, charts chosen from the table model, categorical labels, the
validation summary, CSV next to Parquet, and Data Docs rewritten to bundled assets."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest

from dprelease.catalog.planning.planner import build_workload
from dprelease.catalog.publishing import report
from dprelease.catalog.publishing.artifacts import write_table
from dprelease.catalog.publishing.report_charts import chart_for, png_rgb, table_model
from dprelease.catalog.publishing.tables import build_table
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.validation.gx import (
    ASSETS,
    LOCAL_COPIES,
    OfflineDocsError,
    external_references,
    make_docs_offline,
)


def spec_with(domain: dict[str, Any], workload: list[dict[str, Any]]):
    return parse_spec(
        {
            "name": "t",
            "dataset": {"id": "t", "budget": {"epsilon": 5}},
            "domain": domain,
            "workload": workload,
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
        }
    )


def tables_of(spec) -> dict[str, pa.Table]:
    """Tables built the way a release builds them, with made-up public 'released' values."""
    out = {}
    for item in build_workload(spec).items:
        rows = item.num_queries
        estimates = np.linspace(-3.0, 2500.0, rows)
        out[item.name] = build_table(
            spec,
            item,
            estimates=estimates,
            unit_variances=np.ones(rows),
            noise_variance=4.0,
            nonnegative=False,
        )
    return out


DOMAIN = {
    "age": {"min": 0, "max": 9},
    "sex": {"values": [0, 1], "value_labels": ["Female", "Male"]},
    "hours": {"bins": [0, 20, 40, 60]},
}


@pytest.fixture
def tables() -> dict[str, pa.Table]:
    spec = spec_with(
        DOMAIN,
        [
            {"name": "by_sex", "marginal": ["sex"]},
            {"name": "age_by_sex", "marginal": ["age", "sex"]},
            {"name": "age_cdf", "prefix": "age"},
            {"name": "age_ranges", "all_ranges": ["age"]},
            {"name": "two_ranges", "ranges": {"age": [[0, 4], [5, 9]]}},
            {"name": "everyone", "total": True},
            {"name": "three", "marginal": ["age", "sex", "hours"]},
        ],
    )
    return tables_of(spec)


# --- categorical labels ----------------------------------------------------------------------------


def test_value_labels_replace_codes_in_released_tables(tables: dict[str, pa.Table]) -> None:
    assert tables["by_sex"]["sex"].to_pylist() == ["Female", "Male"]
    assert tables["age_by_sex"]["sex"].to_pylist()[:2] == ["Female", "Male"]


@pytest.mark.parametrize(
    ("sex", "message"),
    [
        (
            {"values": [0, 1], "value_labels": ["Female"]},
            "value_labels has 1 entries but values has 2",
        ),
        ({"values": [0, 1], "value_labels": ["X", "X"]}, "value_labels ['X'] are listed twice"),
        ({"values": [0, 1], "value_labels": ["X", ""]}, "at least 1 character"),
        ({"values": [0, 1], "value_labels": ["X", 3]}, "value_labels"),
    ],
)
def test_every_value_labels_rule_fires(sex: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=re.escape(message)):
        spec_with({"sex": sex}, [{"name": "s", "marginal": ["sex"]}])


def test_codes_stay_codes_without_labels() -> None:
    spec = spec_with({"sex": {"values": [0, 1]}}, [{"name": "s", "marginal": ["sex"]}])
    assert tables_of(spec)["s"]["sex"].to_pylist() == [0, 1]


# --- charts that fit the table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("by_sex", "bars"),
        ("age_by_sex", "heatmap"),
        ("age_cdf", "step"),
        ("age_ranges", "step"),
        ("two_ranges", "bars"),
        ("everyone", "bars"),
        ("three", "heatmap"),
    ],
)
def test_the_chart_is_chosen_from_the_table_model(
    tables: dict[str, pa.Table], name: str, kind: str
) -> None:
    chart = chart_for(tables[name], title=name)
    assert chart.kind == kind
    assert chart.svg.startswith("<svg") and chart.svg.endswith("</svg>")


def test_table_model_pairs_range_bounds_and_reads_cumulative_columns(
    tables: dict[str, pa.Table],
) -> None:
    assert [(a.name, a.kind) for a in table_model(tables["age_ranges"])] == [("age", "range")]
    assert [(a.name, a.kind) for a in table_model(tables["age_cdf"])] == [("age", "cumulative")]
    assert [a.name for a in table_model(tables["three"])] == ["age", "sex", "hours"]
    assert table_model(tables["everyone"]) == []


def test_bars_draw_one_whisker_per_interval_and_none_without_one() -> None:
    table = pa.table(
        {
            "colour": ["red", "green", "blue"],
            "estimate": [5.0, 7.0, 2.0],
            "std_error": [1.0, 1.0, 1.0],
            "ci_low": pa.array([3.0, None, 0.0]),
            "ci_high": pa.array([7.0, None, 4.0]),
            "uncertainty": ["noise", "noise-only", "noise"],
        }
    )
    chart = chart_for(table, title="colours")
    assert chart.kind == "bars"
    assert chart.svg.count("class='bar'") == 3 and chart.svg.count("class='err'") == 2
    assert "red: 5 (95% interval 3 to 7)" in chart.svg


def test_a_table_of_a_new_statistic_is_charted_generically() -> None:
    """Tables added later (derived statistics) need no special case: label columns before
    ``estimate`` are the axes, columns after it are values."""
    table = pa.table(
        {
            "statistic": ["mean", "median"],
            "estimate": [41.2, 37.0],
            "std_error": [0.3, 0.5],
            "ci_low": [40.6, 36.0],
            "ci_high": [41.8, 38.0],
            "binning_error": [0.5, 0.5],
            "uncertainty": ["noise", "noise"],
        }
    )
    assert chart_for(table, title="s").kind == "bars"
    html_text = report.table_section(0, "s", table)
    assert "binning_error" in html_text and "statistic" in html_text


def test_rows_that_are_not_a_grid_get_no_heatmap() -> None:
    table = pa.table({"a": [0, 0, 1], "b": [0, 1, 0], "estimate": [1.0, 2.0, 3.0]})
    chart = chart_for(table, title="partial")
    assert chart.kind == "none" and "grid" in chart.note


def test_heatmap_pixels_are_the_estimates_in_row_major_order(tables: dict[str, pa.Table]) -> None:
    import matplotlib.image

    svg = chart_for(tables["age_by_sex"], title="x").svg
    uri = re.search(r"href='data:image/png;base64,([^']+)'", svg).group(1)
    pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(uri)), format="png")
    assert pixels.shape[:2] == (10, 2)  # age rows × sex columns
    brightness = pixels[..., :3].sum(axis=2).ravel()  # viridis brightens with the value
    assert np.all(np.diff(brightness) > 0)  # estimates increase along the rows


def test_png_encoder_round_trips() -> None:
    import matplotlib.image

    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 10
    decoded = matplotlib.image.imread(io.BytesIO(png_rgb(image)), format="png")
    np.testing.assert_array_equal(np.round(decoded[..., :3] * 255).astype(np.uint8), image)


# --- complete tables -------------------------------------------------------------------------------


def decode(column: Any, rows: int) -> list[str]:
    return [report._cell(column, i) for i in range(rows)]


def page_data(html_text: str, index: int) -> dict[str, Any]:
    found = re.search(
        rf"<script type='application/json' id='data-{index}'>(.*?)</script>", html_text
    )
    return json.loads(found.group(1))


def test_every_row_of_every_table_is_in_the_page(tables: dict[str, pa.Table]) -> None:
    html_text = render(tables)
    for index, (name, table) in enumerate(tables.items()):
        data = page_data(html_text, index)
        assert data["n"] == table.num_rows
        for column, encoded in zip(table.column_names, data["c"], strict=True):
            shown = decode(encoded, table.num_rows)
            expected = [report._fmt(v) for v in table[column].to_pylist()]
            assert shown == expected, (name, column)
        assert f"href='tables/{name}.csv' download" in html_text


def test_grid_label_columns_are_stored_once_per_level() -> None:
    values = [str(v) for v in np.repeat(np.arange(40), 50)]
    assert report.encode_column(values) == {"l": [str(v) for v in range(40)], "r": 50}
    tiled = [str(v) for v in np.tile(np.arange(50), 40)]
    assert report.encode_column(tiled) == {"l": [str(v) for v in range(50)], "r": 1}
    ragged = ["a", "a", "b", "a"]
    assert report.encode_column(ragged) == ragged
    assert report.encode_column(["x"] * 5) == "x"


def test_display_rounding_keeps_what_the_report_shows() -> None:
    values = [1234.567, -1.23456, 0.000123456, 999.96, 0.0, float("nan"), 12.5]
    rounded = report.display_numbers(pa.chunked_array([pa.array(values)]))
    assert [report._fmt(v) for v in rounded] == [report._fmt(v) for v in values[:5]] + ["", "12.5"]


def test_a_label_cannot_close_the_page_data_script() -> None:
    table = pa.table({"name": ["</script><b>x"], "estimate": [1.0]})
    html_text = report.table_section(0, "evil", table)
    assert "</script><b>" not in html_text.split("<script type='application/json'")[1][:-20]


# --- validation summary ----------------------------------------------------------------------------


def validation(success: bool) -> dict[str, Any]:
    results = [
        {
            "expectation": "expect_column_values_to_be_between",
            "column": "std_error",
            "kwargs": {"column": "std_error", "min_value": 0.0, "strict_min": True},
            "success": success,
            "observed_value": None,
            "unexpected_count": 0 if success else 3,
        },
        {
            "expectation": "expect_column_pair_values_a_to_be_greater_than_b",
            "column": None,
            "kwargs": {"column_A": "estimate", "column_B": "ci_low", "or_equal": True},
            "success": True,
            "observed_value": None,
            "unexpected_count": 0,
        },
    ]
    return {"success": success, "tables": {"a": {"results": results}, "b": {"results": results}}}


def test_validation_passes_are_folded_and_counted() -> None:
    text = "".join(report.validation_section(validation(True)))
    assert "All 4 checks on 2 tables passed." in text
    assert "<details><summary>What was checked: 2 kinds of check, 4 passed" in text
    assert "std_error &gt; 0" in text and "estimate ≥ ci_low" in text
    assert "Failed checks" not in text
    assert report.DATA_DOCS in text


def test_validation_failures_are_listed_with_their_details() -> None:
    text = "".join(report.validation_section(validation(False)))
    assert "2 of 4 checks failed on 2 of 2 tables." in text
    failed = text.split("<h3>Failed checks</h3>")[1].split("</table>")[0]
    assert failed.count("<tr>") == 3  # heading + one row per failing table
    assert "std_error &gt; 0" in failed and "expect_column_values_to_be_between" in failed
    assert "<td class='num'>3</td>" in failed  # rows failing


# --- the page ----------------------------------------------------------------------------------------


def manifest() -> dict[str, Any]:
    return {
        "release_id": "t-1",
        "name": "t",
        "dataset_id": "t",
        "created_at": "2026-11-25T00:00:00+00:00",
        "spec_fingerprint": "f" * 64,
        "input_fingerprint": "e" * 64,
        "code_version": {"package": "0.1.0", "git_commit": None},
        "privacy_unit": "1 row(s) per person",
        "privacy": {"requested": {"epsilon": 1.0}, "charged": {"epsilon": 1.0}},
        "mechanism": {
            "name": "identity",
            "noise": {"kind": "laplace", "scale": 1.0, "size": 10, "sensitivity": 1.0},
        },
        "review": {"status": "staged", "trail": []},
        "assumptions": ["arrival files hold disjoint sets of people"],
    }


def render(tables: dict[str, pa.Table], valid: bool = True) -> str:
    plan = {
        "chosen": "identity",
        "reason": "only candidate",
        "lower_bound_rmse": 1.0,
        "lower_bound_note": "bound",
        "candidates": [{"mechanism": "identity", "rmse": 1.5, "total_variance": 20.0}],
    }
    budget = {k: {"epsilon": 1.0} for k in ("cap", "before", "after", "remaining")}
    return report.render_report(
        manifest=manifest(),
        plan=plan,
        tables=tables,
        validation=validation(valid),
        budget=budget,
        ledger_rows=[],
        reviews=[],
    )


def test_the_page_has_every_section_and_the_stated_assumptions(
    tables: dict[str, pa.Table],
) -> None:
    text = render(tables)
    for section in ("summary", "budget", "method", "tables", "validation", "review"):
        assert f"<section id='{section}'>" in text and f"href='#{section}'" in text
    assert text.count("<section class='tbl'") == len(tables)
    assert "arrival files hold disjoint sets of people" in text
    assert not re.search(r"(?:src|href)=['\"](?:https?:)?//", text)  # nothing from the network


def test_write_table_writes_the_csv_the_report_links_to(
    tmp_path: Path, tables: dict[str, pa.Table]
) -> None:
    table = tables["two_ranges"]
    write_table(tmp_path, "two_ranges", table)
    read = pa_csv.read_csv(tmp_path / "tables" / "two_ranges.csv")
    assert read.column_names == table.column_names
    np.testing.assert_array_equal(read["estimate"].to_numpy(), table["estimate"].to_numpy())


# --- Data Docs offline -------------------------------------------------------------------------------

PAGE = """<html><head>
<link rel="stylesheet" href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css"/>
<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css" />
<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>
<link rel="stylesheet" href="https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css">
<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>
<script src="https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js" integrity="sha384-x" crossorigin="anonymous"></script>
</head><body><img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=1">
<link rel="shortcut icon" href="../static/images/favicon.ico" type="image/x-icon"/>
<a href="https://greatexpectations.io">GX</a></body></html>"""


def test_data_docs_point_at_bundled_copies(tmp_path: Path) -> None:
    (tmp_path / "validations" / "a").mkdir(parents=True)
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / "validations" / "a" / "run.html").write_text(PAGE)
    (tmp_path / "static" / "styles").mkdir(parents=True)
    (tmp_path / "static" / "styles" / "gx.css").write_text(
        "a { background: url('https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/"
        "full_logo_dark.png') }"
    )
    make_docs_offline(tmp_path)
    # every page, style sheet and script (bundled ones included) loads nothing from the network
    assert [p for p in tmp_path.rglob("*") if p.is_file() and external_references(p)] == []
    for page, up in (
        (tmp_path / "index.html", ""),
        (tmp_path / "validations/a/run.html", "../../"),
    ):
        text = page.read_text()
        assert not re.search(r"(?:src|href)=[\"']https?://(?!greatexpectations\.io)", text), text
        assert f'<script src="{up}static/vendor/js/jquery-3.7.1.min.js"></script>' in text
        assert f'href="{up}static/vendor/css/bootstrap-4.3.1.min.css"' in text
        assert "integrity" not in text and "vega" not in text and "bootstrap-dark" not in text
        assert f'src="{up}static/images/logo-long.png"' in text
        assert f'href="{up}static/images/favicon.ico"' in text
        assert '<a href="https://greatexpectations.io">' in text  # a link, not a resource
    for copy in LOCAL_COPIES.values():
        assert (tmp_path / "static/vendor" / copy).is_file(), copy
        assert (ASSETS / copy).is_file(), copy
    assert (tmp_path / "static/vendor/webfonts/fa-solid-900.woff2").is_file()
    assert (tmp_path / "static/vendor/licenses/jquery-MIT.txt").is_file()


def test_an_unknown_cdn_resource_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(
        '<script src="https://unpkg.com/left-pad@1.0.0/index.js"></script>'
    )
    with pytest.raises(OfflineDocsError, match=r"index\.html loads https://unpkg\.com/left-pad"):
        make_docs_offline(tmp_path)


def test_candidates_budget_and_partition_charts_are_inline_svg() -> None:
    from dprelease.catalog.publishing.report import (
        _partition_plot,
        budget_timeline_plot,
        error_plot,
    )

    plan = {
        "candidates": [
            {"mechanism": "identity", "rmse": 136.4},
            {"mechanism": "optimized", "rmse": 8.47},
            {"mechanism": "dawa", "rmse": None},
        ],
        "chosen": "optimized",
        "lower_bound_rmse": 3.59,
    }
    svg = error_plot(plan)
    assert svg.startswith("<svg") and "* optimized" in svg and "SVD lower bound" in svg
    assert "dawa" not in svg  # no expected error: not drawn
    rows = [
        {"created_at": "2026-11-25T10:00:00+00:00", "cost": {"epsilon": 1.0}, "release_id": "a"},
        {"created_at": "2026-11-25T11:00:00+00:00", "cost": "epsilon=0.5", "release_id": "b"},
    ]
    timeline = budget_timeline_plot(rows, {"epsilon": 5.0}, "b")
    assert "cap (epsilon=5)" in timeline and "* 11-25 11:00" in timeline
    partition = _partition_plot([0, 3, 10, 12])
    assert "3 buckets" in partition and "3–9" in partition


def test_the_report_charts_do_not_import_matplotlib() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dprelease.catalog.publishing.report import error_plot, budget_timeline_plot, _partition_plot\n"
        "error_plot({'candidates': [{'mechanism': 'identity', 'rmse': 2.0}], 'chosen': 'identity'})\n"
        "_partition_plot([0, 2, 5])\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_table_longer_than_the_embed_limit_pages_its_first_rows_and_says_so() -> None:
    from dprelease.catalog.publishing import report

    table = pa.table({"a": pa.array(range(45), pa.int64()), "estimate": pa.array([1.5] * 45)})
    section = report.table_section(0, "long", table, max_rows=30)
    assert "45 rows</small>" in section and "data-rows='30'" in section
    assert "first 30 of 45 rows; every row is in the CSV" in section
    short = report.table_section(1, "short", table.slice(0, 30), max_rows=30)
    assert "every row is in the CSV" not in short and "data-rows='30'" in short


def test_csv_links_are_url_quoted(tables: dict[str, pa.Table]) -> None:
    """A table name carries attribute names, which may hold '#', '%', '?' or spaces."""
    text = render({"age by #sex 100%": tables["by_sex"]})
    assert "href='tables/age%20by%20%23sex%20100%25.csv'" in text
    assert "href='tables/age by #sex" not in text
