"""``dprelease check SPEC``: the data custodian's exact view of what is wrong with a release input.

A release (``source``) names an input problem by column and rule only, because its
messages reach Prefect's database, logs and the terminal of whoever submitted the spec.  The
custodian, who may see the data, needs the figures to fix it: this module reads the spec's source
the same way a release does (same files, same schema rules, same cell encoding, same contribution
bounding) and returns the exact counts per problem, with example values.

CONFIDENTIAL: the report holds exact counts and raw values.  It is printed to the terminal by the
CLI and stored nowhere: no file, no catalog row, no log record, no Prefect (this module never
imports it), no fingerprint (so no catalog key is created)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dprelease.catalog.confidential.source import (
    SchemaProblem,
    SourceFiles,
    bound_contributions,
    decode_dictionaries,
    describe,
    encode_groups,
    group_counts,
    list_source_files,
    open_dataset_unchecked,
    person_rows,
    schema_problems,
)
from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.domain import Categorical
from dprelease.catalog.spec.model import ReleaseSpec

EXAMPLES = 5  # distinct out-of-domain values shown per column, most rows first
CONFIDENTIAL = (
    "CONFIDENTIAL: exact counts and raw values from the input data. For the data custodian only: "
    "do not paste into tickets, chats, logs or release notes. Nothing here was stored."
)


@dataclass(frozen=True, kw_only=True)
class ColumnFindings:
    """Rows of one domain column that a release cannot count (exact, confidential)."""

    column: str
    domain: str
    null_rows: int
    outside_rows: int
    examples: tuple[tuple[Any, int], ...]
    """Up to ``EXAMPLES`` distinct out-of-domain values with their row counts, most rows first."""


@dataclass(frozen=True, kw_only=True)
class ContributionFindings:
    """Rows per person against the spec's bound (exact, confidential)."""

    person_column: str
    max_rows: int
    persons: int
    null_person_rows: int
    persons_over: int
    rows_over: int
    largest: int


@dataclass(frozen=True, kw_only=True)
class CheckReport:
    """Everything ``dprelease check`` found.  ``problems`` lists each finding as one line."""

    source: str
    files: tuple[str, ...]
    on_out_of_domain: str
    schema: tuple[SchemaProblem, ...] = ()
    read_error: str | None = None
    rows: int | None = None
    columns: tuple[ColumnFindings, ...] = ()
    contributions: ContributionFindings | None = None
    rows_counted: int | None = None

    @property
    def problems(self) -> list[str]:
        """Every problem with its exact figures and example values.

        Privacy: the one sanctioned place where un-noised counts and raw values are formatted (the
        custodian's local check).  The lines go to the custodian's terminal only, via
        ``format_report``; never into an exception, a log record, a file or Prefect."""
        found = [f"{_where(p)}: {p.message.split(';')[0]} ({p.detail})" for p in self.schema]
        if self.read_error is not None:
            found.append(f"cannot read the input as Parquet: {self.read_error}")
        if self.rows == 0:
            found.append("the input has no rows (a release refuses it)")
        outcome = (
            "on_out_of_domain: drop, so a release leaves these rows out"
            if self.on_out_of_domain == "drop"
            else "a release refuses the input; on_out_of_domain: drop would leave them out"
        )
        for c in self.columns:
            if c.null_rows:
                found.append(f"column {c.column!r}: {c.null_rows:,} null row(s) ({outcome})")
            if c.outside_rows:
                shown = ", ".join(f"{value!r} ({rows:,} rows)" for value, rows in c.examples)
                found.append(
                    f"column {c.column!r}: {c.outside_rows:,} row(s) outside {c.domain} "
                    f"({outcome}); e.g. {shown}"
                )
        bound = self.contributions
        if bound is not None and bound.null_person_rows:
            found.append(
                f"person column {bound.person_column!r}: {bound.null_person_rows:,} row(s) with a "
                "null person id (a release refuses the input)"
            )
        if bound is not None and bound.persons_over:
            found.append(
                f"person column {bound.person_column!r}: {bound.persons_over:,} of "
                f"{bound.persons:,} person(s) have more than max_rows = {bound.max_rows} rows "
                f"(at most {bound.largest:,}); a release keeps each one's first {bound.max_rows} "
                f"rows and leaves {bound.rows_over:,} row(s) out"
            )
        return found


