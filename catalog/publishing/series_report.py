"""The time-series part of a series release's audit report: for every table ``<item>.<part>``
(part: ``period``, ``cumulative``, ``rolling<k>``), each row's published estimates at every period
released so far, with the published 95% interval as a band.

Privacy: every number comes from a published table (an earlier period's ``tables/<name>.parquet``
in its published directory, checked against that release's manifest hash, or this release's own
table); nothing here reads data, a recorded measurement or a true count.

Cost: O(periods × charted rows) numbers; reading an earlier period costs its tables' size.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.report_charts import VALUE_START, value_chart

if TYPE_CHECKING:
    from dprelease.catalog.ledger.store import Catalog

SERIES_ROWS = 12
"""Rows of one table charted over time (the first ones, in table order; every row is in the
tables and their CSVs)."""
SERIES_CHARTS = 240
"""Charts the section draws at most (tables in part order, whole tables): a release with many
tables names the rest, whose figures are in their own tables at every period."""
VALUE_COLUMNS = ("estimate", "std_error", "ci_low", "ci_high")


@dataclass(frozen=True, kw_only=True)
class PublishedPeriod:
    """One period's published tables (public): 1-based period, its release, its tables."""

    period: int
    release_id: str
    tables: dict[str, pa.Table]


@dataclass(frozen=True, kw_only=True)
class SeriesHistory:
    """The periods shown: every earlier period of the series published under the same plan, then
    this release; ``left_out`` names earlier periods not shown and why (public)."""

    period: int
    horizon: int
    plan_sha256: str
    periods: tuple[PublishedPeriod, ...]
    left_out: tuple[str, ...]
    values: dict[int, str] = field(default_factory=dict)
    """Column periods: each shown period's declared value (``2026-03``), named with its number."""

    def label(self, period: int) -> str:
        value = self.values.get(period)
        return str(period) if value is None else f"{period} ({value})"


