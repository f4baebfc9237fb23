"""Parquet source → the marginal tables a plan measures, inside a :class:`ProtectedMarginals`.

For domains whose full cell vector is too large to hold (Adult's 14 attributes: 6.4·10¹⁷ cells),
a marginal-space plan needs only some marginals.  They are counted in one scan: the domain's
columns are read once (and the person column when contributions are bounded), Arrow groups the
rows by all domain attributes (at most one group per row), and numpy projects the distinct
groups onto every needed attribute subset with ``bincount``.  The full cell vector is never
formed: memory is O(groups + Σ marginal sizes).

Input checks and contribution bounding are ``source``'s own functions, so both paths
accept and refuse exactly the same inputs (the checks cover every domain attribute, not only the
measured ones, so both paths count the same rows).

Privacy: as in ``source.count_cells``, a problem is named by column and rule only,
never a count, a row or a raw value; the tables never leave the :class:`ProtectedMarginals`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dprelease.catalog.confidential.choke_point import ProtectedMarginals
from dprelease.catalog.confidential.source import (
    Counted,
    PeriodRows,
    counts_fingerprint,
    protect,
    read_and_encode,
)
from dprelease.catalog.errors import SpecError
from dprelease.catalog.keys import CatalogKey
from dprelease.catalog.spec.limits import MAX_RELEASE_CELLS, MAX_RELEASE_QUERIES
from dprelease.catalog.spec.load import require_source
from dprelease.catalog.spec.model import ReleaseSpec

MAX_MARGINAL_CELLS = MAX_RELEASE_CELLS
"""Cells of all counted marginal tables together (float64: the memory of the largest cell vector)."""


@dataclass(frozen=True, kw_only=True)
class MarginalCountResult(Counted):
    marginals: ProtectedMarginals


def check_marginals_runnable(
    spec: ReleaseSpec, *, subsets: Sequence[tuple[int, ...]], output_rows: int
) -> None:
    """Refuse, from public sizes alone and before any data is read, a marginal-space release this
    machine cannot run: no ``dataset.source``, more than ``MAX_MARGINAL_CELLS`` counted cells, or
    more than ``MAX_RELEASE_QUERIES`` output rows.  O(subsets × attributes)."""
    require_source(spec)
    shape = spec.domain_shape
    cells = sum(math.prod(shape[a] for a in axes) for axes in subsets)
    if cells > MAX_MARGINAL_CELLS:
        raise SpecError(
            f"the plan measures {len(subsets)} marginals of {cells:,} cells together; a release "
            f"counts at most {MAX_MARGINAL_CELLS:,} on one machine: use wider bins or fewer or "
            "smaller marginals"
        )
    if output_rows > MAX_RELEASE_QUERIES:
        raise SpecError(
            f"workload: the output tables would have {output_rows:,} rows; a release writes at "
            f"most {MAX_RELEASE_QUERIES:,} rows: drop or narrow the largest items"
        )


def count_marginals(
    spec: ReleaseSpec,
    *,
    subsets: Sequence[tuple[int, ...]],
    output_rows: int,
    key: CatalogKey | None = None,
    rows: PeriodRows | None = None,
) -> MarginalCountResult:
    """Read, check, bound contributions and count the ``subsets``-marginals of the spec's source.

    ``subsets`` are ascending axis tuples (``()`` = the total); ``key`` is the catalog's
    fingerprint key (default: the default catalog's) and ``rows`` one period of a column series,
    as for ``source.count_cells``.
    O(rows) Arrow work for the read and group-by, then O(groups × subsets) numpy; the content
    fingerprint is hashed on a second thread meanwhile.
    """
    check_marginals_runnable(spec, subsets=subsets, output_rows=output_rows)
    encoded, files, input_fingerprint = read_and_encode(spec, key=key, rows=rows)
    valid = encoded.valid
    index = [axis_index[valid] for axis_index in encoded.index]
    shape = spec.domain_shape
    tables = project_marginals(index, encoded.counts[valid], shape=shape, subsets=subsets)
    if rows is not None:  # one period of a column series: fingerprinted by its counts
        input_fingerprint = counts_fingerprint(tables, key=key)
    protected = protect(ProtectedMarginals, tables, spec)
    return MarginalCountResult(
        marginals=protected, input_fingerprint=input_fingerprint, files=files
    )


def project_marginals(
    index: Sequence[np.ndarray],
    counts: np.ndarray,
    *,
    shape: tuple[int, ...],
    subsets: Sequence[tuple[int, ...]],
) -> dict[tuple[int, ...], np.ndarray]:
    """The ``subsets``-marginals of groups with per-axis cell ``index`` and ``counts``
    (confidential in, confidential out), keyed in the order of ``subsets``.

    O(groups × subsets + Σ marginal sizes): per subset, one multiply-add and one ``bincount``
    over the groups.  Subsets are visited in sorted order so that those sharing all but their
    last axis (consecutive then: every 3-way table of one pair) reuse that prefix's flat index;
    only the prefixes of the current subset are kept, O(groups × longest subset) memory.  Flat
    indices are int64 within one table (each ≤ ``MAX_MARGINAL_CELLS`` cells), never over the
    product domain.  Raises ``ValueError`` (naming the axis and its size, never a value) if an
    index is outside its axis: the multiply-add would otherwise count it in another cell."""
    unique = list(dict.fromkeys(tuple(int(a) for a in axes) for axes in subsets))
    used = sorted({a for axes in unique for a in axes})
    for a in used:  # O(groups × attributes used)
        if index[a].size and not 0 <= int(index[a].min()) <= int(index[a].max()) < shape[a]:
            raise ValueError(f"cell index of axis {a} must lie in [0, {shape[a]})")
    prefixes: dict[tuple[int, ...], np.ndarray] = {}

    def flat_index(axes: tuple[int, ...]) -> np.ndarray:
        if axes not in prefixes:
            last = index[axes[-1]].astype(np.int64, copy=False)
            head = axes[:-1]
            prefixes[axes] = flat_index(head) * shape[axes[-1]] + last if head else last
        return prefixes[axes]

    tables: dict[tuple[int, ...], np.ndarray] = {}
    for axes in sorted(unique):
        if not axes:
            tables[axes] = np.array(counts.sum())
            continue
        for held in [held for held in prefixes if held != axes[: len(held)]]:
            del prefixes[held]  # not a prefix of this subset, nor (sorted) of any later one
        size = math.prod(shape[a] for a in axes)
        tables[axes] = np.bincount(flat_index(axes), weights=counts, minlength=size)  # O(groups)
    return {axes: tables[axes] for axes in unique}
