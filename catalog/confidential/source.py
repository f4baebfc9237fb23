"""Parquet source → checked, contribution-bounded cell vector inside a :class:`ProtectedCells`.

The central model's read path (``dask_count`` runs it on a cluster).  It uses ``pyarrow.dataset``
over a file, a directory (hive partitions allowed) or a glob, reads only the domain's columns (and
the person column when contributions are bounded), and counts with Arrow's ``group_by``: the
per-row work is Arrow compute; numpy then maps the *distinct* key combinations to cell indices.

Input checks (missing column, wrong type, nulls, values outside the public domain) run with numpy
over the distinct key combinations, the same encoding that counts them.  Out-of-domain rows are an
error by default; with ``on_out_of_domain: drop`` they are dropped (nulls count as out of domain).

Privacy: an input problem is reported by column and rule only (never a count, a row or a raw
value, nor Arrow's error text, which can quote values); the exact figures are printed by the
data custodian's local ``dprelease check SPEC`` (``check``) and stored nowhere."""

from __future__ import annotations

import glob as globlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dprelease.catalog.confidential.choke_point import ProtectedCells
from dprelease.catalog.errors import DataError
from dprelease.catalog.keys import CatalogKey, catalog_key
from dprelease.catalog.ledger.database import default_url
from dprelease.catalog.spec.domain import Categorical, IntegerRange, NumericBins
from dprelease.catalog.spec.load import check_runnable
from dprelease.catalog.spec.model import ReleaseSpec

if TYPE_CHECKING:
    import pyarrow.dataset as ds

CUSTODIAN_HINT = "as the data custodian, run `dprelease check SPEC` to see what is wrong"
_ARROW_TYPES = {"integer": pa.int64(), "numeric": pa.float64(), "string": pa.string()}


@dataclass(frozen=True, kw_only=True)
class SourceFiles:
    """The resolved input files and their content fingerprint (public metadata)."""

    files: tuple[str, ...]
    fingerprint: str
    partitioned_dir: str | None


