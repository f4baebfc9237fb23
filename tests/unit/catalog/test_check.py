"""``dprelease check`` (``catalog.confidential.check``): the data custodian's exact view of input problems.

It counts exactly what a release refuses or leaves out (nulls, out-of-domain values with examples,
wrong types, rows over the contribution bound), labels the output CONFIDENTIAL, exits 3 on
problems and 0 on clean data, imports no Prefect and writes nothing anywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dprelease.catalog.confidential.check import CONFIDENTIAL, check_data, format_report
from dprelease.catalog.confidential.source import count_cells
from dprelease.catalog.errors import DataError, SpecError
from dprelease.catalog.spec.load import load_spec, parse_spec
from dprelease.flows.cli import app

REPO = Path(__file__).resolve().parents[3]
DOMAIN: dict[str, Any] = {
    "age": {"min": 0, "max": 9},
    "sex": {"values": ["F", "M"]},
    "hours": {"bins": [0, 20, 40, 60, 100]},
}


def clean_table(rows: int = 1000) -> pa.Table:
    k = np.arange(rows)
    return pa.table(
        {
            "age": pa.array(k % 10, pa.int64()),
            "sex": pa.array(np.where(k % 2 == 0, "F", "M")),
            "hours": pa.array((k % 100).astype(np.float64)),
        }
    )


def replaced(table: pa.Table, column: str, rows: range | list[int], value: Any) -> pa.Table:
    values = table[column].to_pylist()
    for row in rows:
        values[row] = value
    index = table.schema.get_field_index(column)
    return table.set_column(index, column, pa.array(values, table.schema.field(column).type))


def spec_file(tmp_path: Path, table: pa.Table, **top: Any) -> Path:
    pq.write_table(table, tmp_path / "data.parquet")
    spec = {
        "name": "chk",
        "dataset": {"id": "chk", "source": "data.parquet", "budget": {"epsilon": 10.0}},
        "domain": DOMAIN,
        "workload": [{"name": "all", "marginal": list(DOMAIN)}],
        "privacy": {"epsilon": 1.0},
        **top,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_clean_data_has_no_problems(tmp_path: Path) -> None:
    report = check_data(load_spec(spec_file(tmp_path, clean_table())))
    assert report.problems == []
    assert report.rows == 1000 and report.rows_counted == 1000
    text = format_report(report)
    assert text.startswith(CONFIDENTIAL) and text.endswith(CONFIDENTIAL)
    assert "no problems" in text


def test_nulls_and_out_of_domain_values_are_counted_exactly(tmp_path: Path) -> None:
    table = replaced(clean_table(), "age", range(0, 37), None)
    table = replaced(table, "age", range(100, 111), 42)
    table = replaced(table, "age", range(200, 203), -7)
    table = replaced(table, "sex", [500], "X")
    table = replaced(table, "hours", [600, 601], float("nan"))
    report = check_data(load_spec(spec_file(tmp_path, table)))
    age, sex, hours = report.columns
    assert (age.null_rows, age.outside_rows, age.examples) == (37, 14, ((42, 11), (-7, 3)))
    assert (sex.null_rows, sex.outside_rows, sex.examples) == (0, 1, (("X", 1),))
    assert (hours.outside_rows, hours.examples) == (2, (("nan", 2),))
    assert report.rows == 1000 and report.rows_counted == 1000 - 37 - 14 - 1 - 2
    assert report.problems == [
        "column 'age': 37 null row(s) (a release refuses the input; on_out_of_domain: drop "
        "would leave them out)",
        "column 'age': 14 row(s) outside integers 0..9 (a release refuses the input; "
        "on_out_of_domain: drop would leave them out); e.g. 42 (11 rows), -7 (3 rows)",
        "column 'sex': 1 row(s) outside values ['F', 'M'] (a release refuses the input; "
        "on_out_of_domain: drop would leave them out); e.g. 'X' (1 rows)",
        "column 'hours': 2 row(s) outside bins covering [0, 100] (a release refuses the input; "
        "on_out_of_domain: drop would leave them out); e.g. 'nan' (2 rows)",
    ]
    # the release itself says only the column and the rule
    with pytest.raises(DataError) as raised:
        count_cells(load_spec(tmp_path / "spec.yaml"))
    assert "37" not in str(raised.value) and "42" not in str(raised.value)


def test_examples_are_the_most_frequent_values_first_at_most_five(tmp_path: Path) -> None:
    table = clean_table()
    start = 0
    for value, rows in [(11, 1), (12, 6), (13, 2), (14, 5), (15, 3), (16, 4)]:
        table = replaced(table, "age", range(start, start + rows), value)
        start += rows
    report = check_data(load_spec(spec_file(tmp_path, table)))
    assert report.columns[0].examples == ((12, 6), (14, 5), (16, 4), (15, 3), (13, 2))
    assert report.columns[0].outside_rows == 21


def test_drop_mode_says_the_rows_are_left_out(tmp_path: Path) -> None:
    table = replaced(clean_table(), "age", range(5), None)
    report = check_data(load_spec(spec_file(tmp_path, table, on_out_of_domain="drop")))
    assert report.problems == [
        "column 'age': 5 null row(s) (on_out_of_domain: drop, so a release leaves these rows out)"
    ]
    assert report.rows_counted == 995


def test_contribution_bound_violations(tmp_path: Path) -> None:
    persons = [f"p{k % 100}" for k in range(1000)]
    persons[:300] = ["heavy"] * 300  # one person with 300 rows ...
    persons[300:310] = ["ten"] * 10  # ... one with 10 ...
    persons[310:312] = [None, None]  # ... and two rows without a person
    table = clean_table().append_column("pid", pa.array(persons))
    path = spec_file(tmp_path, table, privacy_unit={"person_column": "pid", "max_rows": 8})
    report = check_data(load_spec(path))
    bound = report.contributions
    assert bound is not None
    # p0..p99 hold the other 688 rows: 6 or 7 each, all within the bound
    assert (bound.persons, bound.null_person_rows) == (102, 2)
    assert (bound.persons_over, bound.rows_over, bound.largest) == (2, 292 + 2, 300)
    assert report.rows_counted == 688 + 8 + 8
    assert report.problems == [
        "person column 'pid': 2 row(s) with a null person id (a release refuses the input)",
        "person column 'pid': 2 of 102 person(s) have more than max_rows = 8 rows (at most "
        "300); a release keeps each one's first 8 rows and leaves 294 row(s) out",
    ]


def test_wrong_types_and_missing_columns_are_shown_with_the_file_type(tmp_path: Path) -> None:
    table = clean_table()
    table = table.set_column(0, "age", pa.array(np.arange(1000) % 10, pa.float64()))
    table = replaced(table.drop_columns(["sex"]), "hours", [3], 1e6)
    report = check_data(load_spec(spec_file(tmp_path, table)))
    where = str(tmp_path / "data.parquet")
    assert report.problems[:2] == [
        f"column 'sex' in {where}: the input is missing column(s) ['sex'] required by the spec "
        "(columns present: ['age', 'hours'])",
        f"column 'age' in {where}: column 'age' does not hold integer values, which the domain "
        "(IntegerRange) needs: fix the data or the domain (has type double)",
    ]
    # the usable column is still checked; nothing is counted as a release would
    assert [c.column for c in report.columns] == ["hours"]
    assert report.columns[0].examples == ((1e6, 1),)
    assert report.rows_counted is None


def test_an_unreadable_file_is_reported_with_arrows_reason(tmp_path: Path) -> None:
    pq.write_table(clean_table(), tmp_path / "a.parquet")
    (tmp_path / "b.parquet").write_text("not parquet")
    spec = parse_spec(
        {
            "name": "chk",
            "dataset": {"id": "c", "source": f"{tmp_path}/*.parquet", "budget": {"epsilon": 1}},
            "domain": DOMAIN,
            "workload": [{"name": "t", "total": True}],
            "privacy": {"epsilon": 1.0},
        }
    )
    report = check_data(spec)
    assert len(report.problems) == 1
    assert report.problems[0].startswith(f"file {tmp_path / 'b.parquet'}: cannot read")
    assert "magic bytes" in report.problems[0]  # Arrow's reason: shown here, never in a release


def test_check_needs_a_central_spec_with_a_source() -> None:
    spec = {
        "name": "chk",
        "dataset": {"id": "c", "budget": {"epsilon": 1}},
        "domain": DOMAIN,
        "workload": [{"name": "t", "total": True}],
        "privacy": {"epsilon": 1.0},
    }
    with pytest.raises(SpecError, match=r"dataset\.source is not set in the spec"):
        check_data(parse_spec(spec))
    local = {**spec, "model": "local", "dataset": {**spec["dataset"], "source": "r.parquet"}}
    with pytest.raises(SpecError, match=r"dprelease check covers central-model specs"):
        check_data(parse_spec(local))


def test_cli_exit_codes_and_confidential_label(tmp_path: Path) -> None:
    runner = CliRunner()
    clean = runner.invoke(app, ["check", str(spec_file(tmp_path, clean_table()))])
    assert clean.exit_code == 0, clean.output
    assert clean.output.count("CONFIDENTIAL") == 2
    bad = replaced(clean_table(), "age", range(7), 99)
    found = runner.invoke(app, ["check", str(spec_file(tmp_path, bad))])
    assert found.exit_code == 3, found.output
    assert "column 'age': 7 row(s) outside integers 0..9" in found.output
    assert "e.g. 99 (7 rows)" in found.output
    missing = runner.invoke(app, ["check", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2
    assert "exit" in runner.invoke(app, ["check", "--help"]).output.lower()


def tree(root: Path) -> set[tuple[str, int]]:
    return {(str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*")}


def test_cli_runs_without_prefect_and_writes_nothing(tmp_path: Path) -> None:
    """A subprocess, so no other test has imported prefect: the command must not import it, and
    nothing may appear under the working directory, ``DPRELEASE_HOME`` or ``HOME``."""
    table = replaced(clean_table(), "age", range(3), None)
    spec = spec_file(tmp_path, table)
    (tmp_path / "home").mkdir()
    before = tree(tmp_path)
    probe = (
        "import sys\n"
        "from dprelease.flows.cli import app\n"
        "try:\n"
        f"    app(['check', {str(spec)!r}])\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prefect', 'great_expectations'))\n"
        "print('EXIT', code, 'LOADED', loaded)\n"
    )
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "DPRELEASE_HOME": str(tmp_path / "home" / ".dprelease"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("PREFECT_HOME", None)
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "EXIT 3 LOADED []" in done.stdout, done.stdout + done.stderr
    assert "3 null row(s)" in done.stdout
    assert tree(tmp_path) == before
