"""LRM and the optimised templates through the release stages (no Prefect), with zero noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.spec.load import parse_spec


def _release(tmp_path: Path, mechanism: str, privacy: dict) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(11)  # public randomness: synthetic test data
    values = rng.integers(0, 32, 400)
    source = tmp_path / "d.parquet"
    pq.write_table(pa.table({"v": pa.array(values, pa.int16())}), source)
    budget = {"epsilon": 5} if "epsilon" in privacy else {"rho": 5}
    spec = parse_spec(
        {
            "name": "m",
            "dataset": {"id": f"m-{mechanism}", "source": str(source), "budget": budget},
            "domain": {"v": {"min": 0, "max": 31}},
            "workload": [
                {"name": "cdf", "prefix": "v"},
                {"name": "pairs", "ranges": {"v": [[0, 15], [16, 31]]}},
            ],
            "mechanism": mechanism,
            "privacy": privacy,
        }
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    release.register(spec, plan, catalog, release_id=release_id)
    ingested = release.ingest(spec, plan, catalog)
    measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
    tables = release.reconstruct(spec, plan, measurement)
    counts = np.bincount(values, minlength=32)
    return {name: t["estimate"].to_numpy() for name, t in tables.items()}, counts


@pytest.mark.parametrize(
    ("mechanism", "privacy", "tolerance"),
    [
        ("lrm", {"epsilon": 1.0}, 1e-7),  # least squares from [L; appended rows]: unbiased
        ("optimized", {"rho": 0.5}, 1e-8),
        ("optimized", {"epsilon": 1.0}, 1e-8),
        ("eigen", {"rho": 0.5}, 1e-7),
        ("eigen", {"epsilon": 1.0}, 1e-7),
    ],
    ids=["lrm", "optimized-gaussian", "optimized-laplace", "eigen-gaussian", "eigen-laplace"],
)
def test_zero_noise_release_answers_the_workload(
    tmp_path: Path, zero_noise, mechanism: str, privacy: dict, tolerance: float
) -> None:
    answers, counts = _release(tmp_path, mechanism, privacy)
    np.testing.assert_allclose(answers["cdf"], np.cumsum(counts), atol=tolerance)
    np.testing.assert_allclose(
        answers["pairs"], [counts[:16].sum(), counts[16:].sum()], atol=tolerance
    )
