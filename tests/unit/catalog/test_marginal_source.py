"""Counting only the needed marginals from Parquet: the same rows, checks and bounding as the
cell-vector path, the same keyed fingerprint, refusals that name sizes and rules only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.confidential import marginal_source
from dprelease.catalog.confidential.marginal_source import check_marginals_runnable, count_marginals
from dprelease.catalog.confidential.source import count_cells
from dprelease.catalog.errors import DataError, SpecError
from dprelease.catalog.keys import catalog_key
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms.marginal_space import marginal_of

SUBSETS = [(), (0,), (0, 1), (1, 2), (0, 1, 2)]


def _spec(source: Path | None, **changes: Any):
    raw: dict[str, Any] = {
        "name": "t",
        "dataset": {"id": "t", "budget": {"epsilon": 10.0}},
        "domain": {
            "a": {"min": 0, "max": 3},
            "b": {"values": ["x", "y", "z"]},
            "c": {"bins": [0.0, 10.0, 20.0]},
        },
        "workload": [{"name": "pairs", "marginals": {"attributes": "all", "degree": 2}}],
        "privacy": {"epsilon": 1.0},
        **changes,
    }
    if source is not None:
        raw["dataset"]["source"] = str(source)
    return parse_spec(raw)


def _write(path: Path, **columns: list[Any]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def _random_source(tmp_path: Path, rng: np.random.Generator, size: int) -> Path:
    """Synthetic rows in the domain of :func:`_spec`, with a person id column."""
    return _write(
        tmp_path / "d.parquet",
        a=rng.integers(0, 4, size).tolist(),
        b=rng.choice(["x", "y", "z"], size).tolist(),
        c=rng.uniform(0, 20, size).tolist(),
        pid=rng.integers(0, 100, size).tolist(),
    )


def _tables(protected) -> dict[tuple[int, ...], np.ndarray]:
    return dict(vars(protected)["_ProtectedMarginals__tables"])  # test-only look inside


def _cells(protected) -> np.ndarray:
    return vars(protected)["_ProtectedCells__cells"]  # test-only look inside


def test_marginals_equal_those_of_the_cell_vector(tmp_path: Path, rng: np.random.Generator) -> None:
    source = _random_source(tmp_path, rng, 500)
    for unit in ({"rows_per_person": 1}, {"person_column": "pid", "max_rows": 2}):
        spec = _spec(source, privacy_unit=unit)
        key = catalog_key(f"sqlite:///{tmp_path / 'catalog.db'}")
        counted = count_marginals(spec, subsets=SUBSETS, output_rows=10, key=key)
        cells = count_cells(spec, key=key)
        assert counted.input_fingerprint == cells.input_fingerprint
        assert counted.files == cells.files
        x = _cells(cells.cells)
        tables = _tables(counted.marginals)
        assert set(tables) == set(SUBSETS)
        for axes in SUBSETS:
            np.testing.assert_array_equal(tables[axes], marginal_of(x, spec.domain_shape, axes))
        assert counted.marginals.contribution_bound == spec.privacy_unit.contribution_bound


def test_out_of_domain_rows_are_refused_or_dropped_from_every_marginal(tmp_path: Path) -> None:
    source = _write(
        tmp_path / "d.parquet", a=[0, 1, 9, 2], b=["x", "y", "y", None], c=[1.0, 11.0, 5.0, 5.0]
    )
    with pytest.raises(DataError, match=r"column 'a' has values outside the public domain") as err:
        count_marginals(_spec(source), subsets=SUBSETS, output_rows=10)
    assert "9" not in str(err.value)
    spec = _spec(source, on_out_of_domain="drop")
    tables = _tables(count_marginals(spec, subsets=SUBSETS, output_rows=10).marginals)
    assert float(tables[()]) == 2.0  # only the rows valid in every attribute, in every table
    np.testing.assert_array_equal(tables[(0,)], [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(tables[(1, 2)], [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    nulls = _write(tmp_path / "n.parquet", a=[0, 1], b=["x", None], c=[1.0, 2.0])
    with pytest.raises(DataError, match=r"column 'b' has null values"):
        count_marginals(_spec(nulls), subsets=SUBSETS, output_rows=10)


def test_refusals_before_any_read_name_sizes_and_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SpecError, match=r"dataset\.source is not set"):
        check_marginals_runnable(_spec(None), subsets=SUBSETS, output_rows=10)
    missing = tmp_path / "never-read.parquet"  # refused before the file is looked at
    monkeypatch.setattr(marginal_source, "MAX_MARGINAL_CELLS", 30)
    with pytest.raises(SpecError, match=r"5 marginals of 47 cells together; .* at most 30"):
        count_marginals(_spec(missing), subsets=SUBSETS, output_rows=10)
    with pytest.raises(SpecError, match=r"output tables would have 300,000,000 rows"):
        check_marginals_runnable(_spec(missing), subsets=[(0,)], output_rows=300_000_000)
    with pytest.raises(DataError, match="matches no file"):
        count_marginals(_spec(missing), subsets=[(0,)], output_rows=10)


@pytest.mark.parametrize("privacy", [{"epsilon": 1.0}, {"rho": 0.5}], ids=["laplace", "gaussian"])
def test_zero_noise_release_stages_answer_every_marginal_exactly(
    tmp_path: Path, rng: np.random.Generator, zero_noise, privacy: dict[str, float]
) -> None:
    from dprelease.catalog import release
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.planning.planner import make_plan

    source = _random_source(tmp_path, rng, 300)
    budget = {"epsilon": 5.0} if "epsilon" in privacy else {"rho": 5.0}
    spec = _spec(source, mechanism="marginal_space", privacy=privacy)
    spec = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"budget": budget})})
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    release.register(spec, plan, catalog, release_id=release_id)
    ingested = release.ingest(spec, plan, catalog)
    assert "redacted" in repr(ingested.data)
    measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
    tables = release.reconstruct(spec, plan, measurement)
    x = _cells(count_cells(spec).cells)
    assert list(tables) == ["pairs.a.b", "pairs.a.c", "pairs.b.c"]
    for name, axes in zip(tables, [(0, 1), (0, 2), (1, 2)], strict=True):
        expected = marginal_of(x, spec.domain_shape, axes).ravel()
        np.testing.assert_allclose(tables[name]["estimate"].to_numpy(), expected, atol=1e-8)
    assert zero_noise.calls[0][0] == ("laplace" if "epsilon" in privacy else "gaussian")
