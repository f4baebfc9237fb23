"""Parquet source → checked, contribution-bounded cell vector inside a :class:`ProtectedCells`.

This is the only module that reads raw rows.  It uses ``pyarrow.dataset`` over a file, a
directory (hive partitions allowed) or a glob, reads only the domain's columns (and the person
column when contributions are bounded), and counts with Arrow's ``group_by``: the per-row work is
Arrow compute; numpy then maps the *distinct* key combinations to cell indices.

Input checks (missing column, wrong type, nulls, values outside the public domain) run before
counting; the value checks run with Great Expectations over the distinct values of each column
weighted by their row counts.  Out-of-domain rows are an error by default; with
``on_out_of_domain: drop`` they are dropped (nulls count as out of domain).
"""

from __future__ import annotations

import glob as globlib
import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from catalog.errors import DataError
from catalog.spec import Categorical, IntegerRange, NumericBins, ReleaseSpec
from mechanisms.session import ProtectedCells

MAX_RELEASE_CELLS = 200_000_000  # float64 cell vector of 1.6 GB


@dataclass(frozen=True, kw_only=True)
class SourceFiles:
    """The resolved input files and their content fingerprint (public metadata)."""

    files: tuple[str, ...]
    fingerprint: str
    partitioned_dir: str | None


def resolve_source(source: str) -> SourceFiles:
    """Files behind a spec's ``dataset.source`` and a sha256 over their contents (sorted by path)."""
    files, partitioned_dir = list_source_files(source)
    return SourceFiles(
        files=files,
        fingerprint=content_fingerprint(files, partitioned_dir),
        partitioned_dir=partitioned_dir,
    )


def list_source_files(source: str) -> tuple[tuple[str, ...], str | None]:
    """The files of a file, a (hive-partitioned) directory or a glob, sorted; and the directory."""
    path = Path(source)
    partitioned_dir = None
    if path.is_dir():
        files = sorted(
            str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))
        )
        partitioned_dir = str(path)
    elif path.is_file():
        files = [str(path)]
    else:
        files = sorted(p for p in globlib.glob(source, recursive=True) if Path(p).is_file())
    if not files:
        raise DataError(f"dataset.source {source!r} matches no file")
    return tuple(files), partitioned_dir


