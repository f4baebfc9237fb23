"""DAWA through the release flow: partition cached with its receipt, both steps on the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


def _data(path: Path, seed: int, *, two_d: bool) -> Path:
    rng = np.random.default_rng(seed)  # public randomness: synthetic, clustered test data
    values = np.concatenate([rng.integers(10, 14, 300), rng.integers(40, 42, 200)])
    columns = {"v": pa.array(values, pa.int32())}
    if two_d:
        columns["w"] = pa.array(rng.integers(0, 6, values.size), pa.int32())
    pq.write_table(pa.table(columns), path)
    return path


def _spec(tmp_path: Path, source: Path, *, dataset: str, two_d: bool = False) -> Path:
    domain = {"v": {"min": 0, "max": 63}}
    workload = [
        {"name": "v_ranges", "all_ranges": ["v"]},
        {"name": "v_cdf", "prefix": "v"},
        {"name": "everyone", "total": True},
    ]
    if two_d:
        domain["w"] = {"min": 0, "max": 5}
        workload = [
            {"name": "cells", "marginal": ["v", "w"]},
            {"name": "rectangles", "all_ranges": ["w"]},
            {"name": "everyone", "total": True},
        ]
    spec = {
        "name": "dawa-test",
        "dataset": {"id": dataset, "source": str(source), "budget": {"epsilon": 10}},
        "domain": domain,
        "workload": workload,
        "mechanism": "dawa",
        "privacy": {"epsilon": 1.0},
    }
    path = tmp_path / f"spec-{dataset}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_dawa_release_reuses_its_partition_and_pays_once(tmp_path: Path, zero_noise) -> None:
    from dprelease.flows.release_flow import release_flow

    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    dataset = "dawa-" + tmp_path.name[-10:]
    source = _data(tmp_path / "a.parquet", 1, two_d=False)
    spec = _spec(tmp_path, source, dataset=dataset)
    first = release_flow(
        spec_path=str(spec), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    second = release_flow(
        spec_path=str(spec), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    catalog = Catalog(catalog_url)
    labels = [entry.label for entry in catalog.ledger_entries(dataset)]
    assert sum("partition" in label for label in labels) == 1  # step 1 paid once
    assert sum("GreedyH" in label for label in labels) == 2
    assert catalog.spent(dataset).epsilon == pytest.approx(0.25 + 0.75 + 0.75, abs=1e-6)
    first_manifest = json.loads((Path(first.directory) / "manifest.json").read_text())
    second_manifest = json.loads((Path(second.directory) / "manifest.json").read_text())
    assert first_manifest["mechanism"]["details"]["partition_reused"] is False
    assert second_manifest["mechanism"]["details"]["partition_reused"] is True
    assert (
        second_manifest["mechanism"]["details"]["boundaries"]
        == first_manifest["mechanism"]["details"]["boundaries"]
    )
    assert first.charged["epsilon"] == pytest.approx(1.0, abs=1e-6)
    assert second.charged["epsilon"] == pytest.approx(0.75, abs=1e-6)
    artifacts.verify(Path(second.directory), catalog)  # a reused receipt verifies
    # zero noise: bucket totals are exact, so the total query is exact
    total = pq.read_table(Path(first.directory) / "tables" / "everyone.parquet")["estimate"]
    assert total.to_pylist() == pytest.approx([500.0])
    assert "released partition" in (Path(first.directory) / "report.html").read_text()

    # different input: the cache misses and step 1 is paid again
    other = _data(tmp_path / "b.parquet", 2, two_d=False)
    release_flow(
        spec_path=str(_spec(tmp_path, other, dataset=dataset)),
        out_dir=str(tmp_path / "out"),
        catalog_url=catalog_url,
    )
    labels = [entry.label for entry in catalog.ledger_entries(dataset)]
    assert sum("partition" in label for label in labels) == 2


def test_dawa_two_dimensional_release(tmp_path: Path, zero_noise) -> None:
    from dprelease.flows.release_flow import release_flow

    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    source = _data(tmp_path / "c.parquet", 3, two_d=True)
    spec = _spec(tmp_path, source, dataset="dawa2d-" + tmp_path.name[-8:], two_d=True)
    staged = release_flow(
        spec_path=str(spec), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    table = pq.read_table(Path(staged.directory) / "tables" / "cells.parquet")
    assert table.num_rows == 64 * 6
    assert table["estimate"].to_numpy().sum() == pytest.approx(500.0)
    assert (table["std_error"].to_numpy() > 0).all()
