"""Output validation of a candidate release, using only released (noisy) values and public metadata.

Per table: the schema (label columns, ``estimate``, ``std_error``, ``ci_low``, ``ci_high``,
``uncertainty``), finite values, ``std_error > 0``, ``ci_low <= estimate <= ci_high`` (intervals
may be absent only on rows labelled noise-only) and exactly one row per query.  Nothing
here reads the confidential data: a pass/fail computed from true values would itself be a release.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from catalog.gx import run_suites
from catalog.tables import UNCERTAINTY_LABELS

VALUE_COLUMNS = ("estimate", "std_error", "ci_low", "ci_high")
INTERVAL_COLUMNS = ("ci_low", "ci_high")
NO_INTERVAL = "noise-only"  # the uncertainty label of rows published without an interval
LABELS = list(UNCERTAINTY_LABELS)
FINITE_LIMIT = 1e300


def table_expectations(table: pa.Table, *, expected_rows: int) -> list[tuple[str, dict[str, Any]]]:
    columns = list(table.column_names)
    expectations: list[tuple[str, dict[str, Any]]] = [
        ("expect_table_columns_to_match_set", {"column_set": columns, "exact_match": True}),
        ("expect_table_row_count_to_equal", {"value": expected_rows}),
    ]
    for name in VALUE_COLUMNS:
        expectations.append(("expect_column_to_exist", {"column": name}))
        nulls: dict[str, Any] = {"column": name}
        if name in INTERVAL_COLUMNS:  # a row that claims no interval has none
            nulls["where_not"] = ("uncertainty", NO_INTERVAL)
        expectations.append(("expect_column_values_to_not_be_null", nulls))
        expectations.append(
            (
                "expect_column_values_to_be_between",
                {"column": name, "min_value": -FINITE_LIMIT, "max_value": FINITE_LIMIT},
            )
        )
    expectations.append(
        ("expect_column_values_to_be_in_set", {"column": "uncertainty", "value_set": LABELS})
    )
    expectations.append(
        (
            "expect_column_values_to_be_between",
            {"column": "std_error", "min_value": 0, "strict_min": True},
        )
    )
    for low, high in (("estimate", "ci_low"), ("ci_high", "estimate")):
        expectations.append(
            (
                "expect_column_pair_values_a_to_be_greater_than_b",
                {
                    "column_A": low,
                    "column_B": high,
                    "or_equal": True,
                    "ignore_row_if": "either_value_is_missing",
                },
            )
        )
    return expectations


def validate_tables(
    tables: dict[str, pa.Table], *, expected_rows: dict[str, int], directory: Path
) -> dict[str, Any]:
    """Validate every table with Great Expectations; write JSON results and Data Docs under
    ``directory`` (the release's ``validation/``); return the combined summary."""
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
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(combined, indent=2, sort_keys=True) + "\n")
    return combined
