"""Output validation of many tables in one suite over per-table figures: a bad row, a wrong row
count or a missing column in any one table fails the release, as with one suite per table (the
same bad tables checked both ways give the same verdict)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dprelease.catalog.validation.checks import BATCH_FROM_TABLES, TABLES_SUITE, validate_tables


def _table(rows: int, *, label: str = "noise") -> pa.Table:
    estimate = np.arange(rows, dtype=np.float64)
    return pa.table(
        {
            "v": np.arange(rows),
            "estimate": estimate,
            "std_error": np.ones(rows),
            "ci_low": estimate - 2.0,
            "ci_high": estimate + 2.0,
            "uncertainty": [label] * rows,
        }
    )


def _tables() -> dict[str, pa.Table]:
    return {f"t{k}": _table(3 + k % 4) for k in range(BATCH_FROM_TABLES)}


def _failed(result: dict, suite: str) -> set[tuple[str, str | None]]:
    return {
        (r["expectation"], r["column"] or r["kwargs"].get("column_A"))
        for r in result["tables"][suite]["results"]
        if not r["success"]
    }


def _validate(tables: dict[str, pa.Table], tmp_path: Path, **rows: int) -> dict:
    expected = {name: table.num_rows for name, table in tables.items()} | rows
    return validate_tables(tables, expected_rows=expected, directory=tmp_path)


def test_many_good_tables_pass_in_two_suites(tmp_path: Path) -> None:
    tables = _tables()
    result = _validate(tables, tmp_path)
    assert result["success"]
    assert set(result["tables"]) == {TABLES_SUITE}
    assert result["batched_tables"] == list(tables)
    assert (tmp_path / "results.json").is_file()


@pytest.mark.parametrize(
    ("break_it", "column"),
    [
        ("nan", "estimate_nulls"),
        ("inf", "estimate_not_finite"),
        ("interval", "ci_low_nulls_where_claimed"),
        ("label", "uncertainty_outside_labels"),
        ("order", "ci_low_minus_estimate_max"),
        ("zero_se", "std_error_min"),
        ("rows", "rows"),
        ("column", "required_columns_present"),
    ],
)
def test_one_bad_table_fails_the_batch_as_it_fails_alone(
    tmp_path: Path, break_it: str, column: str
) -> None:
    tables = _tables()
    bad = tables["t5"]
    rows: dict[str, int] = {}
    if break_it == "nan":
        bad = bad.set_column(1, "estimate", pa.array([1.0, None, 3.0, 4.0], pa.float64()))
    elif break_it == "inf":
        bad = bad.set_column(1, "estimate", pa.array([1.0, np.inf, 3.0, 4.0], pa.float64()))
    elif break_it == "interval":
        bad = bad.set_column(3, "ci_low", pa.array([0.0, None, 1.0, 2.0], pa.float64()))
    elif break_it == "label":
        bad = bad.set_column(5, "uncertainty", pa.array(["noise", "whatever", "noise", "noise"]))
    elif break_it == "order":
        bad = bad.set_column(3, "ci_low", pa.array([0.0, 5.0, 1.0, 2.0], pa.float64()))
    elif break_it == "zero_se":
        bad = bad.set_column(2, "std_error", pa.array([1.0, 0.0, 1.0, 1.0], pa.float64()))
    elif break_it == "rows":
        rows = {"t5": bad.num_rows + 1}
    elif break_it == "column":
        bad = bad.drop_columns(["std_error"])
    tables["t5"] = bad
    result = _validate(tables, tmp_path / "batch", **rows)
    assert not result["success"]
    assert column in {c for _, c in _failed(result, TABLES_SUITE)}
    alone = _validate({"t5": bad, "t6": tables["t6"]}, tmp_path / "alone", **rows)
    assert not alone["tables"]["t5"]["success"] and alone["tables"]["t6"]["success"]


def test_a_missing_interval_passes_on_noise_only_rows_in_a_batch(tmp_path: Path) -> None:
    tables = _tables()
    tables["t3"] = pa.table(
        {
            "v": [0, 1],
            "estimate": [1.0, 2.0],
            "std_error": [1.0, 1.0],
            "ci_low": pa.array([None, 0.0], pa.float64()),
            "ci_high": pa.array([None, 4.0], pa.float64()),
            "uncertainty": ["noise-only", "noise"],
        }
    )
    assert _validate(tables, tmp_path)["success"]
