"""Counting on a real Dask cluster (scheduler + two worker processes started by the ``dask`` CLI):
exactly the counts and the refusals of the local path, on hive-partitioned data.

The true counts are looked at in the test only (``vars(...)`` of the choke point objects).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.confidential.dask_count import count_cells_dask, count_marginals_dask
from dprelease.catalog.confidential.marginal_source import count_marginals
from dprelease.catalog.confidential.source import count_cells
from dprelease.catalog.errors import DataError, SpecError
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec

DOMAIN: dict[str, Any] = {
    "region": {"values": ["n", "s", "e"]},
    "age": {"min": 0, "max": 9},
    "hours": {"bins": [0.0, 20.0, 40.0, 100.0]},
}


def _cells(protected: Any) -> np.ndarray:
    return vars(protected)["_ProtectedCells__cells"]  # test-only look inside


def _tables(protected: Any) -> dict[tuple[int, ...], np.ndarray]:
    return dict(vars(protected)["_ProtectedMarginals__tables"])  # test-only look inside


def _spec(source: Path, address: str, **top: Any) -> ReleaseSpec:
    return parse_spec(
        {
            "name": "t",
            "dataset": {"id": "ds", "source": str(source), "budget": {"epsilon": 10.0}},
            "domain": DOMAIN,
            "workload": [{"name": "all", "marginal": list(DOMAIN)}],
            "privacy": {"epsilon": 1.0},
            "execution": {"engine": "dask", "address": address},
            **top,
        }
    )


def _local(spec: ReleaseSpec) -> ReleaseSpec:
    return spec.model_copy(
        update={"execution": spec.execution.model_copy(update={"engine": "local", "address": None})}
    )


def _refused_alike(spec: ReleaseSpec, *, match: str) -> str:
    """Both paths refuse ``spec`` with the same DataError; returns its message."""
    with pytest.raises(DataError) as local_error:
        count_cells(_local(spec))
    with pytest.raises(DataError, match=match) as dask_error:
        count_cells_dask(spec)
    assert str(dask_error.value) == str(local_error.value)
    return str(dask_error.value)


def _hive(
    root: Path,
    rng: np.random.Generator,
    *,
    rows: int = 3000,
    regions: tuple[str, ...] = ("n", "s", "e"),
    files_per_region: int = 3,
    persons: bool = False,
) -> Path:
    """``root/region=R/part-K.parquet``; with ``persons``, every person id lives in one file."""
    person = 0
    for region in regions:
        for k in range(files_per_region):
            n = rows // (len(regions) * files_per_region)
            columns: dict[str, Any] = {
                "age": pa.array(rng.integers(0, 10, n), pa.int32()),
                "hours": pa.array(rng.uniform(0.0, 100.0, n)),
            }
            if persons:
                ids = person + rng.integers(0, n // 3, n)
                person += n
                columns["pid"] = pa.array(ids, pa.int64())
            folder = root / f"region={region}"
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table(columns), folder / f"part-{k}.parquet", row_group_size=97)
    return root


def test_cells_equal_local_on_hive_partitions(
    tmp_path: Path, rng: np.random.Generator, dask_address: str
) -> None:
    spec = _spec(_hive(tmp_path / "d", rng), dask_address)
    local = count_cells(_local(spec))
    dask = count_cells_dask(spec)
    np.testing.assert_array_equal(_cells(dask.cells), _cells(local.cells))
    assert _cells(dask.cells).sum() == 2997
    assert dask.input_fingerprint == local.input_fingerprint
    assert dask.files == local.files


def test_person_bounding_equals_local_when_colocated(
    tmp_path: Path, rng: np.random.Generator, dask_address: str
) -> None:
    unit = {"person_column": "pid", "max_rows": 2, "persons_colocated": True}
    spec = _spec(_hive(tmp_path / "d", rng, persons=True), dask_address, privacy_unit=unit)
    local = _cells(count_cells(_local(spec)).cells)
    dask = _cells(count_cells_dask(spec).cells)
    np.testing.assert_array_equal(dask, local)
    assert dask.sum() < 2997  # bounding dropped rows (power: not a no-op)


def test_person_column_without_colocation_is_refused(
    tmp_path: Path, rng: np.random.Generator, dask_address: str
) -> None:
    unit = {"person_column": "pid", "max_rows": 2}
    spec = _spec(_hive(tmp_path / "d", rng, persons=True), dask_address, privacy_unit=unit)
    with pytest.raises(SpecError, match=r"persons_colocated: true.*engine: local"):
        count_cells_dask(spec)


def test_persons_colocated_needs_a_person_column() -> None:
    with pytest.raises(SpecError, match="persons_colocated needs person_column"):
        parse_spec(
            {
                "name": "t",
                "dataset": {"id": "ds", "budget": {"epsilon": 1.0}},
                "privacy_unit": {"rows_per_person": 1, "persons_colocated": True},
                "domain": DOMAIN,
                "workload": [{"name": "all", "marginal": ["age"]}],
                "privacy": {"epsilon": 1.0},
            }
        )


def test_marginals_equal_local(tmp_path: Path, rng: np.random.Generator, dask_address: str) -> None:
    spec = _spec(_hive(tmp_path / "d", rng), dask_address)
    subsets = [(), (0,), (1, 2), (0, 1, 2)]
    local = _tables(count_marginals(_local(spec), subsets=subsets, output_rows=10).marginals)
    dask = _tables(count_marginals_dask(spec, subsets=subsets, output_rows=10).marginals)
    assert local.keys() == dask.keys()
    for axes in local:
        np.testing.assert_array_equal(dask[axes], local[axes])


def test_out_of_domain_partition_pruned_with_drop_refused_with_error(
    tmp_path: Path, rng: np.random.Generator, dask_address: str
) -> None:
    root = _hive(tmp_path / "d", rng, regions=("n", "s", "west"))
    dropped = _spec(root, dask_address, on_out_of_domain="drop")
    np.testing.assert_array_equal(
        _cells(count_cells_dask(dropped).cells), _cells(count_cells(_local(dropped)).cells)
    )
    message = _refused_alike(_spec(root, dask_address), match="'region'")
    assert "west" not in message


def test_nulls_raise_the_local_error_first_in_domain_order(
    tmp_path: Path, rng: np.random.Generator, dask_address: str
) -> None:
    root = _hive(tmp_path / "d", rng)
    # one file has an out-of-domain hours value, another a null age: local names age first
    pq.write_table(
        pa.table({"age": pa.array([1], pa.int32()), "hours": [500.0]}),
        root / "region=n" / "x.parquet",
    )
    pq.write_table(
        pa.table({"age": pa.array([None], pa.int32()), "hours": [5.0]}),
        root / "region=s" / "y.parquet",
    )
    _refused_alike(_spec(root, dask_address), match="'age' has null values")


def test_empty_input_is_refused_like_local(tmp_path: Path, dask_address: str) -> None:
    folder = tmp_path / "d" / "region=n"
    folder.mkdir(parents=True)
    pq.write_table(
        pa.table({"age": pa.array([], pa.int32()), "hours": pa.array([], pa.float64())}),
        folder / "a.parquet",
    )
    spec = _spec(tmp_path / "d", dask_address)
    with pytest.raises(DataError, match="has no rows"):
        count_cells_dask(spec)


@pytest.mark.parametrize("size", [7, 1000, 100_000])
def test_sparse_partial_cells_equal_dense_bincount(
    size: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dprelease.catalog.confidential import dask_count

    monkeypatch.setattr(dask_count, "COMPACT_ENTRIES", 50)  # exercise compaction too
    partial = dask_count.CellCounts(size=size)
    flats, weights = [], []
    for _ in range(20):
        flat = rng.integers(0, size, rng.integers(0, 40))
        counts = rng.integers(1, 5, flat.size).astype(np.float64)
        partial.add(flat, counts)
        flats.append(flat)
        weights.append(counts)
    partial.compact()
    assert (partial.dense is not None) == (size < 1000)  # small domains densify, large stay sparse
    total = np.arange(size, dtype=np.float64)
    partial.add_to(total)
    expected = np.arange(size) + np.bincount(
        np.concatenate(flats), weights=np.concatenate(weights), minlength=size
    )
    np.testing.assert_array_equal(total, expected)
    assert repr(partial) == f"CellCounts(size={size}, <redacted>)"


def test_binned_nulls_nans_and_edges_equal_local(
    tmp_path: Path, rng: np.random.Generator, dask_address: str
) -> None:
    """Bins are encoded per value before grouping on a worker: nulls, NaN, values outside the
    bins and the closed last edge land exactly where the local path puts them."""
    root = _hive(tmp_path / "d", rng)
    hours = [None, float("nan"), -1.0, 100.0, 100.5, 0.0, 20.0, 39.999]
    pq.write_table(
        pa.table({"age": pa.array([3] * len(hours), pa.int32()), "hours": hours}),
        root / "region=e" / "edges.parquet",
    )
    dropped = _spec(root, dask_address, on_out_of_domain="drop")
    local = _cells(count_cells(_local(dropped)).cells)
    np.testing.assert_array_equal(_cells(count_cells_dask(dropped).cells), local)
    assert local.sum() == 2997 + 4  # 100.0 (closed last edge), 0.0, 20.0, 39.999
    _refused_alike(_spec(root, dask_address), match="'hours' has null values")


@pytest.mark.parametrize(
    "bins", [[0.0, 20.0, 40.0, 100.0], [-5.0, 5.0], [[0.0, 10.0], [10.0, 20.0], [30.0, 40.0]]]
)
def test_bin_codes_equal_the_domains_encode(bins: list[Any], rng: np.random.Generator) -> None:
    from dprelease.catalog.confidential.dask_count import bin_codes
    from dprelease.catalog.spec.domain import NumericBins

    attribute = NumericBins(bins=bins)
    flat = np.ravel(bins)
    values = np.concatenate(
        [
            flat,
            np.nextafter(flat, np.inf),
            np.nextafter(flat, -np.inf),
            [np.nan, np.inf, -np.inf, 25.0, 1e300, -1e300],
            rng.uniform(flat.min() - 10, flat.max() + 10, 1000),
        ]
    )
    cell, in_domain = attribute.encode(values)
    np.testing.assert_array_equal(bin_codes(attribute, values), np.where(in_domain, cell, -1))
