"""Disjoint partitions of a dataset (parallel composition): which partitions a release reads.

A spec may declare ``dataset.partitions: {by: file}`` or ``{by: column, column: NAME}`` (short:
``{column: NAME}``): the dataset's files, or the cells of domain attribute NAME, hold disjoint
sets of people.  The ledger then keeps the dataset's cap for each partition (``catalog.ledger``):
a release is charged once to every partition it reads, and a person's privacy loss is what their
own partition spent.

The declaration is the data owner's assumption; dprelease cannot check it (checking would read
who is in which partition).  If one person is in two partitions, their loss is the *sum* of those
partitions' charges, which may exceed the cap.  The manifest and the report state the assumption
(:func:`assumption`).

Which partitions does a release read?  Only public information decides, never the data:

* ``by: file`` — the names of the files the release's ``dataset.source`` lists (a directory
  listing: names, no bytes).  A file is named by its base name, so an arrival release of
  ``landing/2026-11.parquet`` and a later release of the folder charge the same partition
  ``2026-11.parquet``; two files of one name in different folders share a partition (charged
  together: conservative).  A copy of a file under a new name is a new partition: the
  declaration promises it holds other people.
* ``by: column`` — every cell of attribute NAME in the spec's *domain* (``NAME=<label>``), whether
  or not the data holds rows there: which values occur in the confidential data is never used
  (it would leak through the charges, and rows the domain admits but the data lacks still
  belong to that partition).  A release of one period therefore narrows the domain to that
  period (``period: {values: [2026-11]}``); rows of other periods are out of the domain, so
  they are refused (``on_out_of_domain: error``) or dropped (``drop``) and never counted.
* ``by: column`` on a series' period column (``series.period: {column: NAME, values: [...]}``;
  NAME is the time axis, not a domain attribute) — the declared periods ``NAME=<value>``; a
  series period is charged only the periods its strategy row reads (:func:`charged_partitions`).

Everything here reads the spec and file names only. O(files + cells of NAME).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dprelease.catalog.confidential.source import list_source_files
from dprelease.catalog.errors import SpecError
from dprelease.catalog.ledger.spending import MAX_PARTITIONS_PER_RELEASE
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.catalog.spec.series import period_column_partition


def declaration(spec: ReleaseSpec) -> str | None:
    """What the catalog records of the spec's declaration: ``file``, ``column:NAME`` or None."""
    partitions = spec.dataset.partitions
    return None if partitions is None else partitions.declaration()


def release_partitions(
    spec: ReleaseSpec, *, files: tuple[str, ...] | None = None
) -> tuple[str, ...] | None:
    """The partitions a release of ``spec`` reads (sorted), from public information only (see the
    module docstring); None without a declaration (the whole dataset is charged).

    ``files``: the files the release actually read (the ingest's list: a file that appeared in
    the source folder after the budget check is charged too); default: the source's listing now.

    Raises :class:`SpecError` when the release would read more than
    ``MAX_PARTITIONS_PER_RELEASE`` partitions (each is one ledger entry).
    """
    partitions = spec.dataset.partitions
    if partitions is None:
        return None
    if partitions.by == "file":
        if spec.dataset.source is None:
            raise SpecError(
                "dataset.partitions {by: file} needs dataset.source: the files are the partitions"
            )
        listed = files if files is not None else list_source_files(spec.dataset.source)[0]
        names = tuple(sorted({Path(name).name for name in listed}))
    elif partitions.column == period_column_partition(spec):
        names = tuple(sorted(period_partitions(spec)))
    else:
        column = str(partitions.column)
        names = tuple(sorted({f"{column}={label}" for label in spec.domain[column].labels()}))
    if len(names) > MAX_PARTITIONS_PER_RELEASE:
        what = "files" if partitions.by == "file" else f"cells of domain.{partitions.column}"
        raise SpecError(
            f"dataset.partitions: the release reads {len(names)} partitions ({what}); at most "
            f"{MAX_PARTITIONS_PER_RELEASE} are charged one by one: narrow the source or the "
            "domain, or drop dataset.partitions to charge the whole dataset once"
        )
    return names


def period_partitions(spec: ReleaseSpec) -> list[str]:
    """The partitions of a column series' periods, in period order (``NAME=<value>``); [] for
    any other spec.  Public: the declared values."""
    columns = None if spec.series is None else spec.series.columns
    if columns is None:
        return []
    return [columns.partition(period) for period in range(len(columns.values))]


def charged_partitions(
    spec: ReleaseSpec, *, files: tuple[str, ...] | None, details: dict[str, Any]
) -> tuple[str, ...] | None:
    """The partitions a staged release was charged to (sorted): a series period's own charges
    (``details["series"]["charges"]``, the periods its strategy row read), otherwise
    :func:`release_partitions` of the files read.  None without a declaration."""
    charges = (details.get("series") or {}).get("charges")
    if spec.dataset.partitions is None or not charges:
        return release_partitions(spec, files=files)
    return tuple(sorted(charges))


def assumption(spec: ReleaseSpec) -> str | None:
    """The declared assumption in words (manifest and report); None without a declaration."""
    partitions = spec.dataset.partitions
    if partitions is None:
        return None
    what = (
        "its files (by file name)"
        if partitions.by == "file"
        else f"the periods of column {partitions.column!r}"
        if partitions.column == period_column_partition(spec)
        else f"the cells of column {partitions.column!r}"
    )
    return (
        f"Declared by the spec (dataset.partitions), not checked by dprelease: {what} hold "
        "disjoint sets of people. Under this assumption each partition has the dataset's cap, "
        "and a release is charged once to every partition it reads (parallel composition). If "
        "a person is in two partitions, their privacy loss is the sum of both partitions' "
        "charges."
    )


def manifest_record(spec: ReleaseSpec, touched: tuple[str, ...] | None) -> dict[str, Any] | None:
    """The manifest's ``partitions`` section: the declaration, the assumption in words and the
    partitions this release was charged to (public names); None without a declaration."""
    partitions = spec.dataset.partitions
    if partitions is None or touched is None:
        return None
    return {
        "by": partitions.by,
        "column": partitions.column,
        "assumption": assumption(spec),
        "charged": list(touched),
    }
