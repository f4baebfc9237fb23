"""Counting on a Dask cluster: each worker counts its own Parquet files, the partials are summed.

The same input checks and contribution bounding as ``source`` (its own functions), so ``engine:
dask`` and ``engine: local`` accept and refuse the same inputs and give exactly the same counts
(integer sums in float64, exact below 2⁵³).  The driver checks every footer (no row read) and
submits one task per file; a worker streams its file (:func:`count_files`) and returns its partial
counts and *flags*, never raising on the data, so the driver raises exactly the error the local
path would, in the same order.

Person-level bounding (``privacy_unit.person_column``) needs all rows of a person together.  This
module does not shuffle: it refuses unless the spec declares ``privacy_unit.persons_colocated:
true`` (every person's rows are in one file); a worker then reads one whole file's columns and
bounds within it, which keeps the same rows as the local path (file order within the file).

Privacy: no raw row leaves a worker.  Partials (exact counts) travel from workers to the driver
over Dask's own connections only, are summed there into the :class:`ProtectedCells` /
:class:`ProtectedMarginals` choke point and released from the cluster at once; they never go to
a log, a message, a Prefect result (the ingest task persists nothing) or Dask's dashboard."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from dprelease.catalog.confidential.choke_point import ProtectedCells, ProtectedMarginals
from dprelease.catalog.confidential.marginal_source import (
    MarginalCountResult,
    check_marginals_runnable,
    project_marginals,
)
from dprelease.catalog.confidential.source import (
    CountResult,
    PeriodRows,
    bound_contributions,
    check_in_domain,
    counts_fingerprint,
    decode_dictionaries,
    encode_groups,
    group_counts,
    input_columns,
    no_rows_error,
    null_persons_error,
    open_source,
    protect,
    unreadable,
)
from dprelease.catalog.engine import open_cluster
from dprelease.catalog.errors import SpecError
from dprelease.catalog.keys import CatalogKey
from dprelease.catalog.spec.domain import NumericBins
from dprelease.catalog.spec.load import check_runnable
from dprelease.catalog.spec.model import ReleaseSpec

if TYPE_CHECKING:
    from distributed import Client

BATCH_ROWS = 1 << 20
"""Rows per streamed batch on a worker: O(BATCH_ROWS × columns) Arrow memory per task."""

COMPACT_ENTRIES = 1 << 23
"""Sparse entries a worker's partial cell vector holds before merging duplicates (O(n log n))."""

Subsets = tuple[tuple[int, ...], ...]


@dataclass(kw_only=True)
class CellCounts:
    """A worker's partial cell vector: sparse (flat cell, count) runs while they are smaller than
    the dense vector of ``size`` cells, dense after.  What crosses the network is O(min(cells
    touched, cells)), not O(cells) per file.  Confidential; never printed."""

    size: int
    dense: np.ndarray | None = None
    flat: list[np.ndarray] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)
    entries: int = 0

    def __repr__(self) -> str:  # privacy: counts never print
        return f"CellCounts(size={self.size}, <redacted>)"

    def add(self, flat: np.ndarray, counts: np.ndarray) -> None:
        """O(groups) amortised; densifies once sparse storage would outgrow the dense vector."""
        if self.dense is None:
            self.flat.append(flat)
            self.counts.append(counts)
            self.entries += flat.size
            if self.entries > COMPACT_ENTRIES:
                self.compact()
            if self.entries > self.size // 2:  # 16 bytes an entry vs 8 bytes a cell
                self.dense = np.zeros(self.size)
                self.add_to(self.dense)
                self.flat, self.counts, self.entries = [], [], 0
            return
        np.add.at(self.dense, flat, counts)

    def compact(self) -> None:
        """Merge duplicate cells of the sparse runs. O(entries log entries)."""
        if self.dense is not None or len(self.flat) < 2:
            return
        cells, inverse = np.unique(np.concatenate(self.flat), return_inverse=True)
        self.flat = [cells]
        self.counts = [np.bincount(inverse, weights=np.concatenate(self.counts))]
        self.entries = cells.size

    def add_to(self, total: np.ndarray) -> None:
        """Add this partial into the dense ``total``. O(entries) or O(cells)."""
        if self.dense is not None:
            total += self.dense
        for flat, counts in zip(self.flat, self.counts, strict=True):
            np.add.at(total, flat, counts)


