"""The self-contained audit report (``report.html``): no network, plots embedded as PNG data URIs.

It shows what was released (tables, estimates with confidence intervals), from which input
(fingerprint) under which spec, the privacy budget before and after with the dataset's ledger,
the mechanism chosen and why against the alternatives and the SVD lower bound, validation results
and the review trail.  Every number in it is public: released values or public metadata.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import numpy as np
import pyarrow as pa

PREVIEW_ROWS = 12
PLOTTED_ITEMS = 4


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def error_plot(plan: dict[str, Any]) -> str:
    """Bar chart: expected RMSE per candidate, with the SVD lower bound as a line."""
    plt = _pyplot()
    scored = [c for c in plan["candidates"] if c.get("rmse") is not None]
    figure, axis = plt.subplots(figsize=(6, 2.8))
    names = [c["mechanism"] for c in scored]
    values = [c["rmse"] for c in scored]
    colours = ["#2b6cb0" if n == plan["chosen"] else "#a0aec0" for n in names]
    axis.bar(names, values, color=colours)
    if values and max(values) > 20 * min(values):
        axis.set_yscale("log")
    if plan.get("lower_bound_rmse"):
        axis.axhline(
            plan["lower_bound_rmse"], color="#c53030", linestyle="--", label="SVD lower bound"
        )
        axis.legend(loc="lower right")
    axis.set_ylabel("expected RMSE per query")
    axis.set_title("Candidate mechanisms (chosen in blue)")
    return _png(figure)


def table_plot(name: str, table: pa.Table, *, ordered: bool) -> str:
    """Estimates with 95% confidence intervals for one table (first 200 queries)."""
    plt = _pyplot()
    count = min(table.num_rows, 200)
    estimate = table["estimate"].to_numpy()[:count]
    low = table["ci_low"].to_numpy()[:count]
    high = table["ci_high"].to_numpy()[:count]
    figure, axis = plt.subplots(figsize=(6, 2.6))
    positions = np.arange(count)
    if ordered and count >= 30:
        axis.fill_between(positions, low, high, color="#bee3f8", label="95% interval")
        axis.plot(positions, estimate, color="#2b6cb0", linewidth=1, label="estimate")
    else:  # categories have no order: points with interval bars, no connecting line
        axis.errorbar(
            positions,
            estimate,
            yerr=[estimate - low, high - estimate],
            fmt="o",
            markersize=3,
            color="#2b6cb0",
            ecolor="#63b3ed",
            label="estimate, 95% interval",
        )
    axis.set_xlabel("query (table row)" + (" — first 200" if table.num_rows > 200 else ""))
    axis.set_ylabel("estimate")
    axis.set_title(name)
    axis.legend(loc="upper left")
    return _png(figure)


def _table_html(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c)))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _is_ordered(table: pa.Table) -> bool:
    """Tables of CDFs and ranges are plotted as curves; marginals as points."""
    return any(name.endswith(("_upper", "_low")) for name in table.column_names)


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1000px;color:#1a202c;padding:0 1rem}
h1{font-size:1.6rem}h2{border-bottom:1px solid #e2e8f0;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}td,th{border:1px solid #e2e8f0;padding:.25rem .5rem;text-align:right}
th{background:#f7fafc}.ok{color:#276749;font-weight:600}.bad{color:#c53030;font-weight:600}
.kv td:first-child{text-align:left;color:#4a5568}code{font-size:.85rem;word-break:break-all}
.summary{display:flex;gap:1rem;flex-wrap:wrap}.card{border:1px solid #e2e8f0;border-radius:6px;padding:.6rem 1rem}
.card b{display:block;font-size:1.3rem}
"""


