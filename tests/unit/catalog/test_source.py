"""Parquet ingest and counting (``catalog.confidential.source``): counts equal a numpy reference for a file, a hive
directory and a glob; every input problem is a ``DataError`` naming the column and the rule, never
a count or a raw value; contribution bounding keeps at most ``max_rows`` rows per person.

The true cells are read the only way production allows: a ``ProtectedCells.measure`` of the
identity strategy with the zero-noise sampler patched in as the production sampler.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.confidential import source
from dprelease.catalog.confidential.source import CountResult, count_cells
from dprelease.catalog.errors import DataError, SpecError
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.strategies import build_kron_strategy
from tests.samplers import ZeroNoise

HOURS_EDGES = [0.0, 20.0, 40.0, 60.0, 100.0]
DOMAIN: dict[str, Any] = {
    "age": {"min": 0, "max": 9},
    "sex": {"values": ["F", "M"]},
    "hours": {"bins": HOURS_EDGES},
}

ReadCounts = Callable[[CountResult], np.ndarray]


def make_spec(
    data_source: str | Path | None, *, domain: dict[str, Any] | None = None, **top: Any
) -> ReleaseSpec:
    domain = domain or DOMAIN
    dataset: dict[str, Any] = {"id": "ds", "budget": {"epsilon": 10.0}}
    if data_source is not None:
        dataset["source"] = str(data_source)
    return parse_spec(
        {
            "name": "t",
            "dataset": dataset,
            "domain": domain,
            "workload": [{"name": "all", "marginal": list(domain)}],
            "privacy": {"epsilon": 1.0},
            **top,
        }
    )


def synthetic_table(rng: np.random.Generator, rows: int = 2000) -> pa.Table:
    """In-domain rows; ``hours`` hits every bin edge, including the closed last edge 100."""
    hours = rng.uniform(0.0, 100.0, rows)
    hours[: len(HOURS_EDGES)] = HOURS_EDGES
    return pa.table(
        {
            "age": pa.array(rng.integers(0, 10, rows), pa.int16()),
            "sex": pa.array(rng.choice(["F", "M"], rows)),
            "hours": pa.array(hours, pa.float64()),
        }
    )


def reference_counts(table: pa.Table) -> np.ndarray:
    """Independent reference: ``numpy.histogramdd`` (its last bin is closed, like bin edges)."""
    sample = np.column_stack(
        [
            table["age"].to_numpy().astype(np.float64),
            (np.asarray(table["sex"].to_pylist()) == "M").astype(np.float64),
            table["hours"].to_numpy(),
        ]
    )
    counts, _ = np.histogramdd(
        sample, bins=[np.arange(11) - 0.5, np.array([-0.5, 0.5, 1.5]), np.array(HOURS_EDGES)]
    )
    return counts


class RecordingAccountant:
    """Accepts every charge (tests only) and remembers it."""

    def __init__(self) -> None:
        self.charges: list[tuple[PrivacyCost, str]] = []

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        self.charges.append((cost, label))
        return f"test-receipt-{len(self.charges)}"


def measure_identity(result: CountResult) -> Any:
    shape = result.cells.domain_shape
    strategy = build_kron_strategy("identity", attribute_roles=[(n, "ordered") for n in shape])
    return result.cells.measure(
        strategy,
        target=PrivacyCost(measure="pure", epsilon=1.0),
        accountant=RecordingAccountant(),
        label="test read-out",
    )


@pytest.fixture
def read_counts(zero_noise: ZeroNoise) -> ReadCounts:
    """The true cells, via the identity strategy with zero noise (the only way out of the session)."""

    def read(result: CountResult) -> np.ndarray:
        calls_before = len(zero_noise.calls)
        values = measure_identity(result).values
        assert len(zero_noise.calls) == calls_before + 1  # the zero-noise oracle was used
        return values.reshape(result.cells.domain_shape)

    return read


@pytest.fixture
def table(rng: np.random.Generator) -> pa.Table:
    return synthetic_table(rng)


def write(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


# --- counting equals the numpy reference ---------------------------------------------------------


def test_single_file(tmp_path: Path, table: pa.Table, read_counts: ReadCounts) -> None:
    path = write(tmp_path / "data.parquet", table)
    result = count_cells(make_spec(path))
    counts = read_counts(result)
    np.testing.assert_array_equal(counts, reference_counts(table))
    assert counts.sum() == table.num_rows
    assert result.files == (str(path),)
    assert result.cells.contribution_bound == 1


@pytest.mark.parametrize("partition_key", ["age", "sex"], ids=["integer-key", "string-key"])
def test_hive_partitioned_directory(
    tmp_path: Path, table: pa.Table, read_counts: ReadCounts, partition_key: str
) -> None:
    root = tmp_path / "landing"
    pq.write_to_dataset(table, root, partition_cols=[partition_key])
    (root / "_SUCCESS").write_bytes(b"")  # marker files are ignored
    partitions = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert len(partitions) > 1 and all(p.startswith(f"{partition_key}=") for p in partitions)
    result = count_cells(make_spec(root))
    np.testing.assert_array_equal(read_counts(result), reference_counts(table))
    assert all("_SUCCESS" not in name for name in result.files)


def test_hive_partition_key_with_digit_string_categories(
    tmp_path: Path, read_counts: ReadCounts
) -> None:
    """String categories that look like numbers (zip codes) must stay strings when they are the
    partition key: the partition type comes from the public domain, not from the folder names."""
    data = pa.table(
        {
            "zip": ["02139", "10001", "02139", "94103", "02139"],
            "age": pa.array([1, 2, 3, 4, 5], pa.int16()),
        }
    )
    root = tmp_path / "landing"
    pq.write_to_dataset(data, root, partition_cols=["zip"])
    domain = {"zip": {"values": ["02139", "10001", "94103"]}, "age": {"min": 0, "max": 9}}
    counts = read_counts(count_cells(make_spec(root, domain=domain)))
    np.testing.assert_array_equal(counts.sum(axis=1), [3, 1, 1])


def test_glob(tmp_path: Path, table: pa.Table, read_counts: ReadCounts) -> None:
    folder = tmp_path / "parts"
    for k, start in enumerate(range(0, table.num_rows, 700)):
        write(folder / f"part-{k}.parquet", table.slice(start, 700))
    (folder / "notes.txt").write_text("not data")  # not matched by the glob
    result = count_cells(make_spec(f"{folder}/part-*.parquet"))
    np.testing.assert_array_equal(read_counts(result), reference_counts(table))
    assert len(result.files) == 3


def test_only_domain_columns_are_read(
    tmp_path: Path, table: pa.Table, read_counts: ReadCounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = table.num_rows
    blob = pa.array([b"x" * 4096] * rows, pa.large_binary())  # ~8 MB nobody needs
    nested = pa.array(
        [[{"k": i, "v": [1.0, 2.0]}] for i in range(rows)],
        pa.list_(pa.struct([("k", pa.int64()), ("v", pa.list_(pa.float64()))])),
    )
    mapping = pa.array([[("a", i)] for i in range(rows)], pa.map_(pa.string(), pa.int64()))
    wide = table.append_column("blob", blob).append_column("nested", nested)
    wide = wide.append_column("mapping", mapping)
    path = write(tmp_path / "wide.parquet", wide)

    projections: list[list[str]] = []
    real_open = source.open_dataset

    class ProjectionSpy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def to_table(self, *, columns: list[str]) -> pa.Table:
            projections.append(list(columns))
            return self.inner.to_table(columns=columns)

    monkeypatch.setattr(
        source, "open_dataset", lambda files, spec: ProjectionSpy(real_open(files, spec))
    )
    result = count_cells(make_spec(path))
    assert projections == [["age", "sex", "hours"]]
    np.testing.assert_array_equal(read_counts(result), reference_counts(table))


# --- input problems are DataErrors with the column and the rule (no count, no value) -------------


def test_missing_column(tmp_path: Path, table: pa.Table) -> None:
    path = write(tmp_path / "d.parquet", table.drop_columns(["hours"]))
    with pytest.raises(
        DataError, match=r"input is missing column\(s\) \['hours'\] required by the spec"
    ):
        count_cells(make_spec(path))


@pytest.mark.parametrize(
    ("column", "values", "domain_change", "message"),
    [
        pytest.param(
            "age",
            pa.array(np.arange(2000) % 10, pa.float64()),
            {},
            r"column 'age' does not hold integer values, which the domain \(IntegerRange\) needs",
            id="float-for-integer-range",
        ),
        pytest.param(
            "sex",
            pa.array(np.arange(2000) % 2, pa.int64()),
            {},
            r"column 'sex' does not hold string values, which the domain \(Categorical\) needs",
            id="int-for-string-categories",
        ),
        pytest.param(
            "sex",
            pa.array(["F", "M"] * 1000),
            {"sex": {"values": [0, 1]}},
            r"column 'sex' does not hold integer values, which the domain \(Categorical\) needs",
            id="string-for-int-categories",
        ),
        pytest.param(
            "hours",
            pa.array(["10"] * 2000),
            {},
            r"column 'hours' does not hold numeric values, which the domain \(NumericBins\) needs",
            id="string-for-bins",
        ),
    ],
)
def test_wrong_type(
    tmp_path: Path,
    table: pa.Table,
    column: str,
    values: pa.Array,
    domain_change: dict[str, Any],
    message: str,
) -> None:
    changed = table.set_column(table.schema.get_field_index(column), column, values)
    path = write(tmp_path / "d.parquet", changed)
    with pytest.raises(DataError, match=message) as raised:
        count_cells(make_spec(path, domain={**DOMAIN, **domain_change}))
    assert str(changed.schema.field(column).type) not in str(raised.value)  # no type of the file


def with_values(table: pa.Table, column: str, rows: list[int], value: Any) -> pa.Table:
    """``table`` with ``column`` set to ``value`` (``None`` for null) at ``rows``."""
    values = table[column].to_pylist()
    for row in rows:
        values[row] = value
    index = table.schema.get_field_index(column)
    return table.set_column(index, column, pa.array(values, table.schema.field(column).type))


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        pytest.param(
            "age", None, r"column 'age' has null values; .*on_out_of_domain: drop", id="null-age"
        ),
        pytest.param(
            "sex", None, r"column 'sex' has null values; .*on_out_of_domain: drop", id="null-sex"
        ),
        pytest.param(
            "hours",
            None,
            r"column 'hours' has null values; .*on_out_of_domain: drop",
            id="null-hours",
        ),
        pytest.param(
            "age",
            10,
            r"column 'age' has values outside the public domain integers 0\.\.9: set on_out_of_domain: drop",
            id="age-above-max",
        ),
        pytest.param(
            "age",
            -1,
            r"column 'age' has values outside the public domain integers 0\.\.9: set on_out_of_domain: drop",
            id="age-below-min",
        ),
        pytest.param(
            "sex",
            "X",
            r"column 'sex' has values outside the public domain values \['F', 'M'\]",
            id="unknown-category",
        ),
        pytest.param(
            "hours",
            100.5,
            r"column 'hours' has values outside the public domain bins covering \[0, 100\]",
            id="above-last-edge",
        ),
        pytest.param(
            "hours",
            float("nan"),
            r"column 'hours' has values outside the public domain bins covering \[0, 100\]",
            id="nan-hours",
        ),
    ],
)
def test_nulls_and_out_of_domain_values_are_errors(
    tmp_path: Path, table: pa.Table, column: str, value: Any, message: str
) -> None:
    path = write(tmp_path / "d.parquet", with_values(table, column, [3, 500, 1999], value))
    with pytest.raises(DataError, match=message) as raised:
        count_cells(make_spec(path))
    text = str(raised.value)
    assert "dprelease check SPEC" in text
    for planted in (3, value):  # the row count, the raw value
        if planted is not None:
            assert not re.search(rf"(?<![\w.]){re.escape(str(planted))}(?![\w.])", text), text


def test_drop_removes_nulls_and_out_of_domain_rows(
    tmp_path: Path, table: pa.Table, read_counts: ReadCounts
) -> None:
    bad = with_values(table, "age", [0, 1], None)
    bad = with_values(bad, "age", [2, 3, 4], 42)
    bad = with_values(bad, "sex", [5], "X")
    bad = with_values(bad, "hours", [6, 7], 1000.0)
    path = write(tmp_path / "d.parquet", bad)
    result = count_cells(make_spec(path, on_out_of_domain="drop"))
    kept = table.slice(8)  # rows 0..7 are the bad ones
    counts = read_counts(result)
    np.testing.assert_array_equal(counts, reference_counts(kept))
    assert counts.sum() == table.num_rows - 8


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    path.write_bytes(b"")
    with pytest.raises(DataError, match=r"input file '.*empty\.parquet' is empty \(0 bytes\)"):
        count_cells(make_spec(path))


def test_parquet_file_with_zero_rows(tmp_path: Path, table: pa.Table) -> None:
    path = write(tmp_path / "none.parquet", table.slice(0, 0))
    with pytest.raises(DataError, match=r"input '.*none\.parquet' has no rows"):
        count_cells(make_spec(path))


def test_text_file_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    path.write_text("age,sex,hours\n1,F,10\n")
    with pytest.raises(DataError, match=r"cannot read the input as Parquet"):
        count_cells(make_spec(path))


def test_glob_with_one_non_parquet_file(tmp_path: Path, table: pa.Table) -> None:
    write(tmp_path / "a.parquet", table)
    (tmp_path / "b.parquet").write_text("not parquet at all")
    with pytest.raises(DataError, match=r"cannot read .*b\.parquet.* as Parquet"):
        count_cells(make_spec(f"{tmp_path}/*.parquet"))


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(pa.array(["1", "2"]), id="string-digits"),
        pytest.param(pa.array([[1], [2]]), id="list"),
    ],
)
def test_column_type_is_checked_in_every_file(tmp_path: Path, other: pa.Array) -> None:
    """The type rule holds for every file of a glob, not only the first one (whose schema the
    dataset adopts): a later file must not be cast silently or fail with a raw Arrow error."""
    write(tmp_path / "a.parquet", pa.table({"age": pa.array([1, 2], pa.int16())}))
    write(tmp_path / "b.parquet", pa.table({"age": other}))
    spec = make_spec(f"{tmp_path}/*.parquet", domain={"age": DOMAIN["age"]})
    with pytest.raises(DataError, match=r"column 'age' does not hold integer values"):
        count_cells(spec)


def test_source_not_set() -> None:
    with pytest.raises(SpecError, match=r"dataset\.source is not set in the spec"):
        count_cells(make_spec(None))


def test_source_matches_no_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"dataset\.source '.*nothing-\*\.parquet' matches no file"):
        count_cells(make_spec(tmp_path / "nothing-*.parquet"))


# --- bins, widths, encodings ---------------------------------------------------------------------


def count_one(
    tmp_path: Path, read_counts: ReadCounts, name: str, values: pa.Array, attribute: dict[str, Any]
) -> np.ndarray:
    path = write(tmp_path / f"{name}.parquet", pa.table({name: values}))
    return read_counts(count_cells(make_spec(path, domain={name: attribute})))


def test_bin_edges_are_half_open_with_a_closed_last_edge(
    tmp_path: Path, read_counts: ReadCounts
) -> None:
    values = pa.array([0.0, 19.99, 20.0, 40.0, 59.9, 60.0, 99.9, 100.0])
    counts = count_one(tmp_path, read_counts, "hours", values, {"bins": HOURS_EDGES})
    np.testing.assert_array_equal(counts, [2, 1, 2, 3])


def test_bins_accept_integer_columns(tmp_path: Path, read_counts: ReadCounts) -> None:
    values = pa.array([0, 19, 20, 39, 40, 100], pa.int32())
    counts = count_one(tmp_path, read_counts, "hours", values, {"bins": HOURS_EDGES})
    np.testing.assert_array_equal(counts, [2, 2, 1, 1])


def test_bin_pairs_are_half_open(tmp_path: Path, read_counts: ReadCounts) -> None:
    pairs = [[0, 20], [20, 40], [60, 100]]
    values = pa.array([0.0, 19.99, 20.0, 39.99, 60.0, 99.9])
    counts = count_one(tmp_path, read_counts, "hours", values, {"bins": pairs})
    np.testing.assert_array_equal(counts, [2, 2, 2])


@pytest.mark.parametrize(
    "value", [pytest.param(100.0, id="upper-end"), pytest.param(50.0, id="in-gap")]
)
def test_bin_pairs_leave_their_upper_end_and_gaps_out(tmp_path: Path, value: float) -> None:
    path = write(tmp_path / "h.parquet", pa.table({"hours": pa.array([10.0, value, 30.0])}))
    spec = make_spec(path, domain={"hours": {"bins": [[0, 20], [20, 40], [60, 100]]}})
    with pytest.raises(DataError, match=r"column 'hours' has values outside the public domain"):
        count_cells(spec)


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        # cells [0-3], [4-7], [8-9] (the last is narrower)
        pytest.param({"min": 0, "max": 9, "width": 4}, [4, 4, 2], id="width-4-from-0"),
        # cells [3-7], [8-12]
        pytest.param({"min": 3, "max": 12, "width": 5}, None, id="width-5-from-3"),
    ],
)
def test_integer_ranges_with_width(
    tmp_path: Path, read_counts: ReadCounts, attribute: dict[str, Any], expected: list[int] | None
) -> None:
    if expected is not None:
        values = pa.array(np.arange(10), pa.int64())
    else:
        values = pa.array([3, 7, 8, 12, 12, 5], pa.int64())
        expected = [3, 3]
    counts = count_one(tmp_path, read_counts, "age", values, attribute)
    np.testing.assert_array_equal(counts, expected)


def test_integer_categories(tmp_path: Path, read_counts: ReadCounts) -> None:
    values = pa.array([7, 3, 3, 9, 7, 7], pa.int8())
    counts = count_one(tmp_path, read_counts, "code", values, {"values": [3, 7, 9]})
    np.testing.assert_array_equal(counts, [2, 3, 1])


def test_dictionary_encoded_strings(
    tmp_path: Path, table: pa.Table, read_counts: ReadCounts
) -> None:
    index = table.schema.get_field_index("sex")
    encoded = table.set_column(index, "sex", table["sex"].dictionary_encode())
    path = write(tmp_path / "d.parquet", encoded)
    assert pa.types.is_dictionary(pq.read_schema(path).field("sex").type)  # precondition
    result = count_cells(make_spec(path))
    np.testing.assert_array_equal(read_counts(result), reference_counts(table))


# --- contribution bounding ---------------------------------------------------------------------------


def bounded_reference(table: pa.Table, person: np.ndarray, max_rows: int) -> np.ndarray:
    """Keep each person's first ``max_rows`` rows in file order (a plain loop, as a reference)."""
    seen: dict[Any, int] = {}
    keep = np.zeros(len(person), dtype=bool)
    for row, pid in enumerate(person.tolist()):
        seen[pid] = seen.get(pid, 0) + 1
        keep[row] = seen[pid] <= max_rows
    return reference_counts(table.filter(pa.array(keep)))


