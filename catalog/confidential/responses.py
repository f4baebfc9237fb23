"""Local-model files (``model: local``): the responses a release counts, and simulated clients.

:func:`count_responses` validates every responses file (Parquet, an integer ``response`` column, no
nulls, indices in ``[0, m)``, the planned strategy's fingerprint) before anything is charged; a
failure names the file, column and rule, never a value or a count.  :func:`simulate` plays the
clients of ``dprelease ldp simulate``: only randomised responses are written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dprelease.catalog.confidential.source import check_schema, open_dataset, resolve_source
from dprelease.catalog.errors import DataError
from dprelease.catalog.keys import CatalogKey
from dprelease.catalog.planning.responses import PublishedStrategy, check_strategy_fits
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.local import randomizer

RESPONSE_COLUMN = "response"
FINGERPRINT_COLUMN = "strategy_fingerprint"
FINGERPRINT_METADATA_KEY = b"dprelease.ldp.strategy_fingerprint"
EPSILON_METADATA_KEY = b"dprelease.ldp.epsilon"


def count_responses(
    source: str, strategy: PublishedStrategy, *, key: CatalogKey | None = None
) -> tuple[Any, tuple[str, ...], str]:
    """Validate every responses file and count them into ``y`` (length ``m``); also return the
    files and their keyed content fingerprint.

    Each file must be Parquet with an integer ``response`` column without nulls, every index in
    ``[0, m)``, and carry the fingerprint of ``strategy`` (schema metadata
    ``dprelease.ldp.strategy_fingerprint``, or a ``strategy_fingerprint`` column with that single
    value).  O(rows).
    """
    files = resolve_source(source, key=key)
    expected = strategy.fingerprint
    m = strategy.randomiser.num_outputs
    counts = np.zeros(m, dtype=np.int64)
    for name in files.files:
        counts += _count_file(name, expected=expected, num_outputs=m)
    total = int(counts.sum())
    if total < 2:
        raise DataError(
            f"the responses in {source!r} hold fewer than 2 responses; an estimate needs at least 2"
        )
    return strategy.response_counts(counts), files.files, files.fingerprint


def _count_file(name: str, *, expected: str, num_outputs: int) -> np.ndarray:
    label = Path(name).name
    try:
        parquet = pq.ParquetFile(name)
        schema = parquet.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"responses file {label!r} is not a readable Parquet file: {exc}") from None
    if RESPONSE_COLUMN not in schema.names:
        raise DataError(
            f"responses file {label!r} has no {RESPONSE_COLUMN!r} column (it has {schema.names}); "
            "every row must be one user's response index"
        )
    column_type = schema.field(RESPONSE_COLUMN).type
    if not pa.types.is_integer(column_type):
        raise DataError(
            f"column {RESPONSE_COLUMN!r} in {label!r} has type {column_type}; response indices "
            "must be integers"
        )
    columns = [RESPONSE_COLUMN]
    declared = (schema.metadata or {}).get(FINGERPRINT_METADATA_KEY)
    if declared is None:
        if FINGERPRINT_COLUMN not in schema.names:
            raise DataError(
                f"responses file {label!r} carries no strategy fingerprint (schema metadata "
                f"{FINGERPRINT_METADATA_KEY.decode()!r} or a {FINGERPRINT_COLUMN!r} column); "
                "responses of an unknown strategy cannot be estimated"
            )
        columns.append(FINGERPRINT_COLUMN)
    try:
        table = parquet.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read responses file {label!r}: {exc}") from None
    found = (
        [declared.decode(errors="replace")]
        if declared is not None
        else [str(v) for v in pc.unique(table[FINGERPRINT_COLUMN]).to_pylist()]
    )
    if found != [expected]:
        raise DataError(
            f"responses file {label!r} was randomised with strategy fingerprint(s) "
            f"{[f[:16] + '…' for f in found]}, but this release's strategy is {expected[:16]}…; "
            "responses must come from the published strategy of this spec"
        )
    responses = table[RESPONSE_COLUMN]
    if responses.null_count:
        raise DataError(
            f"column {RESPONSE_COLUMN!r} in {label!r} has null value(s); every row must hold one "
            "response index"
        )
    values = responses.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if values.size and ((values < 0) | (values >= num_outputs)).any():
        raise DataError(
            f"column {RESPONSE_COLUMN!r} in {label!r} has value(s) outside [0, {num_outputs}); "
            f"the strategy has {num_outputs} outputs"
        )
    return np.bincount(values, minlength=num_outputs)


@dataclass(frozen=True, kw_only=True)
class SimulationSummary:
    """What ``dprelease ldp simulate`` wrote (public)."""

    output: str
    num_responses: int
    dropped_rows: int
    strategy_fingerprint: str


def encode_items(spec: ReleaseSpec, source: str) -> tuple[np.ndarray, int]:
    """Cell index (row-major over the spec's domain) of every row of a Parquet of true items, and
    the number of rows dropped (``on_out_of_domain: drop``).  Same encoding as central releases.

    Privacy: reads true items; for simulation and tests only (real items never leave a device)."""
    files = resolve_source(source)
    dataset = open_dataset(files, spec)
    check_schema(dataset, spec)
    try:
        table = dataset.to_table(columns=list(spec.domain))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read {source!r} as Parquet: {exc}") from None
    if table.num_rows == 0:
        raise DataError(f"input {source!r} has no rows")
    valid = np.ones(table.num_rows, dtype=bool)
    per_attribute = []
    for name, attribute in spec.domain.items():
        column = table[name]
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        distinct = pc.unique(column).drop_null()  # O(rows), Arrow compute
        position = pc.index_in(column, value_set=distinct)  # null for null rows
        missing = position.is_null().to_numpy(zero_copy_only=False)
        cell_of_distinct, in_domain = attribute.encode(distinct.to_numpy(zero_copy_only=False))
        safe = position.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        row_valid = ~missing & in_domain[safe] if len(distinct) else ~missing
        if spec.on_out_of_domain == "error" and not row_valid.all():
            raise DataError(
                f"column {name!r} has row(s) that are null or outside the public domain "
                "(fix the data, or set on_out_of_domain: drop)"
            )
        valid &= row_valid
        per_attribute.append(cell_of_distinct[safe] if len(distinct) else safe)
    items = np.ravel_multi_index(tuple(ix[valid] for ix in per_attribute), spec.domain_shape)
    return items.astype(np.int64), int((~valid).sum())


def write_responses(path: Path, responses: np.ndarray, strategy: randomizer.LDPStrategy) -> None:
    """A responses Parquet: one int64 ``response`` per user; the strategy fingerprint and ε in the
    schema metadata (a collector may instead add a ``strategy_fingerprint`` column)."""
    metadata = {
        FINGERPRINT_METADATA_KEY: randomizer.strategy_fingerprint(strategy).encode(),
        EPSILON_METADATA_KEY: repr(strategy.epsilon).encode(),
    }
    table = pa.table({RESPONSE_COLUMN: pa.array(responses, pa.int64())})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(metadata), path)


def simulate(
    spec: ReleaseSpec,
    strategy: PublishedStrategy,
    *,
    input_path: str,
    output_path: Path,
    rng: np.random.Generator,
) -> SimulationSummary:
    """Randomise every row of a Parquet of true items with
    :func:`mechanisms.local.randomizer.randomize`.

    Privacy: ``rng`` plays the part of each device's randomness.  A seeded generator is for
    simulation only; real clients draw from OS entropy and never share or log a seed."""
    check_strategy_fits(spec, strategy)
    items, dropped = encode_items(spec, input_path)
    responses = randomizer.randomize(items, strategy.randomiser, rng=rng)
    write_responses(output_path, responses, strategy.randomiser)
    return SimulationSummary(
        output=str(output_path),
        num_responses=int(responses.size),
        dropped_rows=dropped,
        strategy_fingerprint=strategy.fingerprint,
    )
