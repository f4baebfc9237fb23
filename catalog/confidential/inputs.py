"""What the ingest stage hands to measure, and the reader of each input kind.

A mechanism declares the kind of input it measures (``input_kind``): the full cell vector
(``cells``), only the marginals its strategy measures (``marginals``), or local-model responses
(``responses``).  Each reader is the only code that touches that input; it returns the
mechanism's input (confidential for the central model: ``ProtectedCells``/``ProtectedMarginals``,
unpicklable and redacted) with public facts about it.  Fingerprints are keyed with the catalog's
key, never a plain hash of confidential files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dprelease.catalog.confidential.responses import count_responses
from dprelease.catalog.errors import DataError
from dprelease.catalog.keys import CatalogKey
from dprelease.catalog.planning.responses import (
    PRIVACY_UNIT,
    PublishedStrategy,
    check_strategy_fits,
)
from dprelease.catalog.spec.model import ReleaseSpec


@dataclass(frozen=True, kw_only=True)
class Ingested:
    """The mechanism's input and public facts about it (files, keyed fingerprint, privacy unit)."""

    data: Any
    input_fingerprint: str
    files: tuple[str, ...]
    privacy_unit: str


def describe_unit(spec: ReleaseSpec) -> str:
    unit = spec.privacy_unit
    if unit.person_column is not None:
        return f"person column {unit.person_column!r}, at most {unit.max_rows} rows per person"
    return f"{unit.rows_per_person} row(s) per person"


def read_cells(spec: ReleaseSpec, plan: Any, key: CatalogKey, *, rows: Any = None) -> Ingested:
    """``rows``: one period of a column series (``source.PeriodRows``), else every row."""
    if spec.execution.engine == "dask":
        from dprelease.catalog.confidential.dask_count import count_cells_dask as count_cells
    else:
        from dprelease.catalog.confidential.source import count_cells

    counted = count_cells(spec, key=key, rows=rows)
    return _central(spec, counted.cells, counted)


def read_marginals(spec: ReleaseSpec, plan: Any, key: CatalogKey, *, rows: Any = None) -> Ingested:
    """``rows``: one period of a column series (``source.PeriodRows``), else every row."""
    if spec.execution.engine == "dask":
        from dprelease.catalog.confidential.dask_count import (
            count_marginals_dask as count_marginals,
        )
    else:
        from dprelease.catalog.confidential.marginal_source import count_marginals

    counted = count_marginals(
        spec,
        subsets=plan.strategy.marginal_subsets,
        output_rows=plan.num_queries,
        key=key,
        rows=rows,
    )
    return _central(spec, counted.marginals, counted)


def _central(spec: ReleaseSpec, data: Any, counted: Any) -> Ingested:
    """A central reader's protected counts with the public facts of the files they came from."""
    return Ingested(
        data=data,
        input_fingerprint=counted.input_fingerprint,
        files=counted.files,
        privacy_unit=describe_unit(spec),
    )


def read_responses(spec: ReleaseSpec, plan: Any, key: CatalogKey) -> Ingested:
    return ingest_responses(spec, plan.strategy, key=key)


def ingest_responses(
    spec: ReleaseSpec, strategy: PublishedStrategy, *, key: CatalogKey | None = None
) -> Ingested:
    """The release pipeline's ingest for the local model: validated response counts.

    Privacy: reads ε-LDP responses only (true items never leave a device); nothing is charged here,
    so a bad file costs nothing."""
    if spec.dataset.source is None:
        raise DataError(
            "dataset.source is not set in the spec; a local-model release needs the responses"
        )
    check_strategy_fits(spec, strategy)
    counts, files, fingerprint = count_responses(spec.dataset.source, strategy, key=key)
    return Ingested(
        data=counts, input_fingerprint=fingerprint, files=files, privacy_unit=PRIVACY_UNIT
    )


READERS = {"cells": read_cells, "marginals": read_marginals, "responses": read_responses}
