"""Releases on a real Dask cluster (``dask scheduler`` + two ``dask worker`` processes on loopback):
``engine: dask`` counts exactly the true cells ``engine: local`` counts, on hive-partitioned data,
through the flow, the CLI (``--engine dask --address``) and a LocalCluster started for the run.

Test hook: the readers in ``catalog.confidential.inputs.READERS`` are wrapped (this test only, via
monkeypatch) to keep the ``Ingested`` object; the true cells are looked at here, before noise,
through the choke point's private attribute.  Nothing outside the test sees them.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dprelease.catalog.confidential import inputs
from dprelease.catalog.engine import Execution
from dprelease.flows.cli import app
from tests.flows.conftest import write_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


@pytest.fixture
def hive_dataset(tmp_path: Path) -> Path:
    """``b=x|y|z/part-K.parquet``: 600 rows, partitioned by the string attribute ``b``."""
    rng = np.random.default_rng(11)  # public randomness: synthetic test data
    root = tmp_path / "hive"
    for b in "xyz":
        for k in range(2):
            folder = root / f"b={b}"
            folder.mkdir(parents=True, exist_ok=True)
            table = pa.table(
                {
                    "a": pa.array(rng.integers(0, 10, 100), pa.int16()),
                    "c": pa.array(rng.integers(0, 4, 100), pa.int8()),
                }
            )
            pq.write_table(table, folder / f"part-{k}.parquet")
    return root


@pytest.fixture
def true_cells(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """Every run's true cell vector, recorded at ingest (before noise); test only."""
    recorded: list[np.ndarray] = []
    read = inputs.READERS["cells"]

    def recording(spec: Any, plan: Any, key: Any) -> inputs.Ingested:
        ingested = read(spec, plan, key)
        recorded.append(vars(ingested.data)["_ProtectedCells__cells"].copy())
        return ingested

    monkeypatch.setitem(inputs.READERS, "cells", recording)
    return recorded


def _spec(tmp_path: Path, source: Path, **execution: Any) -> Path:
    return write_spec(
        tmp_path,
        source,
        mechanism="hierarchical",
        dataset={
            "id": "hive-" + tmp_path.name[-12:],
            "source": str(source),
            "budget": {"epsilon": 5.0},
        },
        **({"execution": execution} if execution else {}),
    )


def _expected(source: Path) -> np.ndarray:
    """Independent reference: numpy counts straight from the rows (``b`` from the folder names)."""
    expected = np.zeros((10, 3, 4))
    for index, b in enumerate("xyz"):
        for part in sorted((source / f"b={b}").glob("*.parquet")):
            table = pq.read_table(part)
            np.add.at(expected, (table["a"].to_numpy(), index, table["c"].to_numpy()), 1)
    return expected.ravel()


def test_dask_release_counts_exactly_what_local_counts(
    tmp_path: Path, hive_dataset: Path, dask_address: str, true_cells: list[np.ndarray]
) -> None:
    from dprelease.flows.release_flow import release_flow, run_release

    spec_path = _spec(tmp_path, hive_dataset)
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    common = {"spec_path": str(spec_path), "out_dir": str(tmp_path / "out")}
    local = release_flow(**common, catalog_url=catalog_url)
    on_cluster = run_release(
        **common,
        catalog_url=catalog_url,
        execution=Execution(engine="dask", address=dask_address),
    )
    assert len(true_cells) == 2
    np.testing.assert_array_equal(true_cells[1], true_cells[0])
    np.testing.assert_array_equal(true_cells[0], _expected(hive_dataset))
    manifest = json.loads((Path(on_cluster.directory) / "manifest.json").read_text())
    assert manifest["spec"]["execution"] == {"engine": "dask", "address": dask_address}
    assert json.loads((Path(local.directory) / "manifest.json").read_text())["spec"][
        "execution"
    ] == {"engine": "local", "address": None}


def test_cli_run_with_engine_dask_and_address(
    tmp_path: Path, hive_dataset: Path, dask_address: str, true_cells: list[np.ndarray]
) -> None:
    spec_path = _spec(tmp_path, hive_dataset)  # the spec says local: the CLI wins
    result = CliRunner().invoke(
        app,
        [
            "run",
            str(spec_path),
            "--out",
            str(tmp_path / "out"),
            "--engine",
            "dask",
            "--address",
            dask_address,
        ],
    )
    assert result.exit_code == 0, result.output
    release_id = result.stdout.split("release id:")[1].split()[0]
    manifest = json.loads((tmp_path / "out" / release_id / "manifest.json").read_text())
    assert manifest["spec"]["execution"]["engine"] == "dask"
    np.testing.assert_array_equal(true_cells[0], _expected(hive_dataset))


