"""A series on the other back ends: periods counted on a real Dask cluster (``engine: dask``)
publish exactly what the local reader publishes (zero-noise oracle), including a period counted
locally and re-read on the cluster (its recorded keyed fingerprint agrees); and the whole period
chain (plan, per-partition charges, records, staging, publication, verify) on a real PostgreSQL
catalog next to SQLite (``catalog_url``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dprelease.catalog.engine import Execution
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.review.decisions import review
from dprelease.catalog.series_audit import recorded_plans, verify_release_and_series
from tests.unit.catalog.test_series_report import run_period, series_spec, write_period


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))


def _tables(directory: Path) -> dict[str, Any]:
    return {
        path.stem: pq.read_table(path).to_pydict()
        for path in sorted((directory / "tables").glob("*.parquet"))
    }


def test_a_series_counted_on_dask_publishes_what_the_local_reader_publishes(
    tmp_path: Path, dask_address: str, zero_noise: Any
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    local_spec = series_spec(data)
    on_dask = local_spec.model_copy(
        update={"execution": Execution(engine="dask", address=dask_address)}
    )
    local = Catalog(f"sqlite:///{tmp_path / 'local.db'}")
    mixed = Catalog(f"sqlite:///{tmp_path / 'mixed.db'}")
    for period, spec in ((1, local_spec), (2, on_dask), (3, on_dask)):
        write_period(data, period)
        expected = run_period(local_spec, local, tmp_path / "local")
        got = run_period(spec, mixed, tmp_path / "mixed")
        assert _tables(got) == _tables(expected), period
    assert (
        recorded_plans(mixed, "monthly")[0].digest() == recorded_plans(local, "monthly")[0].digest()
    )
    charges = [
        [(e.partition, e.cost.rho) for e in c.ledger_entries("monthly") if e.kind == "charge"]
        for c in (local, mixed)
    ]
    assert charges[0] == charges[1]


def test_a_series_runs_end_to_end_on_each_catalog_backend(tmp_path: Path, catalog_url: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    catalog = Catalog(catalog_url)
    spec = series_spec(data, horizon=2)
    for period in (1, 2):
        write_period(data, period)
        staged = run_period(spec, catalog, tmp_path / "out")
        done = review(catalog, staged.name, approve=True, reviewer="Ada", note="checked")
        published = Path(done["published_directory"])
        assert verify_release_and_series(published, catalog) == []
    spending = catalog.partition_spending("monthly")
    assert sorted(p.partition for p in spending) == ["2026-01.parquet", "2026-02.parquet"]
    assert all(0 < p.spent.rho <= 0.5 + 1e-12 for p in spending)
    assert catalog.verify_chain() == []