def render_report(
    *,
    manifest: dict[str, Any],
    plan: dict[str, Any],
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    budget: dict[str, Any],
    ledger_rows: list[dict[str, Any]],
    reviews: list[dict[str, Any]],
) -> str:
    """The whole report as one HTML string."""
    status = manifest.get("review", {}).get("status", "staged")
    valid = validation.get("success")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>dprelease audit report — {html.escape(manifest['release_id'])}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Differentially private release <code>{html.escape(manifest['release_id'])}</code></h1>",
        "<div class='summary'>",
        f"<div class='card'>status<b>{html.escape(status)}</b></div>",
        f"<div class='card'>mechanism<b>{html.escape(manifest['mechanism']['name'])}</b></div>",
        f"<div class='card'>privacy charged<b>{html.escape(_cost(manifest['privacy']['charged']))}</b></div>",
        f"<div class='card'>validation<b class='{'ok' if valid else 'bad'}'>{'passed' if valid else 'FAILED'}</b></div>",
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
                "tables": ", ".join(manifest["tables"]),
                "privacy unit": manifest["privacy_unit"],
            }
        ),
        "<h2>Privacy budget</h2>",
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
                "noise": f"{manifest['mechanism']['noise']['kind']} with scale {manifest['mechanism']['noise']['scale']:.6g} on {manifest['mechanism']['noise']['size']:,} strategy answers (sensitivity {manifest['mechanism']['noise']['sensitivity']:.6g})",
            }
        ),
        "<p>Ledger of this dataset (append-only; charges are never refunded):</p>",
        *_budget_timeline(ledger_rows, budget["cap"], manifest["release_id"]),
        _table_html(ledger_rows, ["seq", "created_at", "release_id", "label", "cost"]),
        "<h2>Mechanism and expected error</h2>",
        f"<p>Chosen: <b>{html.escape(plan['chosen'])}</b> — {html.escape(plan['reason'])}.</p>",
        _table_html(
            [
                {
                    **c,
                    "ratio to bound": (c["rmse"] / plan["lower_bound_rmse"])
                    if c.get("rmse") and plan.get("lower_bound_rmse")
                    else None,
                }
                for c in plan["candidates"]
            ],
            [
                "mechanism",
                "rmse",
                "total_variance",
                "ratio to bound",
                "sensitivity",
                "noise_scale",
                "note",
            ],
        ),
        f"<p>SVD lower bound on RMSE: <b>{_fmt(plan.get('lower_bound_rmse'))}</b> ({html.escape(plan.get('lower_bound_note', ''))}).</p>",
        f"<img alt='expected error by candidate' src='{error_plot(plan)}'>",
        *_details_section(manifest),
        "<h2>Released tables</h2>",
        "<p>95% intervals from each row's error model (column <code>uncertainty</code> says what "
        "<code>std_error</code> covers): estimate ± 1.96 · std_error where the error is close to "
        "normal, the exact Laplace quantile (± 2.12 · std_error) where a row is one measured answer "
        "plus one Laplace draw, and no interval on rows labelled <i>noise-only</i> (their "
        "std_error omits a bias the release cannot estimate).</p>",
    ]
    for index, (name, table) in enumerate(tables.items()):
        columns = table.column_names
        preview = table.slice(0, PREVIEW_ROWS).to_pylist()
        parts.append(f"<h3>{html.escape(name)} <small>({table.num_rows:,} rows)</small></h3>")
        if index < PLOTTED_ITEMS:
            parts.append(
                f"<img alt='estimates of {html.escape(name)}' src='{table_plot(name, table, ordered=_is_ordered(table))}'>"
            )
        parts.append(_table_html(preview, columns))
    parts.append("<h2>Validation (released values and public metadata only)</h2>")
    rows = []
    for table_name, summary in validation.get("tables", {}).items():
        for result in summary["results"]:
            rows.append(
                {
                    "table": table_name,
                    "expectation": result["expectation"],
                    "column": result.get("column") or "",
                    "result": "pass" if result["success"] else "FAIL",
                }
            )
    parts.append(_table_html(rows, ["table", "expectation", "column", "result"]))
    parts.append("<h2>Review trail</h2>")
    if reviews:
        parts.append(_table_html(reviews, ["at", "decision", "reviewer", "note"]))
    else:
        parts.append("<p>Awaiting review: staged releases are published only after approval.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _cost(cost: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.6g}" for k, v in cost.items())


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
        parts.append(f"<img alt='released partition' src='{_partition_plot(boundaries)}'>")
    return parts


