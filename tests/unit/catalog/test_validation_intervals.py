"""Output validation: intervals may be absent only on rows that claim none (noise-only)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from dprelease.catalog.validation.checks import validate_tables


def _table(labels: list[str]) -> pa.Table:
    return pa.table(
        {
            "v": [0, 1, 2],
            "estimate": [1.0, 2.0, 3.0],
            "std_error": [1.0, 1.0, 1.0],
            "ci_low": [0.0, None, 2.0],
            "ci_high": [2.0, None, 4.0],
            "uncertainty": labels,
        }
    )


def test_a_missing_interval_passes_only_on_noise_only_rows(tmp_path: Path) -> None:
    result = validate_tables(
        {
            "honest": _table(["noise+bias", "noise-only", "noise+bias"]),
            "missing": _table(["noise+bias", "noise", "noise+bias"]),
            "unknown_label": _table(["noise", "noise-only", "whatever"]),
        },
        expected_rows={"honest": 3, "missing": 3, "unknown_label": 3},
        directory=tmp_path,
    )
    tables = result["tables"]
    assert tables["honest"]["success"]
    failed = {
        (r["expectation"], r["column"]) for r in tables["missing"]["results"] if not r["success"]
    }
    assert failed == {
        ("expect_column_values_to_not_be_null", "ci_low"),
        ("expect_column_values_to_not_be_null", "ci_high"),
    }
    assert not tables["unknown_label"]["success"]
    assert not result["success"]
