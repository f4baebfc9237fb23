"""Output validation of a candidate release, using only released (noisy) values and public metadata.

Per table: the schema (label columns, ``estimate``, ``std_error``, ``ci_low``, ``ci_high``,
``uncertainty``), finite values, ``std_error > 0``, ``ci_low <= estimate <= ci_high`` (intervals
may be absent only on rows labelled noise-only) and exactly one row per query.  Nothing
here reads the confidential data: a pass/fail computed from true values would itself be a release.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from dprelease.catalog.publishing.tables import UNCERTAINTY_LABELS
from dprelease.catalog.validation.service import run_suites

if TYPE_CHECKING:
    import pandas as pd

VALUE_COLUMNS = ("estimate", "std_error", "ci_low", "ci_high")
INTERVAL_COLUMNS = ("ci_low", "ci_high")
NO_INTERVAL = "noise-only"  # the uncertainty label of rows published without an interval
LABELS = list(UNCERTAINTY_LABELS)
FINITE_LIMIT = 1e300
BATCH_FROM_TABLES = 32
TABLES_SUITE = "all_tables"
REQUIRED_COLUMNS = (*VALUE_COLUMNS, "uncertainty")
POSITIVE = {"min_value": 0, "strict_min": True}


def batched_jobs(
    tables: dict[str, pa.Table], *, expected_rows: dict[str, int]
) -> list[tuple[str, pd.DataFrame, list[tuple[str, dict[str, Any]]]]]:
    """One suite over a frame with one row per table, holding what the per-table checks test:
    row count as planned, every required column present, null and non-finite counts, the
    smallest ``std_error``, labels outside the set, intervals missing on rows that claim one, and
    the largest ``ci_low − estimate`` and ``estimate − ci_high``.  Each figure is computed with
    Arrow in O(rows) without copying a table; GX checks the figures, so the checks and their
    verdicts are those of :func:`table_expectations`."""
    import pandas as pd  # imported here: 0.2 s that loading the release flow never needs

    rows = [_table_figures(name, table, expected_rows[name]) for name, table in tables.items()]
    expectations: list[tuple[str, dict[str, Any]]] = [
        ("expect_column_values_to_be_unique", {"column": "table"}),
        (
            "expect_column_pair_values_to_be_equal",
            {"column_A": "rows", "column_B": "expected_rows"},
        ),
        (
            "expect_column_pair_values_to_be_equal",
            {"column_A": "required_columns_present", "column_B": "required_columns"},
        ),
        ("expect_column_values_to_be_between", {"column": "std_error_min", **POSITIVE}),
    ]
    zero = [f"{c}_nulls" for c in VALUE_COLUMNS if c not in INTERVAL_COLUMNS]
    zero += [f"{c}_nulls_where_claimed" for c in INTERVAL_COLUMNS]
    zero += [f"{c}_not_finite" for c in VALUE_COLUMNS]
    zero += ["uncertainty_outside_labels"]
    expectations += [
        ("expect_column_values_to_be_between", {"column": c, "min_value": 0, "max_value": 0})
        for c in zero
    ]
    expectations += [
        ("expect_column_values_to_be_between", {"column": c, "max_value": 0})
        for c in ("ci_low_minus_estimate_max", "estimate_minus_ci_high_max")
    ]
    return [(TABLES_SUITE, pd.DataFrame(rows), expectations)]


def _table_figures(name: str, table: pa.Table, expected: int) -> dict[str, Any]:
    """The per-table figures :func:`batched_jobs` checks (released values only). O(rows)."""
    n = table.num_rows
    missing = pa.nulls(n, pa.float64())
    column = {c: table[c] if c in table.column_names else None for c in REQUIRED_COLUMNS}
    values = {
        c: (missing if column[c] is None else pc.cast(column[c], pa.float64()))
        for c in VALUE_COLUMNS
    }
    labels = (
        column["uncertainty"] if column["uncertainty"] is not None else pa.nulls(n, pa.string())
    )
    claims = pc.fill_null(pc.not_equal(labels, NO_INTERVAL), True)  # rows that claim an interval
    figures: dict[str, Any] = {
        "table": name,
        "rows": n,
        "expected_rows": int(expected),
        "required_columns_present": sum(c is not None for c in column.values()),
        "required_columns": len(REQUIRED_COLUMNS),
        "uncertainty_outside_labels": n
        - int(pc.sum(pc.is_in(labels, pa.array(LABELS))).as_py() or 0),
    }
    for c, array in values.items():
        nulls = pc.is_null(array)
        if c in INTERVAL_COLUMNS:
            figures[f"{c}_nulls_where_claimed"] = int(pc.sum(pc.and_(nulls, claims)).as_py() or 0)
        else:
            figures[f"{c}_nulls"] = int(pc.sum(nulls).as_py() or 0)
        finite = pc.and_(pc.is_finite(array), pc.less_equal(pc.abs(array), FINITE_LIMIT))
        figures[f"{c}_not_finite"] = int(pc.sum(pc.invert(pc.fill_null(finite, True))).as_py() or 0)
    figures["std_error_min"] = _extreme(pc.min, values["std_error"], default=1.0)
    figures["ci_low_minus_estimate_max"] = _extreme(
        pc.max, pc.subtract(values["ci_low"], values["estimate"]), default=0.0
    )
    figures["estimate_minus_ci_high_max"] = _extreme(
        pc.max, pc.subtract(values["estimate"], values["ci_high"]), default=0.0
    )
    return figures


def _extreme(function: Any, array: pa.Array, *, default: float) -> float:
    """min/max ignoring nulls and NaN (NaN and nulls are counted by their own figures)."""
    clean = pc.filter(array, pc.fill_null(pc.invert(pc.is_nan(array)), False))
    value = function(clean).as_py()
    return default if value is None else float(value)


def table_expectations(table: pa.Table, *, expected_rows: int) -> list[tuple[str, dict[str, Any]]]:
    columns = list(table.column_names)
    expectations: list[tuple[str, dict[str, Any]]] = [
        ("expect_table_columns_to_match_set", {"column_set": columns, "exact_match": True}),
        ("expect_table_row_count_to_equal", {"value": expected_rows}),
    ]
    for name in VALUE_COLUMNS:
        nulls: dict[str, Any] = {"column": name}
        if name in INTERVAL_COLUMNS:  # a row that claims no interval has none
            nulls["where_not"] = ("uncertainty", NO_INTERVAL)
        finite = {"column": name, "min_value": -FINITE_LIMIT, "max_value": FINITE_LIMIT}
        expectations += [
            ("expect_column_to_exist", {"column": name}),
            ("expect_column_values_to_not_be_null", nulls),
            ("expect_column_values_to_be_between", finite),
        ]
    expectations += [
        ("expect_column_values_to_be_in_set", {"column": "uncertainty", "value_set": LABELS}),
        ("expect_column_values_to_be_between", {"column": "std_error", **POSITIVE}),
    ]
    pair = {"or_equal": True, "ignore_row_if": "either_value_is_missing"}
    return expectations + [
        (
            "expect_column_pair_values_a_to_be_greater_than_b",
            {"column_A": low, "column_B": high, **pair},
        )
        for low, high in (("estimate", "ci_low"), ("ci_high", "estimate"))
    ]


def validate_tables(
    tables: dict[str, pa.Table], *, expected_rows: dict[str, int], directory: Path
) -> dict[str, Any]:
    """Validate every table with Great Expectations; write JSON results and Data Docs under
    ``directory`` (the release's ``validation/``); return the combined summary.

    Up to ``BATCH_FROM_TABLES − 1`` tables: one suite per table.  From ``BATCH_FROM_TABLES`` on
    (GX's cost is per suite and it copies each table to pandas: hundreds take minutes), one
    suite checks every table's figures at once (:func:`batched_jobs`) and ``batched_tables``
    lists the tables it covers."""
    batched = len(tables) >= BATCH_FROM_TABLES
    if batched:
        jobs = batched_jobs(tables, expected_rows=expected_rows)
    else:
        jobs = [
            (name, table.to_pandas(), table_expectations(table, expected_rows=expected_rows[name]))
            for name, table in tables.items()
        ]
    summaries = run_suites(jobs, docs_dir=directory / "docs")
    combined = {
        "success": all(summary["success"] for summary in summaries.values()),
        "tables": summaries,
        "uses_only_public_values": True,
    }
    if batched:
        combined["batched_tables"] = list(tables)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(combined, indent=2, sort_keys=True) + "\n")
    return combined