@dataclass(kw_only=True)
class Partial:
    """One worker's confidential partial counts and public-rule flags for its files.

    ``counts`` is a cell vector (``subsets is None``) or marginal tables by axes.  Never logged;
    exists on a worker and, until summed, on the driver.
    """

    counts: Any
    any_rows: bool = False
    null_person: bool = False
    null: set[str] = field(default_factory=set)
    outside: set[str] = field(default_factory=set)

    def __repr__(self) -> str:  # privacy: counts never print
        return "Partial(<redacted>)"

    def add(self, other: Partial) -> None:
        if isinstance(other.counts, CellCounts):
            other.counts.add_to(self.counts)
        else:
            for axes, table in other.counts.items():
                self.counts[axes] = self.counts[axes] + table
        self.any_rows |= other.any_rows
        self.null_person |= other.null_person
        self.null |= other.null
        self.outside |= other.outside


def count_cells_dask(
    spec: ReleaseSpec,
    *,
    key: CatalogKey | None = None,
    client: Client | None = None,
    rows: PeriodRows | None = None,
) -> CountResult:
    """``source.count_cells`` on the cluster of ``spec.execution`` (or ``client``)."""
    check_runnable(spec)
    total, files, fingerprint = _count(spec, subsets=None, key=key, client=client, rows=rows)
    protected = protect(ProtectedCells, total, spec)
    return CountResult(cells=protected, input_fingerprint=fingerprint, files=files)


def count_marginals_dask(
    spec: ReleaseSpec,
    *,
    subsets: Sequence[tuple[int, ...]],
    output_rows: int,
    key: CatalogKey | None = None,
    client: Client | None = None,
    rows: PeriodRows | None = None,
) -> MarginalCountResult:
    """``marginal_source.count_marginals`` on the cluster of ``spec.execution``."""
    check_marginals_runnable(spec, subsets=subsets, output_rows=output_rows)
    axes = tuple(dict.fromkeys(tuple(int(a) for a in s) for s in subsets))
    tables, files, fingerprint = _count(spec, subsets=axes, key=key, client=client, rows=rows)
    protected = protect(ProtectedMarginals, tables, spec)
    return MarginalCountResult(marginals=protected, input_fingerprint=fingerprint, files=files)


def check_colocated(spec: ReleaseSpec) -> None:
    """Refuse person-level bounding on a cluster unless persons are declared co-located."""
    unit = spec.privacy_unit
    if unit.person_column is not None and not unit.persons_colocated:
        raise SpecError(
            f"privacy_unit.person_column ({unit.person_column!r}) with execution.engine: dask "
            "needs privacy_unit.persons_colocated: true: workers bound contributions file by "
            "file, which is only correct when all rows of one person are in one input file; "
            "declare it if the data custodian guarantees it, or run with engine: local"
        )


def _count(
    spec: ReleaseSpec,
    *,
    subsets: Subsets | None,
    key: CatalogKey | None,
    client: Client | None,
    rows: PeriodRows | None = None,
) -> tuple[Any, tuple[str, ...], str]:
    """``rows``: one period of a column series, filtered on the workers' scans and fingerprinted
    by its counts (``source.counts_fingerprint``, equal to the local reader's)."""
    check_colocated(spec)
    with ThreadPoolExecutor(max_workers=1) as pool:
        files, dataset, hashing = open_source(spec, pool, key=key, rows=rows)  # on the driver
        paths, pruned_rows = _select_fragments(dataset, spec)
        job = CountJob(
            spec=spec,
            subsets=subsets,
            partitioning=getattr(dataset, "partitioning", None),
            partitioned_dir=files.partitioned_dir,
            rows=rows,
        )
        with open_cluster(spec.execution) if client is None else nullcontext(client) as active:
            if active is None:
                raise SpecError(
                    "execution.engine is 'local': count with catalog.confidential.source, "
                    "not on a cluster"
                )
            total = _run(active, paths, job)
        fingerprint = "" if hashing is None else hashing.result()
    total.any_rows |= pruned_rows
    _raise_input_problems(total, spec, rows)
    if rows is not None:
        fingerprint = counts_fingerprint(total.counts, key=key)
    return total.counts, files.files, fingerprint