@pytest.mark.parametrize("max_rows", [1, 3])
def test_contribution_bounding_keeps_at_most_max_rows_per_person(
    tmp_path: Path,
    table: pa.Table,
    rng: np.random.Generator,
    read_counts: ReadCounts,
    max_rows: int,
) -> None:
    person = rng.integers(0, 300, table.num_rows)  # ~6.7 rows per person
    path = write(tmp_path / "d.parquet", table.append_column("pid", pa.array(person)))
    spec = make_spec(path, privacy_unit={"person_column": "pid", "max_rows": max_rows})
    result = count_cells(spec)
    assert result.cells.contribution_bound == max_rows
    counts = read_counts(result)
    np.testing.assert_array_equal(counts, bounded_reference(table, person, max_rows))
    assert counts.sum() <= max_rows * len(np.unique(person)) < table.num_rows


def test_contribution_bound_scales_the_sensitivity(
    tmp_path: Path, table: pa.Table, zero_noise: ZeroNoise
) -> None:
    person = np.arange(table.num_rows) // 4
    path = write(tmp_path / "d.parquet", table.append_column("pid", pa.array(person)))
    spec = make_spec(path, privacy_unit={"person_column": "pid", "max_rows": 3})
    measurement = measure_identity(count_cells(spec))
    assert measurement.noise.sensitivity == 3.0  # identity L1 sensitivity 1 x max_rows
    assert zero_noise.calls == [("laplace", 80, measurement.noise.scale)]