def _partition_plot(boundaries: list[int]) -> str:
    """Bucket sizes of a privately released partition of the (1-D ordered) cells."""
    plt = _pyplot()
    edges = np.asarray(boundaries)
    figure, axis = plt.subplots(figsize=(6, 2.2))
    axis.bar(
        edges[:-1],
        np.diff(edges),
        width=np.diff(edges),
        align="edge",
        color="#90cdf4",
        edgecolor="#2b6cb0",
        linewidth=0.4,
    )
    axis.set_xlabel("cell (measurement order)")
    axis.set_ylabel("bucket size")
    axis.set_title(f"released partition: {edges.size - 1} buckets")
    return _png(figure)


def _cost_values(cost: str | dict[str, float]) -> dict[str, float]:
    """A ledger row's cost as numbers: a dict, or the ``"epsilon=0.5, delta=1e-09"`` text form."""
    if isinstance(cost, dict):
        return {str(k): float(v) for k, v in cost.items()}
    values = {}
    for part in cost.split(","):
        name, _, number = part.strip().partition("=")
        if name and number:
            values[name] = float(number)
    return values


def budget_timeline_plot(
    ledger_rows: list[dict[str, Any]], cap: dict[str, float], release_id: str
) -> str:
    """Cumulative spend of the dataset's budget over time (step line) against the cap (dashed).

    The measure plotted is the cap's first component (epsilon for ε-DP and (ε, δ), rho for zCDP);
    this release's charges are marked in orange.
    """
    from datetime import datetime, timedelta

    plt = _pyplot()
    measure = next(iter(cap))
    times = [datetime.fromisoformat(row["created_at"]) for row in ledger_rows]
    charges = np.array([_cost_values(row["cost"]).get(measure, 0.0) for row in ledger_rows])
    cumulative = np.cumsum(charges)  # O(entries)
    figure, axis = plt.subplots(figsize=(6, 2.6))
    axis.step(times, cumulative, where="post", color="#2b6cb0", label=f"cumulative {measure}")
    mine = [k for k, row in enumerate(ledger_rows) if row["release_id"] == release_id]
    others = [k for k in range(len(ledger_rows)) if k not in mine]
    axis.plot([times[k] for k in others], cumulative[others], "o", color="#2b6cb0", markersize=4)
    axis.plot(
        [times[k] for k in mine],
        cumulative[mine],
        "o",
        color="#dd6b20",
        markersize=6,
        label="this release",
    )
    axis.axhline(
        cap[measure], color="#c53030", linestyle="--", label=f"cap ({measure}={cap[measure]:.6g})"
    )
    axis.set_ylim(0, max(cap[measure], float(cumulative.max(initial=0.0))) * 1.1)
    if times:  # a short history must not be drawn across years of empty axis
        span = max(max(times) - min(times), timedelta(hours=1))
        axis.set_xlim(min(times) - span * 0.1, max(times) + span * 0.1)
    axis.set_ylabel(f"{measure} spent")
    axis.set_title("Privacy budget of this dataset over time")
    axis.legend(loc="best", fontsize="small")
    figure.autofmt_xdate()
    return _png(figure)


def _budget_timeline(
    ledger_rows: list[dict[str, Any]], cap: dict[str, float], release_id: str
) -> list[str]:
    if not ledger_rows or not cap:
        return []
    return [
        f"<img alt='privacy budget spent over time against the cap' "
        f"src='{budget_timeline_plot(ledger_rows, cap, release_id)}'>"
    ]
