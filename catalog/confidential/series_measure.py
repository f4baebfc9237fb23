"""One period of a series: the periods' protected counts, read period by period and combined
inside the boundary as the time strategy's row asks (``Σ_s A[t,s]·x_s``); only the noise leaves.

A period is a file of the source (``series.period: file``), read with the file as the spec's
source, or the rows of one declared value of the period column (``{column, values}``), read from
the whole source with that filter pushed into the scan.  Each is read by the reader of the cell
mechanism's input kind (:data:`READERS`); the combination is made by the choke point's own
``combination`` (:class:`~catalog.confidential.choke_point.ProtectedCells`,
:class:`~catalog.confidential.choke_point.ProtectedMarginals`), which holds the charge-per-unit-
weight obligation the series accountant meets.  O(periods read × (rows + cells)); a column
period scans the whole source with its filter (row groups and hive folders of other periods are
skipped by the scan), plus one scan of the period column per release under
``on_out_of_domain: error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dprelease.catalog.confidential.inputs import READERS, Ingested
from dprelease.catalog.confidential.source import check_period_values, period_rows
from dprelease.catalog.errors import DataError
from dprelease.catalog.keys import CatalogKey
from dprelease.catalog.spec.model import ReleaseSpec


def read_period(
    spec: ReleaseSpec, plan: Any, path: str, *, key: CatalogKey, period: int | None = None
) -> Ingested:
    """The protected counts of one period: its file (the spec with ``path`` as its source), or,
    for column periods, the rows of ``period`` (0-based) in the spec's source, whose
    ``input_fingerprint`` is then the keyed fingerprint of its counts (layout-independent)."""
    if spec.series is not None and spec.series.columns is not None:
        if period is None:
            raise ValueError("a column series reads a period by its index")
        reader = READERS[plan.mechanism.input_kind]
        return reader(spec, plan, key, rows=period_rows(spec, period))
    single = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"source": path})})
    return READERS[plan.mechanism.input_kind](single, plan, key)


def combined_periods(
    spec: ReleaseSpec,
    plan: Any,
    paths: Sequence[str],
    weights: Sequence[float],
    *,
    key: CatalogKey,
    fingerprints: Sequence[str | None],
    periods: Sequence[int] | None = None,
) -> tuple[Any, list[str]]:
    """``Σ weights[s]·x_s`` over the periods read, protected, and each period's keyed fingerprint.

    ``fingerprints``: what each period had when it was released (None: the new period); a period
    whose content changed since is refused (:class:`DataError`) before anything is measured or
    charged.  ``periods``: their indices (0-based; needed for column periods, whose source's
    period column is checked first: a null or undeclared value is refused under
    ``on_out_of_domain: error``)."""
    columns = None if spec.series is None else spec.series.columns
    if columns is not None:
        if periods is None or len(periods) != len(paths):
            raise ValueError("a column series names the index of every period it reads")
        check_period_values(spec)
    indices: Sequence[int | None] = periods if periods is not None else [None] * len(paths)
    total: Any = None
    seen = []
    # one period held at a time besides the running sum: memory O(2 · cells), not O(periods · cells)
    for path, recorded, weight, period in zip(paths, fingerprints, weights, indices, strict=True):
        ingested = read_period(spec, plan, path, key=key, period=period)
        if recorded is not None and ingested.input_fingerprint != recorded:
            what, restore = (
                (f"the file of a released period ({path!r})", "the file")
                if columns is None or period is None
                else (
                    f"the rows of released period {period + 1} ({columns.values[period]}) in "
                    f"column {columns.column!r}",
                    "that period's rows",
                )
            )
            raise DataError(
                f"series {spec.name!r}: {what} changed since its release (its keyed fingerprint "
                f"differs); published figures never change, so this release is refused: restore "
                f"{restore} as released"
            )
        part = ingested.data
        total = (
            type(part).combination([part], [weight])
            if total is None
            else type(part).combination([total, part], [1.0, weight])
        )
        seen.append(ingested.input_fingerprint)
    if total is None:
        raise ValueError("a series period reads at least one period's file")
    return total, seen