def check_data(spec: ReleaseSpec) -> CheckReport:
    """Read the spec's source as a release would and measure every problem exactly.

    Carries on past a problem where it can (a wrong-typed column is left out of the value checks;
    the others are still counted).  O(rows log rows) for bounding, O(rows) for the rest; reads only
    the spec's columns.  Confidential result: print it, never store or log it.
    """
    if spec.model != "central":
        raise SpecError(
            "dprelease check covers central-model specs, whose source holds confidential rows; "
            "a model: local source holds randomised responses"
        )
    if spec.dataset.source is None:
        raise SpecError("dataset.source is not set in the spec: there is no data to check")
    names, partitioned_dir = list_source_files(spec.dataset.source)
    base = CheckReport(
        source=spec.dataset.source, files=names, on_out_of_domain=spec.on_out_of_domain
    )
    files = SourceFiles(files=names, fingerprint="", partitioned_dir=partitioned_dir)
    try:
        dataset = open_dataset_unchecked(files, spec)
    except (pa.ArrowException, OSError) as exc:
        return replace(base, read_error=str(exc))
    base = replace(base, schema=tuple(schema_problems(dataset, spec)))
    unusable = {p.column for p in base.schema}
    if None in unusable:  # an unreadable file: no rows can be trusted
        return base
    person = spec.privacy_unit.person_column
    domain = dict(spec.domain)
    series_columns = None if spec.series is None else spec.series.columns
    if series_columns is not None:  # a column series' period column: its declared values
        domain[series_columns.column] = Categorical(values=list(series_columns.values))
    attributes = [name for name in domain if name not in unusable]
    columns = attributes + ([person] if person and person not in unusable else [])
    try:
        table = dataset.to_table(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        return replace(base, read_error=str(exc))
    table = decode_dictionaries(table)
    if not attributes:
        return replace(base, rows=table.num_rows)
    # the data's problems are counted over every row (what the custodian must fix) ...
    checked = spec.model_copy(update={"domain": {n: domain[n] for n in attributes}})
    groups = group_counts(table, attributes)
    encoded = encode_groups(groups, checked)
    findings = tuple(
        ColumnFindings(
            column=name,
            domain=describe(domain[name]),
            null_rows=int(encoded.counts[encoded.null[name]].sum()),
            outside_rows=int(encoded.counts[encoded.outside[name]].sum()),
            examples=_examples(groups[name], encoded.counts, encoded.outside[name]),
        )
        for name in attributes
    )
    # ... and the rows a release keeps after bounding each person's contribution
    contributions = None
    if person is not None and person not in unusable:
        max_rows = spec.privacy_unit.max_rows or 1
        contributions = _contributions(table[person], person_column=person, max_rows=max_rows)
        with_person = table.filter(pc.is_valid(table[person]))  # what a release counts
        bounded = bound_contributions(with_person, person_column=person, max_rows=max_rows)
        encoded = encode_groups(group_counts(bounded, attributes), checked)
    return replace(
        base,
        rows=table.num_rows,
        columns=findings,
        contributions=contributions,
        rows_counted=None if unusable else int(encoded.counts[encoded.valid].sum()),
    )


def _contributions(
    persons: pa.ChunkedArray, *, person_column: str, max_rows: int
) -> ContributionFindings:
    """Persons over the bound, the rows bounding drops, the largest contribution. O(rows log rows)."""
    _, rows_per_person = person_rows(pc.drop_null(persons))
    over = rows_per_person > max_rows
    return ContributionFindings(
        person_column=person_column,
        max_rows=max_rows,
        persons=int(rows_per_person.size),
        null_person_rows=int(persons.null_count),
        persons_over=int(over.sum()),
        rows_over=int((rows_per_person[over] - max_rows).sum()),
        largest=int(rows_per_person.max(initial=0)),
    )


def _examples(
    column: pa.ChunkedArray, counts: np.ndarray, outside: np.ndarray
) -> tuple[tuple[Any, int], ...]:
    """Distinct out-of-domain values of one column with their row counts, most rows first."""
    if not outside.any():
        return ()
    values = column.filter(pa.array(outside)).to_pylist()
    totals: dict[Any, int] = {}
    for value, rows in zip(values, counts[outside], strict=True):
        key = "nan" if isinstance(value, float) and value != value else value
        totals[key] = totals.get(key, 0) + int(rows)
    ranked = sorted(totals.items(), key=lambda item: (-item[1], repr(item[0])))
    return tuple(ranked[:EXAMPLES])


def _where(problem: SchemaProblem) -> str:
    place = f" in {problem.file}" if problem.file else ""
    return f"column {problem.column!r}{place}" if problem.column else f"file {problem.file}"


def format_report(report: CheckReport) -> str:
    """The report as terminal text between CONFIDENTIAL banners."""
    lines = [CONFIDENTIAL, "", f"source: {report.source} ({len(report.files)} file(s))"]
    if report.rows is not None:
        lines.append(f"rows read: {report.rows:,}")
    if report.rows_counted is not None:
        lines.append(f"rows inside the domain and the contribution bound: {report.rows_counted:,}")
    problems = report.problems
    if problems:
        lines.append(f"{len(problems)} problem(s):")
        lines += [f"  - {line}" for line in problems]
    else:
        lines.append("no problems: every row is inside the public domain and within the bound")
    lines += ["", CONFIDENTIAL]
    return "\n".join(lines)
