"""A series through `dprelease run`, one period per run (real Prefect server): each run charges
each period it reads its own increment, publishes its period's rows, verifies; earlier releases'
files never change; a period released twice and a period past the horizon exit 2 charging
nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dprelease.catalog.ledger.store import Catalog
from dprelease.flows.cli import app
from tests.unit.catalog.test_spec_series import raw_series_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]
runner = CliRunner()


def _write_period(folder: Path, period: int) -> None:
    rng = np.random.default_rng(period)  # public randomness: synthetic test data
    rows = 150
    table = pa.table({"region": rng.choice(["n", "s", "e"], rows), "age": rng.integers(0, 4, rows)})
    pq.write_table(table, folder / f"2026-{period:02d}.parquet")


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*.parquet"))
    }


def test_a_series_releases_period_by_period_and_refuses_twice_and_past_horizon(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    raw = raw_series_spec()
    raw["dataset"]["id"] = "series-" + tmp_path.name[-12:]
    raw["dataset"]["source"] = str(data)
    raw["series"] = {"period": "file", "horizon": 3, "time_workload": ["period", "cumulative"]}
    spec_path = tmp_path / "series.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    dataset_id = raw["dataset"]["id"]
    out = tmp_path / "out"
    released: dict[Path, dict[str, str]] = {}
    for period in (1, 2, 3):
        _write_period(data, period)
        before = len(Catalog().ledger_entries(dataset_id)) if period > 1 else 0
        result = runner.invoke(app, ["run", str(spec_path), "--out", str(out)])
        assert result.exit_code == 0, result.output
        directory = out / result.stdout.split("release id:")[1].split()[0]
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest["mechanism"]["details"]["series"]["period"] == period
        assert sorted(manifest["tables"]) == sorted(
            f"{item}.{part}" for item in ("by_region", "all") for part in ("period", "cumulative")
        )
        charges = [e for e in Catalog().ledger_entries(dataset_id)[before:] if e.kind == "charge"]
        assert [e.partition for e in charges] == [
            f"2026-{s:02d}.parquet" for s in range(1, period + 1)
        ]
        recorded = manifest["mechanism"]["details"]["series"]["charges"]
        assert {e.partition: e.cost.rho for e in charges} == recorded
        assert runner.invoke(app, ["verify", str(directory)]).exit_code == 0
        released[directory] = _digests(directory)
        for earlier, digests in released.items():  # published figures never change
            assert _digests(earlier) == digests
    spending = Catalog().partition_spending(dataset_id)
    assert len(spending) == 3 and all(p.spent.rho <= 0.5 + 1e-12 for p in spending)
    count = len(Catalog().ledger_entries(dataset_id))
    twice = runner.invoke(app, ["run", str(spec_path), "--out", str(out)])
    assert twice.exit_code == 2 and "already released as period 3" in twice.output
    _write_period(data, 4)
    past = runner.invoke(app, ["run", str(spec_path), "--out", str(out)])
    assert past.exit_code == 2 and "horizon of 3 periods" in past.output
    assert len(Catalog().ledger_entries(dataset_id)) == count
    budget = runner.invoke(app, ["budget", dataset_id])
    assert budget.exit_code == 0 and "2026-01.parquet" in budget.output
    as_json = runner.invoke(app, ["budget", dataset_id, "--json"])
    [entries] = [d["ledger"] for d in json.loads(as_json.output)["datasets"]]
    assert [e["kind"] for e in entries].count("series-plan") == 1
    shown = runner.invoke(app, ["show", directory.name])
    assert shown.exit_code == 0 and directory.name in shown.output, shown.output
