"""Adding a mechanism = one module + one registry line: a toy mechanism, registered here and
nowhere else, runs end to end through the one release flow (spec, plan, ledger, noise, manifest,
report, verify) without any change to ``catalog/`` or ``flows/``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.mechanisms import registry
from dprelease.mechanisms.primitives.operators import MatrixFactor
from dprelease.mechanisms.primitives.protocol import MatrixMechanism, PlanRequest, StrategyCache
from dprelease.mechanisms.primitives.strategies import KronStrategy
from tests.flows.conftest import write_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


class DoubledIdentity(MatrixMechanism):
    """Measures 2·x for every cell: sensitivity 2, so twice the noise scale of ``identity``."""

    name = "toy-doubled-identity"
    summary = "every cell, doubled (a test of the registry)"

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> KronStrategy:
        factors = tuple(
            MatrixFactor((2.0 if axis == 0 else 1.0) * sp.identity(n, format="csr"))
            for axis, n in enumerate(request.workload.domain_shape)
        )
        return KronStrategy(name=self.name, factors=factors, parameters={"scale": 2.0})


@pytest.fixture
def toy() -> Iterator[DoubledIdentity]:
    mechanism = DoubledIdentity()
    registry.register(mechanism)
    try:
        yield mechanism
    finally:
        registry.unregister(mechanism)


def test_a_registered_toy_mechanism_runs_end_to_end(
    tmp_path: Path, tiny_dataset: Path, zero_noise, toy: DoubledIdentity
) -> None:
    from dprelease.flows.release_flow import release_flow

    spec_path = write_spec(tmp_path, tiny_dataset, mechanism=toy.name)
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    staged = release_flow(
        spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    directory = Path(staged.directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["mechanism"]["name"] == toy.name
    assert manifest["mechanism"]["noise"]["sensitivity"] == pytest.approx(2.0)
    assert manifest["plan"]["candidates"][0]["mechanism"] == toy.name
    catalog = Catalog(catalog_url)
    (entry,) = catalog.ledger_entries(manifest["dataset_id"])
    assert toy.name in entry.label
    table = pq.read_table(directory / "tables" / "everyone.parquet")
    assert table["estimate"].to_numpy() == pytest.approx(np.array([500.0]))  # zero noise: exact
    assert toy.name in (directory / "report.html").read_text()
    artifacts.verify(directory, catalog)


def test_a_registered_name_is_unique_per_model(toy: DoubledIdentity) -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(DoubledIdentity())
    with pytest.raises(ValueError, match="cannot be unregistered"):
        registry.unregister(registry.get("identity", model="central"))
