"""Counting marginals past 10¹⁸ cells on a worker (no cluster: ``count_files`` is the task body).

A 25-attribute domain of 10 values each has 10²⁵ cells: a cell vector of it, or one int64 flat
index over it, cannot exist (2⁶³ ≈ 9.2·10¹⁸).  The worker's partial holds exactly the measured
tables, each of its own size; its counts equal an independent numpy count of the rows, with and
without person-level bounding.  The true counts are looked at in the test only.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.confidential.dask_count import (
    CountJob,
    _add_table,
    _empty,
    count_cells_dask,
    count_files,
)
from dprelease.catalog.confidential.marginal_source import project_marginals
from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec

ATTRIBUTES = 25
NAMES = [f"a{i:02d}" for i in range(ATTRIBUTES)]
SUBSETS = (
    (),
    *itertools.combinations(range(ATTRIBUTES), 1),
    *itertools.combinations(range(ATTRIBUTES), 2),
)


def _spec(source: Path, **top: Any) -> ReleaseSpec:
    return parse_spec(
        {
            "name": "wide",
            "dataset": {"id": "wide", "source": str(source), "budget": {"rho": 10.0}},
            "domain": {name: {"min": 0, "max": 9} for name in NAMES},
            "workload": [
                {"name": f"way{k}", "marginals": {"attributes": "all", "degree": k}} for k in (1, 2)
            ],
            "mechanism": "marginal_space",
            "privacy": {"rho": 0.5},
            "execution": {"engine": "dask", "address": "tcp://127.0.0.1:1"},  # never contacted
            **top,
        }
    )


def _write(path: Path, rng: np.random.Generator, rows: int, first_person: int) -> pa.Table:
    columns: dict[str, Any] = {
        name: pa.array(rng.integers(0, 10, rows), pa.int8()) for name in NAMES
    }
    columns["pid"] = pa.array(first_person + rng.integers(0, rows // 3, rows), pa.int64())
    table = pa.table(columns)
    pq.write_table(table, path, row_group_size=101)
    return table


def _reference(
    tables: list[pa.Table], *, max_rows: int | None
) -> dict[tuple[int, ...], np.ndarray]:
    """Independent count: the rows (the first ``max_rows`` of each person, file order), per table
    with ``np.add.at`` over a small array."""
    codes = []
    for table in tables:
        keep = np.ones(table.num_rows, dtype=bool)
        if max_rows is not None:
            seen: dict[int, int] = {}
            for row, person in enumerate(table["pid"].to_pylist()):
                seen[person] = seen.get(person, 0) + 1
                keep[row] = seen[person] <= max_rows
        codes.append(np.stack([table[name].to_numpy()[keep] for name in NAMES]))
    rows = np.concatenate(codes, axis=1).astype(np.int64)
    expected = {(): np.array(float(rows.shape[1]))}
    for axes in SUBSETS[1:]:
        table = np.zeros((10,) * len(axes))
        np.add.at(table, tuple(rows[a] for a in axes), 1)
        expected[axes] = table.ravel()
    return expected


@pytest.mark.parametrize("bounded", [False, True])
def test_worker_counts_only_the_measured_tables_of_a_1e25_cell_domain(
    tmp_path: Path, rng: np.random.Generator, bounded: bool
) -> None:
    paths = [tmp_path / f"part-{k}.parquet" for k in range(2)]
    written = [_write(path, rng, 600, first_person=10_000 * k) for k, path in enumerate(paths)]
    unit = {"person_column": "pid", "max_rows": 2, "persons_colocated": True}
    spec = _spec(tmp_path, **({"privacy_unit": unit} if bounded else {}))
    assert spec.num_cells == 10**25 > 2**63  # no cell vector, no int64 index over it
    job = CountJob(spec=spec, subsets=SUBSETS, partitioning=None, partitioned_dir=None)

    empty = _empty(job, on_worker=True).counts
    assert list(empty) == list(SUBSETS)
    assert sum(table.size for table in empty.values()) == 1 + 25 * 10 + 300 * 100

    partial = count_files([str(path) for path in paths], job)
    assert list(partial.counts) == list(SUBSETS)
    assert [table.shape for table in partial.counts.values()] == [
        (math.prod((10,) * len(axes)),) if axes else () for axes in SUBSETS
    ]
    expected = _reference(written, max_rows=2 if bounded else None)
    for axes in SUBSETS:
        np.testing.assert_array_equal(partial.counts[axes], expected[axes])
    assert (partial.counts[()] < 1200) == bounded  # bounding dropped rows (power: not a no-op)
    assert repr(partial) == "Partial(<redacted>)"


def test_add_table_flags_out_of_domain_and_nulls_of_unmeasured_columns(tmp_path: Path) -> None:
    """A row is checked on every domain column, measured or not: a value outside the domain or a
    null in a column no measured table uses still flags it and leaves it out of every table."""
    spec = _spec(tmp_path, on_out_of_domain="drop")
    job = CountJob(spec=spec, subsets=((), (0, 1)), partitioning=None, partitioned_dir=None)
    partial = _empty(job, on_worker=True)
    columns: dict[str, Any] = {name: pa.array([1, 1, 1], pa.int8()) for name in NAMES}
    columns["a24"] = pa.array([3, 12, None], pa.int8())  # in, outside, null
    _add_table(partial, pa.table(columns), job)
    assert partial.outside == {"a24"} and partial.null == {"a24"}
    assert partial.counts[()] == 1
    assert partial.counts[(0, 1)][11] == 1 and partial.counts[(0, 1)].sum() == 1


def test_cell_vector_path_is_refused_before_any_read(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"1e\+25 cells"):
        count_cells_dask(_spec(tmp_path / "absent.parquet"))


def test_project_marginals_equals_ravel_multi_index_in_any_order(rng: np.random.Generator) -> None:
    shape = (3, 1, 4, 2, 5)
    groups = 500
    index = [rng.integers(0, n, groups) for n in shape]
    counts = rng.integers(1, 4, groups).astype(np.float64)
    subsets = [(2, 4), (), (0, 1, 2), (0,), (0, 2, 3, 4), (0, 1, 3), (1,), (2, 4), (0, 2, 3)]
    tables = project_marginals(index, counts, shape=shape, subsets=subsets)
    assert list(tables) == list(dict.fromkeys(subsets))  # the caller's order, deduplicated
    assert tables.pop(()) == counts.sum()
    for axes, table in tables.items():
        sizes = tuple(shape[a] for a in axes)
        flat = np.ravel_multi_index(tuple(index[a] for a in axes), sizes)
        np.testing.assert_array_equal(
            table, np.bincount(flat, weights=counts, minlength=math.prod(sizes))
        )


@pytest.mark.parametrize("bad", [-1, 4])
def test_project_marginals_refuses_an_index_outside_its_axis(bad: int) -> None:
    index = [np.array([0, 1]), np.array([2, bad])]
    with pytest.raises(ValueError, match=r"axis 1 must lie in \[0, 4\)") as error:
        project_marginals(index, np.ones(2), shape=(2, 4), subsets=[(0, 1)])
    assert str(bad) not in str(error.value).replace("[0, 4)", "")