def _select_fragments(dataset: ds.Dataset, spec: ReleaseSpec) -> tuple[list[str], bool]:
    """The files to count, and whether a pruned file had rows.  With ``drop`` and no person
    column, a file whose hive key is outside the domain is skipped (all its rows would be
    dropped).  O(files), footers only."""
    prune = spec.on_out_of_domain == "drop" and spec.privacy_unit.person_column is None
    paths: list[str] = []
    pruned_rows = False
    for fragment in dataset.get_fragments():
        if prune and not _in_domain(fragment, spec):
            try:
                pruned_rows |= fragment.metadata.num_rows > 0
            except (pa.ArrowException, OSError):
                raise unreadable(repr(fragment.path)) from None
            continue
        paths.append(fragment.path)
    return paths, pruned_rows


def _in_domain(fragment: ds.Fragment, spec: ReleaseSpec) -> bool:
    """False when one of the fragment's hive keys is a (non-null) value outside the domain."""
    keys = ds.get_partition_keys(fragment.partition_expression)
    for name, value in keys.items():
        if name in spec.domain and value is not None:
            _, in_domain = spec.domain[name].encode(np.array([value]))
            if not in_domain[0]:
                return False
    return True


@dataclass(frozen=True, kw_only=True)
class CountJob:
    """What every worker task needs besides its files: how to open them and what to count."""

    spec: ReleaseSpec
    subsets: Subsets | None
    partitioning: ds.Partitioning | None
    partitioned_dir: str | None
    rows: PeriodRows | None = None
    """One period of a column series (its filter is built on the worker)."""


def _run(client: Client, paths: list[str], job: CountJob) -> Partial:
    """One task per file; partials summed on the driver as they complete. O(files × cells)."""
    from distributed import as_completed

    total = _empty(job)
    # pure=False: never served from another run's memory
    futures = [client.submit(count_files, [path], job, pure=False, retries=0) for path in paths]
    try:
        for future in as_completed(futures, loop=client.loop):
            total.add(future.result())
            future.release()  # privacy: the partial leaves the cluster's memory at once
    finally:
        client.cancel(futures)
    return total


def _empty(job: CountJob, *, on_worker: bool = False) -> Partial:
    """Zero counts: the cell vector (its spec passed ``check_runnable``: ≤ 1e18 cells), or only
    the measured tables, O(Σ their cells) whatever the product of the domain (tested at 1e25)."""
    if job.subsets is None:
        size = job.spec.num_cells
        return Partial(counts=CellCounts(size=size) if on_worker else np.zeros(size))
    shape = job.spec.domain_shape
    return Partial(
        counts={
            axes: np.zeros(tuple(shape[a] for a in axes)).ravel() if axes else np.array(0.0)
            for axes in job.subsets
        }
    )


def count_files(paths: list[str], job: CountJob) -> Partial:
    """Worker side: stream ``paths`` and return their partial counts and flags.

    Without a person column, batch by batch (O(BATCH_ROWS + cells) memory); with one, file by
    file (a file's input columns must fit in a worker's memory).  Rows are checked and bounded
    exactly as ``source.read_and_encode`` does.
    """
    spec = job.spec
    try:
        dataset = ds.dataset(
            paths,
            format="parquet",
            partitioning=job.partitioning,
            partition_base_dir=job.partitioned_dir,
        )
        partial = _empty(job, on_worker=True)
        columns = input_columns(spec)
        for fragment in dataset.get_fragments():
            batches = fragment.to_batches(
                schema=dataset.schema,
                columns=columns,
                batch_size=BATCH_ROWS,
                filter=None if job.rows is None else job.rows.expression(),
            )
            if spec.privacy_unit.person_column is None:
                for batch in batches:
                    _add_table(partial, pa.Table.from_batches([batch]), job)
            else:
                schema = pa.schema([dataset.schema.field(name) for name in columns])
                table = pa.Table.from_batches(list(batches), schema=schema)
                _add_table(partial, table, job)
    except (pa.ArrowException, OSError):
        raise unreadable("the input") from None  # Arrow's text may quote raw values
    if isinstance(partial.counts, CellCounts):
        partial.counts.compact()
    return partial