def content_fingerprint(files: tuple[str, ...], partitioned_dir: str | None) -> str:
    """sha256 over (relative name, bytes) of every file. O(bytes), streaming; releases the GIL."""
    digest = hashlib.sha256()
    for name in files:
        digest.update(
            Path(name).name.encode()
            if partitioned_dir is None
            else str(Path(name).relative_to(partitioned_dir)).encode()
        )
        digest.update(b"\0")
        with open(name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def open_dataset(files: SourceFiles, spec: ReleaseSpec) -> ds.Dataset:
    """A dataset over the files; hive partition keys get the types the domain needs (a string
    category such as zip "02139" must not be read as an integer)."""
    for name in files.files:
        if Path(name).stat().st_size == 0:
            raise DataError(f"input file {name!r} is empty (0 bytes); it is not a Parquet file")
    try:
        if files.partitioned_dir is not None:
            keys = _partition_keys(files)
            schema = pa.schema(
                [
                    (key, _arrow_type(spec.domain[key]) if key in spec.domain else pa.string())
                    for key in keys
                ]
            )
            partitioning = ds.partitioning(schema, flavor="hive") if keys else None
            return ds.dataset(files.partitioned_dir, format="parquet", partitioning=partitioning)
        return ds.dataset(list(files.files), format="parquet")
    except (pa.ArrowException, OSError) as exc:
        raise DataError(
            f"cannot read the input as Parquet ({', '.join(files.files[:3])}): {exc}"
        ) from None


def _partition_keys(files: SourceFiles) -> list[str]:
    """``key=value`` folder names above the first file, in order (hive layout)."""
    relative = Path(files.files[0]).relative_to(files.partitioned_dir or "")
    return [part.split("=", 1)[0] for part in relative.parts[:-1] if "=" in part]


def _arrow_type(attribute: Any) -> pa.DataType:
    expected = _expected_type(attribute)
    return {"integer": pa.int64(), "numeric": pa.float64(), "string": pa.string()}[expected]


def check_schema(dataset: ds.Dataset, spec: ReleaseSpec) -> None:
    """Missing columns and wrong types in every file's schema (footers only, no rows read)."""
    partitioning = getattr(dataset, "partitioning", None)
    partition_names = set(partitioning.schema.names) if partitioning is not None else set()
    _check_one_schema(dataset.schema, spec, set())
    for fragment in dataset.get_fragments():
        try:
            schema = fragment.physical_schema
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read {fragment.path!r} as Parquet: {exc}") from None
        _check_one_schema(schema, spec, partition_names)


def _check_one_schema(schema: pa.Schema, spec: ReleaseSpec, partition_names: set[str]) -> None:
    needed = list(spec.domain)
    if spec.privacy_unit.person_column is not None:
        needed.append(spec.privacy_unit.person_column)
    missing = [name for name in needed if name not in schema.names and name not in partition_names]
    if missing:
        raise DataError(
            f"input is missing column(s) {missing} required by the spec; it has {schema.names}"
        )
    for name, attribute in spec.domain.items():
        if name not in schema.names:
            continue  # a hive partition key: typed by the partitioning, not the file
        column_type = schema.field(name).type
        if pa.types.is_dictionary(column_type):
            column_type = column_type.value_type
        expected = _expected_type(attribute)
        ok = {
            "integer": pa.types.is_integer(column_type),
            "numeric": pa.types.is_integer(column_type) or pa.types.is_floating(column_type),
            "string": pa.types.is_string(column_type) or pa.types.is_large_string(column_type),
        }[expected]
        if not ok:
            raise DataError(
                f"column {name!r} has type {column_type}, but the domain needs {expected} values "
                f"({type(attribute).__name__})"
            )


def _expected_type(attribute: Any) -> str:
    if isinstance(attribute, IntegerRange):
        return "integer"
    if isinstance(attribute, NumericBins):
        return "numeric"
    if isinstance(attribute, Categorical) and isinstance(attribute.values[0], str):
        return "string"
    return "integer"


@dataclass(frozen=True, kw_only=True)
class CountResult:
    """What counting returns: the protected cells and public facts about the input."""

    cells: ProtectedCells
    input_fingerprint: str
    files: tuple[str, ...]
    input_checks: dict[str, Any]


def count_cells(spec: ReleaseSpec) -> CountResult:
    """Read, check, bound contributions and count the spec's source into protected cells."""
    if spec.dataset.source is None:
        raise DataError(
            "dataset.source is not set in the spec; plan works without it, run does not"
        )
    if spec.num_cells > MAX_RELEASE_CELLS:
        raise DataError(
            f"the domain has {spec.num_cells:,} cells; a release counts at most "
            f"{MAX_RELEASE_CELLS:,} cells on one machine (plan works on any size)"
        )
    names, partitioned_dir = list_source_files(spec.dataset.source)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # the content hash (hashlib releases the GIL) overlaps with Arrow reading the same files
        hashing = pool.submit(content_fingerprint, names, partitioned_dir)
        files = SourceFiles(files=names, fingerprint="", partitioned_dir=partitioned_dir)
        dataset = open_dataset(files, spec)
        check_schema(dataset, spec)
        attributes = list(spec.domain)
        person = spec.privacy_unit.person_column
        columns = attributes + ([person] if person else [])
        try:
            table = dataset.to_table(columns=columns)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read the input as Parquet: {exc}") from None
        input_fingerprint = hashing.result()
    if table.num_rows == 0:
        raise DataError(f"input {spec.dataset.source!r} has no rows")
    table = _decode_dictionaries(table)
    if person is not None:
        table = bound_contributions(
            table, person_column=person, max_rows=spec.privacy_unit.max_rows or 1
        )
    groups = table.group_by(attributes).aggregate([([], "count_all")])  # O(rows), Arrow compute
    # GX sees each column's distinct values (from the groups: O(groups)), never the rows.
    input_checks = run_input_expectations(
        {name: pc.unique(groups[name]) for name in attributes}, spec
    )
    counts = groups["count_all"].to_numpy().astype(np.float64)
    index_per_attribute = []
    valid = np.ones(groups.num_rows, dtype=bool)
    problems: dict[str, dict[str, int]] = {}
    for name in attributes:
        column = groups[name]
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        values = column.fill_null(_fill_value(column.type)).to_numpy(zero_copy_only=False)
        index, in_domain = spec.domain[name].encode(values)
        in_domain &= ~nulls
        problems[name] = {
            "null_rows": int(counts[nulls].sum()),
            "out_of_domain_rows": int(counts[~in_domain & ~nulls].sum()),
        }
        index_per_attribute.append(index)
        valid &= in_domain
    if spec.on_out_of_domain == "error":
        for name, found in problems.items():
            if found["null_rows"]:
                raise DataError(
                    f"column {name!r} has {found['null_rows']} null value(s); the domain has no null "
                    "cell (fix the data, or set on_out_of_domain: drop to drop them)"
                )
            if found["out_of_domain_rows"]:
                raise DataError(
                    f"column {name!r} has {found['out_of_domain_rows']} row(s) outside the public "
                    f"domain {_describe(spec.domain[name])} (fix the data or the domain, or set "
                    "on_out_of_domain: drop)"
                )
    flat = np.ravel_multi_index(
        tuple(ix[valid] for ix in index_per_attribute), spec.domain_shape
    )  # O(groups)
    cells = np.bincount(flat, weights=counts[valid], minlength=spec.num_cells)
    protected = ProtectedCells(
        cells,
        domain_shape=spec.domain_shape,
        contribution_bound=spec.privacy_unit.contribution_bound,
    )
    return CountResult(
        cells=protected,
        input_fingerprint=input_fingerprint,
        files=files.files,
        input_checks=input_checks,
    )


def bound_contributions(table: pa.Table, *, person_column: str, max_rows: int) -> pa.Table:
    """Keep at most ``max_rows`` rows per person (the first ones in file order). O(rows log rows).

    Privacy: after this, adding or removing one person changes at most ``max_rows`` cell counts by
    one each, which is the contribution bound every sensitivity is multiplied by.  Which rows are
    kept depends only on that person's own rows, so bounding is stable under neighbouring inputs.
    """
    persons = table[person_column]
    if persons.null_count:
        raise DataError(f"person column {person_column!r} has {persons.null_count} null value(s)")
    codes = pc.dictionary_encode(persons).combine_chunks().indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_codes)) + 1]
    run_lengths = np.diff(np.r_[starts, sorted_codes.size])
    rank_sorted = np.arange(sorted_codes.size) - np.repeat(starts, run_lengths)
    keep = np.empty(sorted_codes.size, dtype=bool)
    keep[order] = rank_sorted < max_rows
    return table.filter(pa.array(keep)).drop_columns([person_column])


