"""A series whose periods are a column's values through `dprelease plan`, `run`, `verify`,
`show` and `budget` (real Prefect server): one Parquet file re-exported with one more month each
time; each run releases the next declared month, charges each month it reads its own partition
``month=<value>``, and leaves every earlier release's published files byte-identical; a re-export
that changed a released month and a run past the horizon exit 2 charging nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dprelease.catalog.ledger.store import Catalog
from dprelease.flows.cli import app
from tests.unit.catalog.test_series_columns import month_rows
from tests.unit.catalog.test_spec_series import MONTHS, raw_column_series

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]
runner = CliRunner()


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*.parquet"))
    }


def test_a_column_series_releases_month_by_month_from_one_re_exported_file(
    tmp_path: Path,
) -> None:
    source = tmp_path / "export.parquet"
    raw = raw_column_series()
    dataset_id = "months-" + tmp_path.name[-12:]
    raw["dataset"] |= {"id": dataset_id, "source": str(source)}
    raw["series"]["time_workload"] = ["period", "cumulative"]
    spec_path = tmp_path / "series.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    planned = runner.invoke(app, ["plan", str(spec_path)])
    assert planned.exit_code == 0 and "3 (2026-03)" in planned.output, planned.output
    out = tmp_path / "out"
    months: list[pa.Table] = []
    released: dict[Path, dict[str, str]] = {}
    for period, month in enumerate(MONTHS, start=1):
        months.append(month_rows(month, seed=period))
        if period == 3:  # first a re-export that changed one row of released month 1: refused
            _refused_changed_month(spec_path, source, months, out, dataset_id)
        pq.write_table(pa.concat_tables(months), source)  # the whole export, one month more
        before = len(Catalog().ledger_entries(dataset_id)) if period > 1 else 0
        result = runner.invoke(app, ["run", str(spec_path), "--out", str(out)])
        assert result.exit_code == 0, result.output
        directory = out / result.stdout.split("release id:")[1].split()[0]
        manifest = json.loads((directory / "manifest.json").read_text())
        details = manifest["mechanism"]["details"]["series"]
        assert (details["period"], details["period_value"]) == (period, month)
        charges = [e for e in Catalog().ledger_entries(dataset_id)[before:] if e.kind == "charge"]
        assert [e.partition for e in charges] == [f"month={m}" for m in MONTHS[:period]]
        assert {e.partition: e.cost.rho for e in charges} == details["charges"]
        assert manifest["partitions"]["charged"] == [f"month={m}" for m in MONTHS[:period]]
        assert runner.invoke(app, ["verify", str(directory)]).exit_code == 0
        released[directory] = _digests(directory)
        for earlier, digests in released.items():  # published figures never change
            assert _digests(earlier) == digests
    shown = runner.invoke(app, ["show", directory.name])
    assert shown.exit_code == 0 and "period 3 of 3 (month=2026-03;" in " ".join(
        shown.output.split()
    )
    spending = Catalog().partition_spending(dataset_id)
    assert [p.partition for p in spending] == [f"month={m}" for m in MONTHS]
    assert all(p.spent.rho <= 0.5 + 1e-12 for p in spending)
    count = len(Catalog().ledger_entries(dataset_id))
    past = runner.invoke(app, ["run", str(spec_path), "--out", str(out)])
    assert past.exit_code == 2 and "horizon of 3 periods" in past.output
    assert len(Catalog().ledger_entries(dataset_id)) == count
    budget = runner.invoke(app, ["budget", dataset_id])
    assert budget.exit_code == 0 and "month=2026-01" in budget.output


def _refused_changed_month(
    spec_path: Path, source: Path, months: list[pa.Table], out: Path, dataset_id: str
) -> None:
    regions = months[0]["region"].to_pylist()
    regions[0] = "n" if regions[0] != "n" else "s"
    changed = months[0].set_column(1, "region", pa.array(regions))
    pq.write_table(pa.concat_tables([changed, *months[1:]]), source)
    count = len(Catalog().ledger_entries(dataset_id))
    refused = runner.invoke(app, ["run", str(spec_path), "--out", str(out)])
    assert refused.exit_code == 2, refused.output
    assert "released period 1 (2026-01) in column 'month' changed" in " ".join(
        refused.output.split()
    )
    assert len(Catalog().ledger_entries(dataset_id)) == count  # nothing charged
