"""The audit report (``report.html``): a statistical publication of one release, readable offline.

It shows what was released (every table complete, paged, with its CSV in ``tables/``, and a chart
that fits the table's model), from which input (keyed fingerprint) under which spec, the privacy
budget before and after with the dataset's ledger, the mechanism chosen and why against the
alternatives and the SVD lower bound, a summary of output validation (failures in detail, passes
folded) with a link to the Great Expectations Data Docs, and the review trail.

Privacy: every number in it is public — released (noisy) values, their error model, the spec, the
domain and the budget.  Nothing here reads the confidential data or the true cell vector.

Cost: O(total rows); every chart is inline SVG (:mod:`catalog.publishing.report_charts`), no
matplotlib.  From :data:`SPLIT_FROM` tables on, the tables part is a searchable index
(``assets/report/search.js``) and each table has its own page ``report/<name>.html``, hashed in
the manifest like every file.
"""

from __future__ import annotations

import html
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from dprelease.catalog.ledger.store import Catalog

from dprelease.catalog.publishing.report_charts import Axis, chart_for, table_model, value_chart
from dprelease.catalog.publishing.series_report import (
    SeriesHistory,
    series_history,
    series_section,
)

PAGE_ROWS = 25
WHOLE_FROM = 999.95  # shown as whole numbers from here (where four significant digits reach 1000)
PAGE_SIZES = (25, 100, 500)
EMBED_MAX_ROWS = 100_000
"""Rows of one table the page itself carries at most (the CSV always has all of them)."""
EMBED_TOTAL_ROWS = 1_000_000
"""Rows the page carries over all its tables, shared evenly (91 two-way Adult tables: every row)."""
SPLIT_FROM = 200
"""From this many tables the tables part is a searchable index and every table has its own page
under :data:`TABLE_PAGES` (one page of them all would load slowly)."""
TABLE_PAGES = "report"
"""Folder of the per-table pages, relative to ``report.html``."""
DATA_DOCS = "validation/docs/index.html"  # relative to the report, in the release directory
HEADINGS = {"std_error": "std. error", "ci_low": "95% low", "ci_high": "95% high"}


def error_plot(plan: dict[str, Any]) -> str:
    """Bar chart (inline SVG): expected RMSE per candidate, the SVD lower bound dashed."""
    scored = [c for c in plan["candidates"] if c.get("rmse") is not None]
    bound = plan.get("lower_bound_rmse")
    return value_chart(
        "bars",
        [("* " if c["mechanism"] == plan["chosen"] else "") + c["mechanism"] for c in scored],
        np.array([float(c["rmse"]) for c in scored]),
        x_title="candidate mechanism (* chosen)",
        y_title="expected RMSE per query",
        reference=(float(bound), "SVD lower bound") if bound else None,
    )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if not np.isfinite(value):
            return "" if np.isnan(value) else str(value)
        if abs(value) >= WHOLE_FROM:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _table_html(rows: list[dict[str, Any]], columns: list[str], *, classes: str = "") -> str:
    def kind(value: Any) -> str:
        return "num" if isinstance(value, int | float) else "lab"

    first = {c: next((r[c] for r in rows if r.get(c) is not None), None) for c in columns}
    head = "".join(f"<th class='{kind(first[c])}'>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='{kind(row.get(c))}'>{html.escape(_fmt(row.get(c)))}</td>" for c in columns
        )
        + "</tr>"
        for row in rows
    )
    return f"<table class='{classes}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def heading(column: str, axes: list[Axis]) -> str:
    """A column's heading in the report: ``age_upper`` reads ``age ≤``, ranges ``from``/``to``."""
    for axis in axes:
        if axis.kind == "cumulative" and column == axis.columns[0]:
            return f"{axis.name} ≤"
        if axis.kind == "range" and column in axis.columns:
            return f"{axis.name} {'from' if column == axis.columns[0] else 'to'}"
    return HEADINGS.get(column, column)