def resolve_source(source: str, *, key: CatalogKey | None = None) -> SourceFiles:
    """Files behind a spec's ``dataset.source`` and their keyed fingerprint (HMAC under ``key``,
    default the default catalog's key; sorted by path).  Reads bytes, parses nothing."""
    files, partitioned_dir = list_source_files(source)
    return SourceFiles(
        files=files,
        fingerprint=content_fingerprint(files, partitioned_dir, key=key),
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


def content_fingerprint(
    files: tuple[str, ...], partitioned_dir: str | None, *, key: CatalogKey | None = None
) -> str:
    """HMAC-SHA256, under the catalog key, over (relative name, bytes) of every file.

    Privacy: keyed, never a plain hash, so a published fingerprint cannot confirm a guessed file.
    Deterministic for one key (re-runs and DAWA's partition cache still hit).  ``key`` defaults to
    the key of the default catalog.  O(bytes), streaming; releases the GIL."""

    def parts() -> Iterator[bytes]:
        for name in files:
            yield (
                Path(name).name.encode()
                if partitioned_dir is None
                else str(Path(name).relative_to(partitioned_dir)).encode()
            )
            yield b"\0"
            with open(name, "rb") as handle:
                yield from iter(lambda: handle.read(1 << 20), b"")
            yield b"\0"

    return (key or catalog_key(default_url())).fingerprint(parts())


def open_dataset(files: SourceFiles, spec: ReleaseSpec) -> ds.Dataset:
    """A dataset over the files; hive partition keys get the types the domain needs (a string
    category such as zip "02139" must not be read as an integer)."""
    for name in files.files:
        if Path(name).stat().st_size == 0:
            raise DataError(f"input file {name!r} is empty (0 bytes); it is not a Parquet file")
    try:
        return open_dataset_unchecked(files, spec)
    except (pa.ArrowException, OSError):
        # Arrow's text may quote raw values (a partition key, a cast): never in the message.
        raise unreadable("the input") from None


def open_dataset_unchecked(files: SourceFiles, spec: ReleaseSpec) -> ds.Dataset:
    """:func:`open_dataset` without the checks: raises Arrow's own errors (``dprelease check``)."""
    # imported here: 0.3 s (it loads pandas) that commands reading no data never need
    import pyarrow.dataset as ds

    if files.partitioned_dir is not None:
        keys = _partition_keys(files)
        types = {name: _ARROW_TYPES[_expected_type(a)] for name, a in spec.domain.items()}
        columns = _period_columns(spec)
        if columns is not None:  # a series' period column as a hive key (``month=2026-03/``)
            types[columns.column] = _ARROW_TYPES[_period_type(columns)]
        schema = pa.schema([(key, types.get(key, pa.string())) for key in keys])
        partitioning = ds.partitioning(schema, flavor="hive") if keys else None
        return ds.dataset(files.partitioned_dir, format="parquet", partitioning=partitioning)
    return ds.dataset(list(files.files), format="parquet")


def unreadable(what: str) -> DataError:
    """A read failure, named without Arrow's text (which may quote raw values)."""
    return DataError(
        f"cannot read {what} as Parquet (a damaged or non-Parquet file, or files whose columns "
        f"disagree); {CUSTODIAN_HINT}"
    )


def _partition_keys(files: SourceFiles) -> list[str]:
    """``key=value`` folder names above the first file, in order (hive layout)."""
    relative = Path(files.files[0]).relative_to(files.partitioned_dir or "")
    return [part.split("=", 1)[0] for part in relative.parts[:-1] if "=" in part]


@dataclass(frozen=True, kw_only=True)
class SchemaProblem:
    """A missing column, a wrong column type or an unreadable file footer.

    ``message`` names the column (or file) and the rule only; ``detail`` (the type found, the
    columns present, Arrow's error text) describes the confidential file and is printed by
    ``dprelease check`` only, never raised or logged.
    """

    column: str | None
    file: str | None
    message: str
    detail: str


def schema_problems(dataset: ds.Dataset, spec: ReleaseSpec) -> list[SchemaProblem]:
    """Missing columns and wrong types in every file's schema (footers only, no rows read)."""
    partitioning = getattr(dataset, "partitioning", None)
    partition_names = set(partitioning.schema.names) if partitioning is not None else set()
    problems: list[SchemaProblem] = []
    for fragment in dataset.get_fragments():
        try:
            schema = fragment.physical_schema
        except (pa.ArrowException, OSError) as exc:
            problems.append(
                SchemaProblem(
                    column=None,
                    file=fragment.path,
                    message=unreadable(repr(fragment.path)).args[0],
                    detail=str(exc),
                )
            )
            continue
        problems += _one_schema_problems(schema, spec, partition_names, file=fragment.path)
    return problems


def check_schema(dataset: ds.Dataset, spec: ReleaseSpec) -> None:
    """Raise a rule-only :class:`DataError` for the first schema problem (footers only)."""
    problems = schema_problems(dataset, spec)
    if problems:
        raise DataError(problems[0].message)


def _one_schema_problems(
    schema: pa.Schema, spec: ReleaseSpec, partition_names: set[str], *, file: str | None
) -> list[SchemaProblem]:
    problems = []
    columns = _period_columns(spec)
    required = input_columns(spec) + ([columns.column] if columns is not None else [])
    missing = [
        name for name in required if name not in schema.names and name not in partition_names
    ]
    if missing:
        problems.append(
            SchemaProblem(
                column=missing[0],
                file=file,
                message=f"the input is missing column(s) {missing} required by the spec; "
                f"{CUSTODIAN_HINT}",
                detail=f"columns present: {schema.names}",
            )
        )
    typed = [
        (name, _expected_type(attribute), f"the domain ({type(attribute).__name__})", "the domain")
        for name, attribute in spec.domain.items()
    ]
    if columns is not None:
        period = "series.period.values"
        typed.append((columns.column, _period_type(columns), period, period))
    for name, expected, declared, fix in typed:
        if name not in schema.names:
            continue  # missing, or a hive partition key: typed by the partitioning, not the file
        column_type = schema.field(name).type
        if pa.types.is_dictionary(column_type):
            column_type = column_type.value_type
        ok = {
            "integer": pa.types.is_integer(column_type),
            "numeric": pa.types.is_integer(column_type) or pa.types.is_floating(column_type),
            "string": pa.types.is_string(column_type) or pa.types.is_large_string(column_type),
        }[expected]
        if not ok:
            problems.append(
                SchemaProblem(
                    column=name,
                    file=file,
                    message=f"column {name!r} does not hold {expected} values, which {declared} "
                    f"needs: fix the data or {fix}; {CUSTODIAN_HINT}",
                    detail=f"has type {column_type}",
                )
            )
    return problems


def _period_columns(spec: ReleaseSpec) -> Any:
    """The spec's column periods (``series.period: {column, values}``), or None."""
    return None if spec.series is None else spec.series.columns


def _period_type(columns: Any) -> str:
    return "string" if isinstance(columns.values[0], str) else "integer"


def _expected_type(attribute: Any) -> str:
    if isinstance(attribute, IntegerRange):
        return "integer"
    if isinstance(attribute, NumericBins):
        return "numeric"
    if isinstance(attribute, Categorical) and isinstance(attribute.values[0], str):
        return "string"
    return "integer"


def input_columns(spec: ReleaseSpec) -> list[str]:
    """The columns a release reads: the domain's, and the person column when bounding."""
    person = spec.privacy_unit.person_column
    return list(spec.domain) + ([person] if person is not None else [])


def read_columns(
    dataset: ds.Dataset, columns: list[str], *, rows: PeriodRows | None = None
) -> pa.Table:
    """Only ``columns`` of every file (only ``rows``' rows: the filter is pushed into the scan, so
    row groups and hive folders of other periods are skipped), dictionary columns decoded.
    O(rows × columns), Arrow."""
    try:
        table = (
            dataset.to_table(columns=columns)
            if rows is None
            else dataset.to_table(columns=columns, filter=rows.expression())
        )
    except (pa.ArrowException, OSError):
        raise unreadable("the input") from None
    return decode_dictionaries(table)


def decode_dictionaries(table: pa.Table) -> pa.Table:
    """Dictionary-encoded columns as plain ones (group keys then compare as values). O(rows)."""
    for k, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(k, field.name, table[field.name].cast(field.type.value_type))
    return table


def group_counts(table: pa.Table, attributes: list[str]) -> pa.Table:
    """Rows per distinct key combination (``count_all``). O(rows), Arrow's hash group-by."""
    return table.group_by(attributes).aggregate([([], "count_all")])


@dataclass(frozen=True, kw_only=True)
class EncodedGroups:
    """The input's distinct key combinations mapped to cells.

    Confidential (it holds exact group counts): it exists only inside :func:`count_cells` and
    ``dprelease check``; the masks are per group, O(groups).
    """

    counts: np.ndarray
    index: tuple[np.ndarray, ...]
    null: dict[str, np.ndarray]
    """Per attribute: the group's value in that column is null."""
    outside: dict[str, np.ndarray]
    """Per attribute: the group's value is not null and outside the public domain."""

    @property
    def valid(self) -> np.ndarray:
        valid = np.ones(self.counts.size, dtype=bool)
        for name in self.null:
            valid &= ~(self.null[name] | self.outside[name])
        return valid

    @property
    def null_columns(self) -> set[str]:
        return {name for name, mask in self.null.items() if mask.any()}

    @property
    def outside_columns(self) -> set[str]:
        return {name for name, mask in self.outside.items() if mask.any()}


def encode_groups(groups: pa.Table, spec: ReleaseSpec) -> EncodedGroups:
    """Cell index, null and out-of-domain masks per group. O(groups × attributes), numpy."""
    index, null, outside = [], {}, {}
    for name, attribute in spec.domain.items():
        column = groups[name]
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        values = column.fill_null(_fill_value(column.type)).to_numpy(zero_copy_only=False)
        cell, in_domain = attribute.encode(values)
        index.append(cell)
        null[name] = nulls
        outside[name] = ~in_domain & ~nulls
    return EncodedGroups(
        counts=groups["count_all"].to_numpy().astype(np.float64),
        index=tuple(index),
        null=null,
        outside=outside,
    )


def null_values_error(name: str) -> DataError:
    return DataError(
        f"column {name!r} has null values; the domain has no null cell: set on_out_of_domain: "
        f"drop to leave those rows out, or fix the data; {CUSTODIAN_HINT}"
    )


def outside_domain_error(name: str, spec: ReleaseSpec) -> DataError:
    return DataError(
        f"column {name!r} has values outside the public domain {describe(spec.domain[name])}: "
        "set on_out_of_domain: drop to leave those rows out, or fix the data or the domain; "
        f"{CUSTODIAN_HINT}"
    )


def check_in_domain(spec: ReleaseSpec, *, null: set[str], outside: set[str]) -> None:
    """With ``on_out_of_domain: error``, refuse the first domain column with a null or with a
    value outside the domain (by column and rule only)."""
    if spec.on_out_of_domain != "error":
        return
    for name in spec.domain:
        if name in null:
            raise null_values_error(name)
        if name in outside:
            raise outside_domain_error(name, spec)


@dataclass(frozen=True, kw_only=True)
class PeriodRows:
    """The rows of one declared period of a column series: ``column == value``.  Public (the
    spec's declaration); ``label`` names the period in messages (``period 3 (2026-03)``)."""

    column: str
    value: str | int
    label: str

    def expression(self) -> ds.Expression:
        import pyarrow.dataset as ds  # loaded already: a dataset is open

        return ds.field(self.column) == self.value


def period_rows(spec: ReleaseSpec, period: int) -> PeriodRows:
    """The rows of ``period`` (0-based) of the spec's column series."""
    columns = _period_columns(spec)
    if columns is None:
        raise ValueError(f"spec {spec.name!r} has no column periods")
    value = columns.values[period]
    return PeriodRows(column=columns.column, value=value, label=f"period {period + 1} ({value})")


def check_period_values(spec: ReleaseSpec) -> None:
    """With ``on_out_of_domain: error``, refuse a source whose period column holds a null or a
    value that is no declared period (named by column and rule only, never the value); with
    ``drop`` those rows are left out by every period's filter and nothing is read here.
    O(rows) Arrow over one column."""
    columns = _period_columns(spec)
    if columns is None or spec.on_out_of_domain != "error":
        return
    names, partitioned_dir = list_source_files(str(spec.dataset.source))
    dataset = open_dataset(
        SourceFiles(files=names, fingerprint="", partitioned_dir=partitioned_dir), spec
    )
    check_schema(dataset, spec)
    distinct = pc.unique(read_columns(dataset, [columns.column])[columns.column])
    if distinct.null_count:
        raise DataError(
            f"column {columns.column!r} (series.period.column) has null values; each row must "
            "belong to a declared period: set on_out_of_domain: drop to leave those rows out, "
            f"or fix the data; {CUSTODIAN_HINT}"
        )
    declared = pa.array(columns.values, type=distinct.type)
    if not pc.all(pc.is_in(distinct, value_set=declared)).as_py():
        raise DataError(
            f"column {columns.column!r} (series.period.column) has values that are not "
            "series.period.values: set on_out_of_domain: drop to leave those rows out, or fix "
            f"the data or declare the period; {CUSTODIAN_HINT}"
        )


def counts_fingerprint(counts: Any, *, key: CatalogKey | None = None) -> str:
    """HMAC-SHA256, under the catalog key, of a period's exact counts (a cell vector, or the
    measured marginal tables keyed by axes): what a column series records for each period.

    Independent of file layout and row order, and equal for ``engine: local`` and ``dask`` (exact
    integer sums).  It changes with every row moved to another cell, i.e. with every change that
    would change a published figure.  Privacy: keyed, never a plain hash, so a recorded
    fingerprint cannot confirm guessed counts.  O(cells counted)."""

    def parts() -> Iterator[bytes]:
        yield b"dprelease-period-counts/1\0"
        tables = counts if isinstance(counts, dict) else {None: counts}
        for axes in sorted(tables, key=repr):
            yield repr(axes).encode() + b"\0"
            yield np.ascontiguousarray(np.ravel(tables[axes]), dtype="<f8").tobytes()

    return (key or catalog_key(default_url())).fingerprint(parts())


@dataclass(frozen=True, kw_only=True)
class Counted:
    """Public facts about a counted input: its files and their keyed fingerprint."""

    input_fingerprint: str
    files: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class CountResult(Counted):
    cells: ProtectedCells


def open_source(
    spec: ReleaseSpec,
    hashing_pool: ThreadPoolExecutor,
    *,
    key: CatalogKey | None,
    rows: PeriodRows | None,
) -> tuple[SourceFiles, ds.Dataset, Future[str] | None]:
    """The source's files opened as one dataset, its schema checked (footers only), and their
    keyed fingerprint hashing on ``hashing_pool`` meanwhile (None for ``rows``, one period of a
    column series: its counts are fingerprinted instead).  O(files) here, O(bytes) on the pool."""
    names, partitioned_dir = list_source_files(str(spec.dataset.source))
    hashing = (
        None
        if rows is not None
        else hashing_pool.submit(content_fingerprint, names, partitioned_dir, key=key)
    )
    files = SourceFiles(files=names, fingerprint="", partitioned_dir=partitioned_dir)
    dataset = open_dataset(files, spec)
    check_schema(dataset, spec)
    return files, dataset, hashing


def read_and_encode(
    spec: ReleaseSpec, *, key: CatalogKey | None = None, rows: PeriodRows | None = None
) -> tuple[EncodedGroups, tuple[str, ...], str]:
    """Read the source once, bound contributions, group and encode the rows over the domain, and
    apply ``on_out_of_domain``; return the encoded groups, the files and their keyed fingerprint.
    ``rows``: only one period's rows of a column series (bounded within it; no file fingerprint,
    ``""``: the caller fingerprints the period's counts, :func:`counts_fingerprint`).

    The one read path of every central input (cells or marginals).  Confidential output; every
    problem is a :class:`DataError` naming the column and the rule only.  O(rows) Arrow work; the
    fingerprint is hashed on a second thread meanwhile (hashlib releases the GIL).
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        files, dataset, hashing = open_source(spec, pool, key=key, rows=rows)
        table = read_columns(dataset, input_columns(spec), rows=rows)
        input_fingerprint = "" if hashing is None else hashing.result()
    if table.num_rows == 0:
        raise no_rows_error(spec, rows)
    person = spec.privacy_unit.person_column
    if person is not None:
        table = bound_contributions(
            table, person_column=person, max_rows=spec.privacy_unit.max_rows or 1
        )
    encoded = encode_groups(group_counts(table, list(spec.domain)), spec)
    check_in_domain(spec, null=encoded.null_columns, outside=encoded.outside_columns)
    return encoded, files.files, input_fingerprint


def no_rows_error(spec: ReleaseSpec, rows: PeriodRows | None) -> DataError:
    if rows is None:
        return DataError(f"input {spec.dataset.source!r} has no rows")
    return DataError(
        f"input {spec.dataset.source!r} has no rows of {rows.label} (column {rows.column!r}): "
        "deliver that period's data before releasing it"
    )


def count_cells(
    spec: ReleaseSpec, *, key: CatalogKey | None = None, rows: PeriodRows | None = None
) -> CountResult:
    """Read, check, bound contributions and count the spec's source into protected cells.

    ``key`` is the catalog's fingerprint key (default: the default catalog's); ``rows``: one
    period of a column series, fingerprinted by its counts (:func:`counts_fingerprint`).

    Privacy: every input problem raises a :class:`DataError` that names the column and the rule,
    never a count, a row or a raw value (those would be an unnoised release, and the message
    reaches Prefect's database and logs).  The exact figures are for the data custodian's local
    ``dprelease check``.  Whether a problem exists at all is the only thing a refusal reveals.
    """
    check_runnable(spec)
    encoded, files, input_fingerprint = read_and_encode(spec, key=key, rows=rows)
    valid = encoded.valid
    flat = np.ravel_multi_index(tuple(ix[valid] for ix in encoded.index), spec.domain_shape)
    cells = np.bincount(flat, weights=encoded.counts[valid], minlength=spec.num_cells)  # O(groups)
    if rows is not None:
        input_fingerprint = counts_fingerprint(cells, key=key)
    protected = protect(ProtectedCells, cells, spec)
    return CountResult(cells=protected, input_fingerprint=input_fingerprint, files=files)


def protect(choke_point: Any, counts: Any, spec: ReleaseSpec) -> Any:
    """Counts into their choke point (``ProtectedCells`` or ``ProtectedMarginals``)."""
    return choke_point(
        counts,
        domain_shape=spec.domain_shape,
        contribution_bound=spec.privacy_unit.contribution_bound,
    )


def person_rows(persons: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """For non-null person ids: each row's rank among its person's rows (file order) and the row
    count of every person. O(rows log rows)."""
    codes = pc.dictionary_encode(persons).combine_chunks().indices.to_numpy()
    if codes.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_codes)) + 1]
    run_lengths = np.diff(np.r_[starts, sorted_codes.size])
    rank = np.empty(sorted_codes.size, dtype=np.int64)
    rank[order] = np.arange(sorted_codes.size) - np.repeat(starts, run_lengths)
    return rank, run_lengths


def bound_contributions(table: pa.Table, *, person_column: str, max_rows: int) -> pa.Table:
    """Keep at most ``max_rows`` rows per person (the first ones in file order). O(rows log rows).

    Privacy: after this, adding or removing one person changes at most ``max_rows`` cell counts by
    one each, which is the contribution bound every sensitivity is multiplied by.  Which rows are
    kept depends only on that person's own rows, so bounding is stable under neighbouring inputs.
    Rows over the bound are dropped silently: how many there were is confidential."""
    persons = table[person_column]
    if persons.null_count:
        raise null_persons_error(person_column)
    rank, _ = person_rows(persons)
    return table.filter(pa.array(rank < max_rows)).drop_columns([person_column])


def null_persons_error(person_column: str) -> DataError:
    return DataError(
        f"person column {person_column!r} has null values; every row needs the id of its "
        f"person: fix the data; {CUSTODIAN_HINT}"
    )


def _fill_value(column_type: pa.DataType) -> Any:
    if pa.types.is_string(column_type) or pa.types.is_large_string(column_type):
        return ""
    return 0


def describe(attribute: Any) -> str:
    """The public domain of one attribute, for messages."""
    if isinstance(attribute, IntegerRange):
        return f"integers {attribute.min}..{attribute.max}"
    if isinstance(attribute, NumericBins):
        pairs = attribute.pairs()
        return f"bins covering [{pairs[0, 0]:g}, {pairs[-1, 1]:g}]"
    return f"values {attribute.values}"