def test_cli_refuses_an_address_with_engine_local(tmp_path: Path, hive_dataset: Path) -> None:
    spec_path = _spec(tmp_path, hive_dataset)
    result = CliRunner().invoke(
        app, ["run", str(spec_path), "--engine", "local", "--address", "tcp://127.0.0.1:1"]
    )
    assert result.exit_code != 0
    assert "needs execution.engine: dask" in result.output


def test_spec_engine_dask_without_address_starts_a_local_cluster(
    tmp_path: Path,
    hive_dataset: Path,
    true_cells: list[np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dprelease.catalog import engine
    from dprelease.flows.release_flow import run_release

    monkeypatch.setattr(engine, "local_cluster_size", lambda: (2, 1 << 30))
    spec_path = _spec(tmp_path, hive_dataset, engine="dask")
    staged = run_release(
        spec_path=str(spec_path),
        out_dir=str(tmp_path / "out"),
        catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}",
        execution=Execution(engine="dask"),
    )
    manifest = json.loads((Path(staged.directory) / "manifest.json").read_text())
    assert manifest["spec"]["execution"]["address"].startswith("tcp://127.0.0.1:")
    np.testing.assert_array_equal(true_cells[0], _expected(hive_dataset))


WIDE = [f"w{i:02d}" for i in range(25)]


@pytest.fixture
def wide_dataset(tmp_path: Path) -> Path:
    """Three files of 25 integer columns 0..9 (10²⁵ cells): 2,400 rows."""
    rng = np.random.default_rng(12)  # public randomness: synthetic test data
    root = tmp_path / "wide"
    root.mkdir()
    for k in range(3):
        columns = {name: pa.array(rng.integers(0, 10, 800), pa.int8()) for name in WIDE}
        pq.write_table(pa.table(columns), root / f"part-{k}.parquet", row_group_size=300)
    return root


@pytest.fixture
def true_marginals(monkeypatch: pytest.MonkeyPatch) -> list[dict[tuple[int, ...], np.ndarray]]:
    """Every run's true marginal tables, recorded at ingest (before noise); test only."""
    recorded: list[dict[tuple[int, ...], np.ndarray]] = []
    read = inputs.READERS["marginals"]

    def recording(spec: Any, plan: Any, key: Any) -> inputs.Ingested:
        ingested = read(spec, plan, key)
        tables = vars(ingested.data)["_ProtectedMarginals__tables"]
        recorded.append({axes: table.copy() for axes, table in tables.items()})
        return ingested

    monkeypatch.setitem(inputs.READERS, "marginals", recording)
    return recorded


def test_dask_counts_the_marginals_of_a_1e25_cell_domain_exactly_as_local(
    tmp_path: Path,
    wide_dataset: Path,
    dask_address: str,
    true_marginals: list[dict[tuple[int, ...], np.ndarray]],
) -> None:
    """All 1- and 2-way marginals of 25 attributes (325 tables, 10²⁵ cells: no cell vector and no
    int64 index over the domain can exist): ``engine: dask`` counts exactly the tables ``engine:
    local`` counts, and both equal numpy's count of the rows."""
    from dprelease.flows.release_flow import release_flow, run_release

    spec_path = write_spec(
        tmp_path,
        wide_dataset,
        dataset={
            "id": "wide-" + tmp_path.name[-12:],
            "source": str(wide_dataset),
            "budget": {"rho": 5.0},
        },
        domain={name: {"min": 0, "max": 9} for name in WIDE},
        workload=[
            {"name": f"way{k}", "marginals": {"attributes": "all", "degree": k}} for k in (1, 2)
        ],
        mechanism="marginal_space",
        privacy={"rho": 0.5},
    )
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    common = {"spec_path": str(spec_path), "out_dir": str(tmp_path / "out")}
    release_flow(**common, catalog_url=catalog_url)
    run_release(
        **common,
        catalog_url=catalog_url,
        execution=Execution(engine="dask", address=dask_address),
    )
    assert len(true_marginals) == 2
    local, on_cluster = true_marginals
    pairs = set(itertools.combinations(range(len(WIDE)), 2))
    assert list(on_cluster) == list(local) and pairs <= set(local)
    rows = np.stack(
        [
            np.concatenate(
                [pq.read_table(part)[name].to_numpy() for part in sorted(wide_dataset.iterdir())]
            )
            for name in WIDE
        ]
    ).astype(np.int64)
    for axes, table in local.items():
        np.testing.assert_array_equal(on_cluster[axes], table)
        expected = np.zeros((10,) * len(axes))  # independent reference
        if axes:
            np.add.at(expected, tuple(rows[a] for a in axes), 1)
        else:
            expected += rows.shape[1]
        np.testing.assert_array_equal(table, expected)