def series_details(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's ``mechanism.details.series`` (period, horizon, plan digest, charges)."""
    details = (manifest.get("mechanism") or {}).get("details") or {}
    series = details.get("series")
    return series if isinstance(series, dict) else None


def series_history(
    manifest: dict[str, Any], tables: dict[str, pa.Table], catalog: Catalog
) -> SeriesHistory | None:
    """The published periods of this release's series before it (same dataset, name and plan
    digest; status published; each table file matching its manifest's sha256), then this release.
    None for a release that is not a period of a series.  O(published releases + their tables)."""
    own = series_details(manifest)
    if own is None:
        return None
    current = int(own["period"])
    found: dict[int, PublishedPeriod] = {}
    values = {current: str(own["period_value"])} if "period_value" in own else {}
    left_out: list[str] = []
    skipped: set[int] = set()
    for record in catalog.releases(dataset_id=manifest["dataset_id"], status="published"):
        if record.name != manifest["name"] or record.id == manifest["release_id"]:
            continue
        if record.published_directory is None:
            continue
        directory = Path(record.published_directory)
        try:
            theirs = artifacts.read_manifest(directory)
        except VerificationError:
            left_out.append(f"release {record.id}: its published manifest cannot be read")
            continue
        details = series_details(theirs)
        if details is None or details.get("plan_sha256") != own["plan_sha256"]:
            continue
        period = int(details["period"])
        if period >= current:
            continue
        read = _published_tables(directory, theirs, names=list(tables))
        if read is None:
            left_out.append(
                f"period {period} (release {record.id}): a published table file does not match "
                "its manifest's sha256"
            )
            skipped.add(period)
            continue
        if any(not _same_labels(read[name], table) for name, table in tables.items()):
            left_out.append(
                f"period {period} (release {record.id}): its tables' rows are not this "
                "release's rows (another cell layout)"
            )
            skipped.add(period)
            continue
        found[period] = PublishedPeriod(period=period, release_id=record.id, tables=read)
        if "period_value" in details:
            values[period] = str(details["period_value"])
    missing = [p for p in range(1, current) if p not in found and p not in skipped]
    if missing:
        left_out.append(
            "period" + ("s " if len(missing) > 1 else " ") + ", ".join(map(str, missing)) + ": "
            "not published (staged, rejected or withdrawn): nothing of theirs is shown"
        )
    this = PublishedPeriod(period=current, release_id=manifest["release_id"], tables=tables)
    return SeriesHistory(
        period=current,
        horizon=int(own["horizon"]),
        plan_sha256=str(own["plan_sha256"]),
        periods=(*(found[p] for p in sorted(found)), this),
        left_out=tuple(left_out),
        values=values,
    )


def _published_tables(
    directory: Path, manifest: dict[str, Any], *, names: list[str]
) -> dict[str, pa.Table] | None:
    hashes = manifest.get("artifacts") or {}
    read = {}
    for name in names:
        relative = f"tables/{name}.parquet"
        path = directory / relative
        if not path.is_file() or artifacts.sha256_file(path) != hashes.get(relative):
            return None
        read[name] = pq.read_table(path)
    return read


def _same_labels(table: pa.Table, other: pa.Table) -> bool:
    """Same label columns with the same values, row by row.  O(rows)."""
    names = table.column_names
    labels = names[: names.index(VALUE_START)] if VALUE_START in names else names
    return names == other.column_names and table.select(labels).equals(other.select(labels))


def row_labels(table: pa.Table) -> list[str]:
    """One label per row: its label columns' values joined (``total`` for a one-row total)."""
    names = table.column_names
    labels = names[: names.index(VALUE_START)]
    if not labels:
        return ["total"] * table.num_rows
    columns = [table[c].to_pylist() for c in labels]
    return [" · ".join(str(v) for v in row) for row in zip(*columns, strict=True)]


def chart_data(history: SeriesHistory, name: str) -> dict[str, Any]:
    """What the charts of table ``name`` draw: per charted row, its published estimate, standard
    error and 95% interval at every shown period (None where the row claims no interval)."""
    first = history.periods[-1].tables[name]
    rows = min(first.num_rows, SERIES_ROWS)
    values: dict[str, list[list[float | None]]] = {c: [] for c in VALUE_COLUMNS}
    for shown in history.periods:
        table = shown.tables[name].slice(0, rows)
        for column in VALUE_COLUMNS:
            values[column].append(table[column].to_pylist())
    return {
        "periods": [p.period for p in history.periods],
        "release_ids": [p.release_id for p in history.periods],
        "rows": row_labels(first.slice(0, rows)),
        "table_rows": first.num_rows,
        # [row][period]: transposed from the per-period reads
        **{c: [list(r) for r in zip(*values[c], strict=True)] for c in VALUE_COLUMNS},
    }


def _nan(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def series_section(history: SeriesHistory, table_names: list[str], parts: list[str]) -> str:
    """The report's ``#series`` section: per part, per table, one step chart per charted row
    (estimates with the 95% band), and the charted figures as JSON (``#series-data``); at most
    :data:`SERIES_CHARTS` charts.  O(charted rows × periods)."""
    ordered = [n for part in parts for n in table_names if n.rsplit(".", 1)[-1] == part]
    charted: list[str] = []
    charts = 0
    for name in ordered:
        rows = min(history.periods[-1].tables[name].num_rows, SERIES_ROWS)
        if charted and charts + rows > SERIES_CHARTS:
            break
        charted.append(name)
        charts += rows
    data = {
        "period": history.period,
        "horizon": history.horizon,
        "plan_sha256": history.plan_sha256,
        "tables": {name: chart_data(history, name) for name in charted},
    }
    labels = [
        f"{history.label(p.period)}*" if p.period == history.period else history.label(p.period)
        for p in history.periods
    ]
    out = [
        "<section id='series'><h2>Series over time</h2>",
        f"<p>Period <b>{html.escape(history.label(history.period))}</b> of "
        f"<b>{history.horizon}</b> "
        f"(plan sha256 <code>{html.escape(history.plan_sha256)}</code>). Each chart shows one row "
        "of a table as published at every period released so far (* this release): the estimate "
        "and its published 95% interval as a band. Published figures never change; every number "
        "here is in a published table.</p>",
    ]
    if history.left_out:
        items = "".join(f"<li>{html.escape(text)}</li>" for text in history.left_out)
        out.append(f"<p class='muted'>Not shown:</p><ul>{items}</ul>")
    rest = ordered[len(charted) :]
    if rest:
        named = ", ".join(rest[:20]) + (f" … ({len(rest) - 20} more)" if len(rest) > 20 else "")
        out.append(
            f"<p class='muted'>Not charted ({len(rest)} tables; the section draws at most "
            f"{SERIES_CHARTS} charts): {html.escape(named)}.</p>"
        )
    for part in parts:
        names = [n for n in charted if n.rsplit(".", 1)[-1] == part]
        if not names:
            continue
        out.append(f"<h3>{html.escape(part)}</h3>")
        for name in names:
            figures = data["tables"][name]
            cut = (
                f" (the first {len(figures['rows'])} of {figures['table_rows']} rows)"
                if figures["table_rows"] > len(figures["rows"])
                else ""
            )
            out.append(f"<h4>{html.escape(name)}{html.escape(cut)}</h4><div class='series'>")
            for k, row in enumerate(figures["rows"]):
                svg = value_chart(
                    "step",
                    labels,
                    _nan(figures["estimate"][k]),
                    _nan(figures["ci_low"][k]),
                    _nan(figures["ci_high"][k]),
                    x_title="period (* this release)",
                    y_title=f"{row}"[:40],
                )
                out.append(
                    f"<figure aria-label='{html.escape(name, quote=True)} {html.escape(row, quote=True)} "
                    f"over periods'>{svg}<figcaption>{html.escape(name)}: "
                    f"{html.escape(row)}</figcaption></figure>"
                )
            out.append("</div>")
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    out.append(f"<script type='application/json' id='series-data'>{text}</script></section>")
    return "\n".join(out)