def describe(table: pa.Table, axes: list[Axis]) -> str:
    """What the rows of a table are, from its model alone."""
    forms = {
        "cumulative": "cumulative over {0} (each row: {0} ≤ its value)",
        "range": "ranges of {0} (from–to, inclusive)",
        "category": "{0}",
    }
    return " × ".join(forms[axis.kind].format(axis.name) for axis in axes) or "one row"


def column_text(column: pa.ChunkedArray) -> list[str]:
    """Display strings of a label (non-float) column. O(rows)."""
    return ["" if v is None else str(v) for v in column.to_pylist()]


def display_numbers(column: pa.ChunkedArray) -> list[float | None]:
    """A float column rounded to what the report shows (see :func:`_fmt`): whole numbers from
    1000 on, four significant digits below; nulls and non-finite values become None. O(rows)."""
    values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
    finite = np.isfinite(values)
    safe = np.where(finite & (values != 0), np.abs(values), 1.0)
    scale = 10.0 ** (3 - np.floor(np.log10(safe)))
    rounded = np.where(
        np.abs(values) >= WHOLE_FROM, np.round(values), np.round(values * scale) / scale
    )
    return [
        float(v) if ok else None for v, ok in zip(rounded.tolist(), finite.tolist(), strict=True)
    ]


def encode_numbers(column: pa.ChunkedArray) -> float | dict[str, Any] | None:
    """A float column as displayed: one number if it is constant, else ``{n: [...]}``."""
    values = display_numbers(column)
    if values and all(v == values[0] for v in values):
        return values[0]
    return {"n": values}