def test_contribution_bounding_across_files(
    tmp_path: Path, table: pa.Table, rng: np.random.Generator, read_counts: ReadCounts
) -> None:
    """A person with rows in several files is still one person (dictionaries are unified)."""
    person = np.asarray([f"p{k}" for k in rng.integers(0, 50, table.num_rows)])
    with_person = table.append_column("pid", pa.array(person))
    for k, start in enumerate(range(0, table.num_rows, 500)):
        write(tmp_path / "parts" / f"part-{k}.parquet", with_person.slice(start, 500))
    spec = make_spec(
        f"{tmp_path}/parts/*.parquet", privacy_unit={"person_column": "pid", "max_rows": 2}
    )
    counts = read_counts(count_cells(spec))
    assert counts.sum() == 2 * 50
    np.testing.assert_array_equal(counts, bounded_reference(table, person, 2))


def test_null_person_id_is_an_error(tmp_path: Path, table: pa.Table) -> None:
    person = pa.array([None if k in (1, 2) else k for k in range(table.num_rows)], pa.int64())
    path = write(tmp_path / "d.parquet", table.append_column("pid", person))
    spec = make_spec(path, privacy_unit={"person_column": "pid", "max_rows": 1})
    with pytest.raises(DataError, match=r"person column 'pid' has null values") as raised:
        count_cells(spec)
    assert "2" not in str(raised.value)


def test_missing_person_column(tmp_path: Path, table: pa.Table) -> None:
    path = write(tmp_path / "d.parquet", table)
    spec = make_spec(path, privacy_unit={"person_column": "pid", "max_rows": 1})
    with pytest.raises(DataError, match=r"missing column\(s\) \['pid'\]"):
        count_cells(spec)


# --- input fingerprint -----------------------------------------------------------------------------


def test_input_fingerprint_follows_file_content(tmp_path: Path, table: pa.Table) -> None:
    path = write(tmp_path / "d.parquet", table)
    spec = make_spec(path)
    first = count_cells(spec).input_fingerprint
    assert count_cells(spec).input_fingerprint == first  # same bytes, same fingerprint
    write(path, table.slice(1))  # content change
    assert count_cells(spec).input_fingerprint != first