def _add_table(partial: Partial, table: pa.Table, job: CountJob) -> None:
    """Bound, group, encode and add one table's rows to ``partial``. O(rows) Arrow + O(groups)."""
    if table.num_rows == 0:
        return
    partial.any_rows = True
    table = decode_dictionaries(table)
    spec = job.spec
    person = spec.privacy_unit.person_column
    if person is not None:
        if table[person].null_count:
            partial.null_person = True
            return
        max_rows = spec.privacy_unit.max_rows or 1
        table = bound_contributions(table, person_column=person, max_rows=max_rows)
    table, coded = _prebin(table, spec)
    encoded = encode_groups(group_counts(table, list(spec.domain)), coded)
    partial.null |= encoded.null_columns
    partial.outside |= encoded.outside_columns
    valid = encoded.valid
    index = [axis_index[valid] for axis_index in encoded.index]
    counts = encoded.counts[valid]
    if job.subsets is None:
        flat = np.ravel_multi_index(tuple(index), spec.domain_shape)
        partial.counts.add(flat, counts)  # O(groups), not O(cells) per batch
        return
    tables = project_marginals(index, counts, shape=spec.domain_shape, subsets=job.subsets)
    for axes, table_counts in tables.items():
        partial.counts[axes] = partial.counts[axes] + table_counts


class _BinCodes:
    """A numeric-bins column already replaced by its bin index (−1: outside the bins)."""

    def encode(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.maximum(codes, 0), codes >= 0


def bin_codes(attribute: NumericBins, values: np.ndarray) -> np.ndarray:
    """Each value's bin index, −1 outside the bins (NaN too): ``attribute.encode`` in one
    ``searchsorted`` for edge bins (the last bin closed), ``encode`` itself for pairs.
    O(values log bins); equal to ``encode`` (tested on edges, NaN and ±inf)."""
    if isinstance(attribute.bins[0], list):
        cell, in_domain = attribute.encode(values)
        return np.where(in_domain, cell, -1)
    edges = np.asarray(attribute.bins, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    last = edges.size - 2
    cell = np.searchsorted(edges, values, side="right") - 1
    cell[values == edges[-1]] = last  # the closed upper edge
    cell[cell > last] = -1  # above the last edge, and NaN (sorted past every edge)
    return cell


def _prebin(table: pa.Table, spec: ReleaseSpec) -> tuple[pa.Table, ReleaseSpec]:
    """Numeric-bins columns replaced by their bin index before grouping (nulls stay null), with
    the spec whose domain decodes those indices: a float column's near-unique values would make
    one group per row; its bins make at most one per cell.  The bins' own ``encode`` runs on every
    value (elementwise, so the cells, nulls and out-of-domain values are those of grouping
    first).  O(rows log bins) per bins column."""
    binned = {name: a for name, a in spec.domain.items() if isinstance(a, NumericBins)}
    if not binned:
        return table, spec
    for name, attribute in binned.items():
        column = table[name]
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        values = column.fill_null(0).to_numpy(zero_copy_only=False)
        codes = pa.array(bin_codes(attribute, values), pa.int64(), mask=nulls)
        table = table.set_column(table.schema.get_field_index(name), name, codes)
    domain = {name: _BinCodes() if name in binned else a for name, a in spec.domain.items()}
    return table, spec.model_copy(update={"domain": domain})  # decoding only; never validated


def _raise_input_problems(total: Partial, spec: ReleaseSpec, rows: PeriodRows | None) -> None:
    """The error ``source.read_and_encode`` raises for the same input, if any."""
    if not total.any_rows:
        raise no_rows_error(spec, rows)
    person = spec.privacy_unit.person_column
    if total.null_person and person is not None:
        raise null_persons_error(person)
    check_in_domain(spec, null=total.null, outside=total.outside)