def encode_column(values: list[str]) -> str | list[str] | dict[str, Any]:
    """Compact JSON for a label column: one string if constant, ``{l: levels, r: repeat}`` if it
    is a row-major grid axis (``l[floor(i / r) % len(l)]``), else the list. O(rows)."""
    if not values:
        return values
    if all(v == values[0] for v in values):
        return values[0]
    repeat = next((k for k, v in enumerate(values) if v != values[0]), len(values))
    levels = values[::repeat]
    period = next((k for k in range(1, len(levels)) if levels[k] == levels[0]), len(levels))
    levels = levels[:period]
    if len(values) % (repeat * period) == 0 and len(levels) == len(set(levels)):
        rebuilt = [levels[(i // repeat) % period] for i in range(len(values))]
        if rebuilt == values:
            return {"l": levels, "r": repeat}
    return values


def _cell(encoded: Any, index: int) -> str:
    """Row ``index`` of an encoded column as displayed (the page script does the same)."""
    if isinstance(encoded, dict):
        if "n" in encoded:
            return _fmt(encoded["n"][index])
        return encoded["l"][(index // encoded["r"]) % len(encoded["l"])]
    if isinstance(encoded, list):
        return encoded[index]
    return _fmt(encoded) if isinstance(encoded, float) or encoded is None else encoded


def table_section(
    index: int,
    name: str,
    table: pa.Table,
    *,
    max_rows: int = EMBED_MAX_ROWS,
    release_root: str = "",
) -> str:
    """One released table: caption, chart, the first page, a pager over every row, the CSV link.

    ``release_root`` is the path from the page to the release directory (``"../"`` on a per-table
    page; the CSV link is then URL-quoted).  A table longer than ``max_rows`` pages through its
    first rows only and says so; its CSV and Parquet hold every row.
    """
    axes = table_model(table)
    columns = table.column_names
    kinds = ["num" if pa.types.is_floating(table[c].type) else "lab" for c in columns]
    shown = table.slice(0, max_rows)  # O(1): a view
    encoded = [
        encode_numbers(shown[c]) if kind == "num" else encode_column(column_text(shown[c]))
        for c, kind in zip(columns, kinds, strict=True)
    ]
    chart = chart_for(table, title=name)
    rows = shown.num_rows
    cut = (
        f" The page shows the first {rows:,} of {table.num_rows:,} rows; every row is in the CSV."
        if table.num_rows > rows
        else ""
    )
    first = min(rows, PAGE_ROWS)
    head = "".join(
        f"<th class='{kind}' title='{html.escape(c, quote=True)}'>{html.escape(heading(c, axes))}</th>"
        for c, kind in zip(columns, kinds, strict=True)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='{kind}'>{html.escape(_cell(e, i))}</td>"
            for e, kind in zip(encoded, kinds, strict=True)
        )
        + "</tr>"
        for i in range(first)
    )
    options = (
        "".join(
            f"<option value='{size}'>{size} rows</option>" for size in PAGE_SIZES if size < rows
        )
        + f"<option value='{rows}'>all {rows:,} rows</option>"
    )
    pager = (
        f"<div class='pager-bar'><button type='button' data-go='first'>«</button>"
        f"<button type='button' data-go='prev'>‹ previous</button>"
        f"<span class='pos'>rows 1–{first:,} of {rows:,}</span>"
        f"<button type='button' data-go='next'>next ›</button>"
        f"<button type='button' data-go='last'>»</button>"
        f"<select aria-label='rows per page'>{options}</select></div>"
        if rows > PAGE_ROWS
        else f"<div class='pager-bar'><span class='muted'>all {rows:,} rows</span></div>"
    )
    csv = f"{release_root}tables/{quote(name)}.csv"  # a name may hold any attribute's characters
    page_data = {"n": rows, "c": encoded, "k": kinds}
    # "<" escaped so a label can never close the script element
    data = json.dumps(page_data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    chart_html = (
        # drawn when scrolled near (page script): 91 charts parsed inert, not laid out at load
        f"<figure class='lazy'><template>{chart.svg}</template>"
        f"<figcaption>{html.escape(chart.note)}</figcaption></figure>"
        if chart.svg
        else f"<p class='muted'>No chart: {html.escape(chart.note)}.</p>"
    )
    return (
        f"<section class='tbl' id='t{index}'>"
        f"<h3>{html.escape(name)} <small>{table.num_rows:,} rows</small></h3>"
        f"<p class='muted'>Rows: {html.escape(describe(table, axes))}. "
        f"<a class='csv' href='{html.escape(csv, quote=True)}' download>Download CSV</a> "
        f"(every row, full precision; also <code>tables/{html.escape(name)}.parquet</code>)."
        f"{html.escape(cut)}</p>"
        f"{chart_html}"
        f"<div class='pager' data-table='{index}' data-rows='{rows}' data-page='0'>{pager}"
        f"<div class='scroll'><table class='data'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div></div>"
        f"<script type='application/json' id='data-{index}'>{data}</script></section>"
    )


def table_page_path(name: str) -> str:
    """A table's own page (above :data:`SPLIT_FROM` tables), relative to the release directory."""
    return f"{TABLE_PAGES}/{name}.html"


INDEX_CHUNK = 100
"""Index rows per block; the browser lays out only the blocks near the view (CSS
``content-visibility``)."""


def searchable_index(tables: dict[str, pa.Table], plan: dict[str, Any]) -> str:
    """The tables part of a report above :data:`SPLIT_FROM` tables: a search box and one row per
    table (name linking to its own page, what rows are, row count, predicted cell standard error
    and target when the plan has them, CSV). O(tables + rows) (the row model reads each table)."""
    errors = plan.get("item_std_errors") or {}
    targets = plan.get("targets") or {}

    def number(value: Any) -> str:
        return html.escape(_fmt(float(value))) if isinstance(value, int | float) else ""

    rows = [
        f"<div class='ir' data-name='{html.escape(name, quote=True)}'>"
        f"<span class='lab'><a href='{html.escape(quote(table_page_path(name)), quote=True)}'>"
        f"{html.escape(name)}</a></span>"
        f"<span class='lab'>{html.escape(describe(table, table_model(table)))}</span>"
        f"<span class='num'>{table.num_rows:,}</span>"
        f"<span class='num'>{number(errors.get(name))}</span>"
        + (f"<span class='num'>{number(targets.get(name))}</span>" if targets else "")
        + f"<span class='lab'><a href='{html.escape(quote(f'tables/{name}.csv'), quote=True)}' "
        "download>CSV</a></span></div>"
        for name, table in tables.items()
    ]
    blocks = (
        "<div class='ic'>" + "".join(rows[at : at + INDEX_CHUNK]) + "</div>"
        for at in range(0, len(rows), INDEX_CHUNK)
    )
    head = "".join(
        f"<span class='{kind}'>{text}</span>"
        for kind, text in (
            ("lab", "table (its own page)"),
            ("lab", "rows are"),
            ("num", "rows"),
            ("num", "predicted std. error"),
            *([("num", "target std. error")] if targets else []),
            ("lab", "download"),
        )
    )
    return (
        "<p class='search'><label>Find a table: <input type='search' id='table-search' "
        "placeholder='name contains… (all words)' autocomplete='off'></label> "
        f"<span id='table-count' class='muted'>{len(tables):,} tables</span></p>"
        f"<div class='index{' targets' if targets else ''}' id='table-index'>"
        f"<div class='ir ih'>{head}</div>" + "".join(blocks) + "</div>"
    )


def table_pages(manifest: dict[str, Any], tables: dict[str, pa.Table]) -> Iterator[tuple[str, str]]:
    """(path relative to the release directory, HTML) of every table's own page: its full
    section (chart, pager over every row, CSV link) and a link back to the report's index.
    One page at a time (O(rows of that table) memory)."""
    title = f"{manifest['name']} — differentially private release {manifest['release_id']}"
    for index, (name, table) in enumerate(tables.items()):
        yield (
            table_page_path(name),
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(name)} — {html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><nav class='toc'>"
            "<a href='../report.html#tables'>← all tables</a><a href='../report.html'>report</a>"
            f"</nav><main><p class='muted'>{html.escape(title)}</p>"
            f"{table_section(index, name, table, release_root='../')}"
            f"</main><script>{PAGER_SCRIPT}</script></body></html>",
        )


def tables_index(tables: dict[str, pa.Table]) -> str:
    rows = [
        f"<tr><td class='lab'><a href='#t{index}'>{html.escape(name)}</a></td>"
        f"<td class='lab'>{html.escape(describe(table, table_model(table)))}</td>"
        f"<td class='num'>{table.num_rows:,}</td>"
        f"<td class='lab'><a href='{html.escape(f'tables/{quote(name)}.csv', quote=True)}' download>CSV</a></td></tr>"
        for index, (name, table) in enumerate(tables.items())
    ]
    return (
        "<div class='scroll short'><table class='data'><thead><tr><th class='lab'>table</th>"
        "<th class='lab'>rows are</th><th>rows</th><th class='lab'>download</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


_ASSETS = Path(__file__).resolve().parents[1] / "assets" / "report"
PAGER_SCRIPT = (_ASSETS / "pager.js").read_text(encoding="utf-8")
"""Pages through every table's embedded rows and draws charts when scrolled near."""
STYLE = (_ASSETS / "report.css").read_text(encoding="utf-8")
SEARCH_SCRIPT = (_ASSETS / "search.js").read_text(encoding="utf-8")
"""Filters the table index of a report above :data:`SPLIT_FROM` tables by name."""


def describe_check(result: dict[str, Any]) -> str:
    """A validation check in words, from its GX type and parameters."""
    kind = result.get("expectation", "")
    kwargs = result.get("kwargs") or {}
    column = kwargs.get("column") or result.get("column") or ""
    if kind == "expect_table_columns_to_match_set":
        return "the columns are exactly the table's schema"
    if kind == "expect_table_row_count_to_equal":
        return "one row per query (row count as planned)"
    if kind == "expect_column_to_exist":
        return f"column {column} exists"
    if kind == "expect_column_values_to_not_be_null":
        condition = kwargs.get("row_condition")
        if isinstance(condition, dict) and condition.get("operator") == "!=":
            other = (condition.get("column") or {}).get("name", "")
            value = condition.get("parameter")
            return f"{column} is never missing (except where {other} is {value})"
        return f"{column} is never missing"
    if kind == "expect_column_values_to_be_between":
        low, high = kwargs.get("min_value"), kwargs.get("max_value")
        if low is not None and high is not None and -low == high and high >= 1e300:
            return f"{column} is finite"
        if high is None and low is not None:
            return f"{column} {'>' if kwargs.get('strict_min') else '≥'} {_fmt(float(low))}"
        return f"{column} between {_fmt(low)} and {_fmt(high)}"
    if kind == "expect_column_values_to_be_in_set":
        return f"{column} is one of {', '.join(map(str, kwargs.get('value_set', [])))}"
    if kind == "expect_column_pair_values_a_to_be_greater_than_b":
        sign = "≥" if kwargs.get("or_equal") else ">"
        return f"{kwargs.get('column_A')} {sign} {kwargs.get('column_B')}"
    shown = ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
    return f"{kind} ({shown})"


def validation_section(validation: dict[str, Any]) -> list[str]:
    """What was checked (passes folded), what failed with details, and the Data Docs link."""
    checks: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    tables = validation.get("tables", {})
    for table_name, summary in tables.items():
        for result in summary.get("results", []):
            text = describe_check(result)
            entry = checks.setdefault(
                text, {"check": text, "tables checked": 0, "passed": 0, "failed": 0}
            )
            entry["tables checked"] += 1
            entry["passed" if result.get("success") else "failed"] += 1
            if not result.get("success"):
                failures.append(
                    {
                        "table": table_name,
                        "check": text,
                        "GX expectation": result.get("expectation"),
                        "observed": _observed(result.get("observed_value")),
                        "rows failing": result.get("unexpected_count"),
                    }
                )
    total = sum(e["tables checked"] for e in checks.values())
    failed = len(failures)
    verdict = (
        f"<p class='ok'>All {total:,} checks on {len(tables):,} tables passed.</p>"
        if not failed
        else f"<p class='bad'>{failed:,} of {total:,} checks failed on "
        f"{len({f['table'] for f in failures}):,} of {len(tables):,} tables.</p>"
    )
    parts = [
        verdict,
        "<p class='muted'>Every table is checked with Great Expectations on the released values and "
        "public metadata only (a check on true values would itself be a release): the schema, one "
        "row per query, finite values, a positive standard error, the estimate inside its "
        "interval, and the uncertainty label.</p>",
    ]
    if failures:
        columns = ["table", "check", "GX expectation", "observed", "rows failing"]
        parts += ["<h3>Failed checks</h3>", _table_html(failures, columns, classes="fail")]
    parts.append(
        f"<details><summary>What was checked: {len(checks)} kinds of check, "
        f"{total - failed:,} passed</summary>"
        + _table_html(list(checks.values()), ["check", "tables checked", "passed", "failed"])
        + "</details>"
    )
    parts.append(
        f"<p>Full results per table: <a href='{DATA_DOCS}'>Great Expectations Data Docs</a> "
        "(opens offline; its styles and scripts are bundled in the release) and "
        "<code>validation/results.json</code>.</p>"
    )
    return parts


def _observed(value: Any) -> str:
    if value is None:
        return ""
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 200 else text[:199] + "…"


def _assumptions(manifest: dict[str, Any]) -> list[str]:
    """Assumptions a release states in its manifest (e.g. disjoint partitions), shown verbatim."""
    parts = []
    for key in ("assumptions", "partitions"):
        value = manifest.get(key)
        if not value:
            continue
        if isinstance(value, dict):
            parts.append(_kv({k.replace("_", " "): v for k, v in value.items()}))
        elif isinstance(value, list):
            items = "".join(f"<li>{html.escape(str(v))}</li>" for v in value)
            parts.append(f"<ul>{items}</ul>")
        else:
            parts.append(f"<p>{html.escape(str(value))}</p>")
    return ["<h3>Stated assumptions</h3>", *parts] if parts else []


def render_report(
    *,
    manifest: dict[str, Any],
    plan: dict[str, Any],
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    budget: dict[str, Any],
    ledger_rows: list[dict[str, Any]],
    reviews: list[dict[str, Any]],
    series: SeriesHistory | None = None,
) -> str:
    """The whole report as one HTML string (its CSV links point at ``tables/<name>.csv``).

    ``series``: a series period's published history (:mod:`.series_report`), charted over time.

    From :data:`SPLIT_FROM` tables on, the tables part is a searchable index linking to each
    table's own page (:func:`table_pages` renders those)."""
    split = len(tables) >= SPLIT_FROM
    release_id = html.escape(manifest["release_id"])
    status = manifest.get("review", {}).get("status", "staged")
    valid = validation.get("success")
    noise = manifest["mechanism"]["noise"]
    bound = plan.get("lower_bound_rmse")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{html.escape(manifest['name'])} — differentially private release {release_id}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<nav class='toc'><a href='#summary'>Summary</a><a href='#budget'>Privacy budget</a>"
        "<a href='#method'>Method and error</a>"
        f"<a href='#tables'>Tables ({len(tables)})</a>"
        + ("<a href='#series'>Over time</a>" if series is not None else "")
        + "<a href='#validation'>Validation</a>"
        "<a href='#review'>Review</a></nav><main>",
        f"<h1>{html.escape(manifest['name'])}: differentially private release "
        f"<code>{release_id}</code></h1>",
        "<section id='summary'><div class='summary'>",
        f"<div class='card'>status<b>{html.escape(status)}</b></div>",
        f"<div class='card'>tables<b>{len(tables)}</b></div>",
        f"<div class='card'>mechanism<b>{html.escape(manifest['mechanism']['name'])}</b></div>",
        f"<div class='card'>privacy charged<b>{html.escape(_cost(manifest['privacy']['charged']))}</b></div>",
        f"<div class='card'>validation<b class='{'ok' if valid else 'bad'}'>"
        f"{'passed' if valid else 'FAILED'}</b></div>",
        "</div>",
        "<h2>What was released</h2>",
        _kv(
            {
                "release series": manifest["name"],
                "dataset": manifest["dataset_id"],
                "created (UTC)": manifest["created_at"],
                "spec fingerprint (sha256)": manifest["spec_fingerprint"],
                "input fingerprint (keyed HMAC-SHA256 of the input files)": manifest[
                    "input_fingerprint"
                ],
                "code version": f"{manifest['code_version'].get('package')} (git {manifest['code_version'].get('git_commit') or 'n/a'})",
                "tables": f"{len(tables)} (see Tables below)",
                "privacy unit": manifest["privacy_unit"],
            }
        ),
        *_assumptions(manifest),
        "</section><section id='budget'><h2>Privacy budget</h2>",
        _kv(
            {
                "requested by the spec": _cost(manifest["privacy"]["requested"]),
                "charged (OpenDP privacy map, incl. discretisation slack)": _cost(
                    manifest["privacy"]["charged"]
                ),
                "dataset cap": _cost(budget["cap"]),
                "spent before this release": _cost(budget["before"]),
                "spent after this release": _cost(budget["after"]),
                "remaining": _cost(budget["remaining"]),
                "noise": f"{noise['kind']} with scale {noise['scale']:.6g} on {noise['size']:,} "
                f"strategy answers (sensitivity {noise['sensitivity']:.6g})",
            }
        ),
        "<p>Ledger of this dataset (append-only; charges are never refunded):</p>",
        *(
            [
                "<figure aria-label='privacy budget spent over time against the cap'>"
                f"{budget_timeline_plot(ledger_rows, budget['cap'], manifest['release_id'])}</figure>"
            ]
            if ledger_rows and budget["cap"]
            else []
        ),
        _table_html(ledger_rows, ["seq", "created_at", "release_id", "label", "cost"]),
        "</section><section id='method'><h2>Mechanism and expected error</h2>",
        f"<p>Chosen: <b>{html.escape(plan['chosen'])}</b> — {html.escape(plan['reason'])}.</p>",
        _table_html(
            [
                {**c, "ratio to bound": c["rmse"] / bound if c.get("rmse") and bound else None}
                for c in plan["candidates"]
            ],
            [
                "mechanism",
                "rmse",
                "total_variance",
                "largest_variance",
                "ratio to bound",
                "sensitivity",
                "noise_scale",
                "note",
            ],
        ),
        f"<p>SVD lower bound on RMSE: <b>{_fmt(bound)}</b> "
        f"({html.escape(plan.get('lower_bound_note', ''))}).</p>",
        _objective_html(plan),
        *(
            [f"<figure aria-label='expected error by candidate'>{error_plot(plan)}</figure>"]
            if any(c.get("rmse") is not None for c in plan["candidates"])
            else []  # data-dependent candidates only: no expected error to draw
        ),
        *_details_section(manifest),
        "</section><section id='tables'><h2>Released tables</h2>",
        "<p>Every table is complete "
        + (
            f"on its own page (one per table, linked from the index below: {len(tables):,} "
            "tables are too many for one page; "
            if split
            else "below ("
        )
        + "paged; choose the page size, or download the CSV). "
        "95% intervals come from each row's error model (column <code>uncertainty</code> says what "
        "<code>std_error</code> covers): estimate ± 1.96 · std_error where the error is close to "
        "normal, the exact Laplace quantile (± 2.12 · std_error) where a row is one measured answer "
        "plus one Laplace draw, and no interval on rows labelled <i>noise-only</i> (their "
        "std_error omits a bias the release cannot estimate).</p>",
        searchable_index(tables, plan) if split else tables_index(tables),
        "</section>",
    ]
    per_table = min(EMBED_MAX_ROWS, max(PAGE_SIZES[-1], EMBED_TOTAL_ROWS // max(1, len(tables))))
    parts += (
        []
        if split  # sections on their own pages: table_pages
        else [
            table_section(index, name, table, max_rows=per_table)
            for index, (name, table) in enumerate(tables.items())
        ]
    )
    if series is not None:
        names = list(tables)
        parts.append(
            series_section(series, names, list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names)))
        )
    parts.append("<section id='validation'>")
    parts.append("<h2>Validation (released values and public metadata only)</h2>")
    parts += validation_section(validation)
    parts.append("</section><section id='review'><h2>Review trail</h2>")
    if reviews:
        signed = ["signed by"] if any("signed by" in r for r in reviews) else []
        parts.append(_table_html(reviews, ["at", "decision", "reviewer", "note", *signed]))
    else:
        parts.append("<p>Awaiting review: staged releases are published only after approval.</p>")
    script = SEARCH_SCRIPT if split else PAGER_SCRIPT
    parts.append(f"</section></main><script>{script}</script></body></html>")
    return "\n".join(parts)


def _cost(cost: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.6g}" for k, v in cost.items())


def _objective_html(plan: dict[str, Any]) -> str:
    """What the plan minimised, and the chosen strategy's largest cell standard error per table."""
    objective = html.escape(str(plan.get("objective", "total_variance")))
    errors = plan.get("item_std_errors")
    if not errors:
        return f"<p>Objective: <b>{objective}</b>; cell standard errors not predicted.</p>"
    table, largest = max(errors.items(), key=lambda pair: pair[1])
    summary = (
        f"<p>Objective: <b>{objective}</b>; largest cell standard error <b>{_fmt(largest)}</b> "
        f"(table <code>{html.escape(table)}</code>; every table's is in "
        "the manifest, <code>plan.item_std_errors</code>).</p>"
    )
    targets = plan.get("targets")
    if not targets:
        return summary
    rows = [
        {"table": name, "target std_error": target, "achieved std_error": errors[name]}
        for name, target in targets.items()
    ]
    return (
        summary
        + "<p>Accuracy targets: the privacy level above is the smallest that gives every cell "
        f"of every table at most its target standard error; table "
        f"<code>{html.escape(str(plan.get('binding_table')))}</code> decides it.</p>"
        + _table_html(rows, ["table", "target std_error", "achieved std_error"])
    )


def _kv(values: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
        for k, v in values.items()
    )
    return f"<table class='kv'>{rows}</table>"


def _details_section(manifest: dict[str, Any]) -> list[str]:
    """The mechanism's public details (e.g. a privately released partition and its reuse)."""
    details = manifest["mechanism"].get("details") or {}
    if not details:
        return []
    shown = {
        key.replace("_", " "): (f"{len(value)} values" if isinstance(value, list) else value)
        for key, value in details.items()
    }
    parts = [
        f"<h3>{html.escape(manifest['mechanism']['name'])}: details of the measurement</h3>",
        _kv(shown),
    ]
    boundaries = details.get("boundaries")
    if boundaries:
        parts.append(
            f"<figure aria-label='released partition'>{_partition_plot(boundaries)}</figure>"
        )
    return parts


def _partition_plot(boundaries: list[int]) -> str:
    """Bucket sizes of a privately released partition of the (1-D ordered) cells (inline SVG)."""
    edges = np.asarray(boundaries)
    sizes = np.diff(edges).astype(float)
    labels = [f"{lo}–{hi - 1}" for lo, hi in itertools.pairwise(edges.tolist())]
    return value_chart(
        "bars",
        labels,
        sizes,
        x_title=f"released partition: {sizes.size} buckets (cells, measurement order)",
        y_title="bucket size",
    )


def _cost_values(cost: str | dict[str, float]) -> dict[str, float]:
    """A ledger row's cost as numbers: a dict, or the ``"epsilon=0.5, delta=1e-09"`` text form."""
    if isinstance(cost, dict):
        return {str(k): float(v) for k, v in cost.items()}
    pairs = (part.strip().partition("=") for part in cost.split(","))
    return {name: float(number) for name, _, number in pairs if name and number}


def budget_timeline_plot(
    ledger_rows: list[dict[str, Any]], cap: dict[str, float], release_id: str
) -> str:
    """Cumulative spend of the dataset's budget, entry by entry (step curve), against the cap.

    The measure plotted is the cap's first component (epsilon for ε-DP and (ε, δ), rho for zCDP);
    this release's entries are starred.  Inline SVG, O(entries).
    """
    measure = next(iter(cap))
    charges = np.array([_cost_values(row["cost"]).get(measure, 0.0) for row in ledger_rows])
    labels = [
        ("* " if row["release_id"] == release_id else "")
        + str(row["created_at"])[5:16].replace("T", " ")
        for row in ledger_rows
    ]
    return value_chart(
        "step",
        labels,
        np.cumsum(charges),
        x_title="ledger entries in order (UTC month-day time; * this release)",
        y_title=f"{measure} spent",
        reference=(float(cap[measure]), f"cap ({measure}={cap[measure]:.6g})"),
    )


def _signed_trail(review: dict[str, Any]) -> list[dict[str, Any]]:
    """The review trail, each decision with the key that signed it (or ``unsigned``) once any
    decision of the release is signed; as it is otherwise."""
    signatures = review.get("signatures")
    if not signatures:
        return list(review["trail"])
    return [
        {
            **entry,
            "signed by": f"key {signed['key_id']} ({signed['role']})"
            if signed.get("key_id")
            else "unsigned",
        }
        for entry, signed in zip(review["trail"], signatures, strict=True)
    ]


def write_report(directory: Path, manifest: dict[str, Any], catalog: Catalog) -> None:
    """(Re)render ``report.html`` from the manifest, the tables and the validation results."""
    import pyarrow.parquet as pq

    tables = {
        name: pq.read_table(directory / "tables" / f"{name}.parquet") for name in manifest["tables"]
    }
    validation = json.loads((directory / "validation" / "results.json").read_text())
    ledger_rows = [
        {
            "seq": entry.seq,
            "created_at": entry.created_at,
            "release_id": entry.release_id,
            "label": entry.label,
            "cost": entry.cost.describe(),
        }
        for entry in catalog.ledger_entries(manifest["dataset_id"])
    ]
    html_text = render_report(
        manifest=manifest,
        plan=manifest["plan"],
        tables=tables,
        validation=validation,
        budget=manifest["budget"],
        ledger_rows=ledger_rows,
        reviews=_signed_trail(manifest["review"]),
        series=series_history(manifest, tables, catalog),
    )
    (directory / "report.html").write_text(html_text)
    pages = directory / TABLE_PAGES
    if pages.is_dir() and not pages.is_symlink():
        # stale pages of an earlier rendering (re-rendered on review): O(pages)
        for old in pages.glob("*.html"):
            old.unlink()
    if len(tables) >= SPLIT_FROM:
        pages.mkdir(exist_ok=True)
        for relative, text in table_pages(manifest, tables):
            (directory / relative).write_text(text)