def run_input_expectations(distinct: dict[str, pa.Array], spec: ReleaseSpec) -> dict[str, Any]:
    """Great Expectations over each column's distinct values: nulls and domain membership.

    One small suite per column over that column's distinct values, so GX never sees the rows.  Returns a summary (expectation type, column, success); the row counts behind failures
    are computed by :func:`count_cells` and are not part of any artifact.
    """
    from catalog.gx import run_suites

    jobs = []
    for name, attribute in spec.domain.items():
        frame = pa.table({name: distinct[name]}).to_pandas()
        expectations: list[tuple[str, dict[str, Any]]] = [
            ("expect_column_to_exist", {"column": name})
        ]
        if spec.on_out_of_domain == "error":
            expectations.append(("expect_column_values_to_not_be_null", {"column": name}))
        if isinstance(attribute, Categorical):
            expectations.append(
                (
                    "expect_column_values_to_be_in_set",
                    {"column": name, "value_set": list(attribute.values)},
                )
            )
        else:
            low, high = (
                (attribute.min, attribute.max)
                if isinstance(attribute, IntegerRange)
                else (float(attribute.pairs()[0, 0]), float(attribute.pairs()[-1, 1]))
            )
            expectations.append(
                (
                    "expect_column_values_to_be_between",
                    {"column": name, "min_value": low, "max_value": high},
                )
            )
        jobs.append((f"input_{name}", frame, expectations))
    summaries = run_suites(jobs)
    return {"success": all(s["success"] for s in summaries.values()), "columns": summaries}


def _decode_dictionaries(table: pa.Table) -> pa.Table:
    for k, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(k, field.name, table[field.name].cast(field.type.value_type))
    return table


def _fill_value(column_type: pa.DataType) -> Any:
    if pa.types.is_string(column_type) or pa.types.is_large_string(column_type):
        return ""
    return 0


def _describe(attribute: Any) -> str:
    if isinstance(attribute, IntegerRange):
        return f"integers {attribute.min}..{attribute.max}"
    if isinstance(attribute, NumericBins):
        pairs = attribute.pairs()
        return f"bins covering [{pairs[0, 0]:g}, {pairs[-1, 1]:g}]"
    return f"values {attribute.values}"
