"""End to end through Prefect: all 91 two-way marginals of Adult's 14 attributes (6.4·10¹⁷ cells).

The bundled ``flows/examples/adult-marginals.yaml`` (``mechanism: auto``) goes through the one
release flow: auto must choose the marginal-space mechanism (the only one that can count this
domain), and with the zero-noise oracle every released table equals the exact marginal counted
independently here with pyarrow.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.spec.load import load_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]

EXAMPLES = Path(__file__).resolve().parents[2] / "flows" / "examples"


def test_all_two_way_marginals_of_adult_through_the_release_flow(
    tmp_path: Path, zero_noise
) -> None:
    from dprelease.flows.release_flow import release_flow

    spec_path = tmp_path / "adult-marginals.yaml"
    shutil.copy(EXAMPLES / "adult-marginals.yaml", spec_path)
    shutil.copy(EXAMPLES / "adult.parquet", tmp_path / "adult.parquet")
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    staged = release_flow(
        spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    directory = Path(staged.directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    spec = load_spec(spec_path)
    assert spec.num_cells > 10**17
    parts = spec.expanded_workload()
    assert len(parts) == 91 and manifest["tables"] == [part.name for part in parts]
    assert staged.mechanism == manifest["mechanism"]["name"]
    chosen = next(c for c in manifest["plan"]["candidates"] if c["mechanism"] == staged.mechanism)
    assert chosen["status"] == "planned"
    assert all(
        c["status"] != "planned"
        for c in manifest["plan"]["candidates"]
        if c["mechanism"] != staged.mechanism
    )
    assert manifest["privacy"]["charged"]["epsilon"] <= 1.0
    assert zero_noise.calls and zero_noise.calls[0][0] == "laplace"

    data = pq.read_table(tmp_path / "adult.parquet")
    names = list(spec.domain)
    for part in parts:
        a, b = part.marginal
        n_a, n_b = spec.domain[a].size, spec.domain[b].size
        codes = data[a].to_numpy().astype(np.int64) * n_b + data[b].to_numpy().astype(np.int64)
        exact = np.bincount(codes, minlength=n_a * n_b)
        table = pq.read_table(directory / "tables" / f"{part.name}.parquet")
        assert table.column_names[:3] == [a, b, "estimate"] and "std_error" in table.column_names
        assert names.index(a) < names.index(b)
        np.testing.assert_allclose(
            table["estimate"].to_numpy(), exact, atol=1e-6, err_msg=part.name
        )
        std_error = table["std_error"].to_numpy()
        assert (std_error > 0).all() and np.ptp(std_error) <= 1e-9 * std_error.max()

    catalog = Catalog(catalog_url)
    assert catalog.release(staged.release_id).status == "staged"
    artifacts.verify(directory, catalog)
