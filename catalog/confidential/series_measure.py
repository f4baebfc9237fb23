"""One period of a series: the periods' protected counts, read file by file and combined inside
the boundary as the time strategy's row asks (``Σ_s A[t,s]·x_s``); only the noise leaves.

Each period's file is read by the reader of the cell mechanism's input kind (:data:`READERS`),
with the file as the spec's source; the combination is made by the choke point's own
``combination`` (:class:`~catalog.confidential.choke_point.ProtectedCells`,
:class:`~catalog.confidential.choke_point.ProtectedMarginals`), which holds the charge-per-unit-
weight obligation the series accountant meets.  O(periods read × (rows + cells)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dprelease.catalog.confidential.inputs import READERS, Ingested
from dprelease.catalog.errors import DataError
from dprelease.catalog.keys import CatalogKey
from dprelease.catalog.spec.model import ReleaseSpec


def read_period(spec: ReleaseSpec, plan: Any, path: str, *, key: CatalogKey) -> Ingested:
    """The protected counts of one period's file (the spec with ``path`` as its source)."""
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
) -> tuple[Any, list[str]]:
    """``Σ weights[s]·x_s`` over the periods' files, protected, and each file's keyed fingerprint.

    ``fingerprints``: what each period's file had when it was released (None: the new period);
    a file whose content changed since is refused (:class:`DataError`) before anything is
    measured or charged."""
    total: Any = None
    seen = []
    # one period held at a time besides the running sum: memory O(2 · cells), not O(periods · cells)
    for path, recorded, weight in zip(paths, fingerprints, weights, strict=True):
        ingested = read_period(spec, plan, path, key=key)
        if recorded is not None and ingested.input_fingerprint != recorded:
            raise DataError(
                f"series {spec.name!r}: the file of a released period ({path!r}) changed since "
                "its release (its keyed fingerprint differs); published figures never change, "
                "so this release is refused: restore the file as released"
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
