"""Synthetic data from a published ``reconstruct: pgm`` release (``dprelease synth``).

Fitted to the *released* tables only: their 1-way and 2-way tables give the Chow–Liu tree
(maximum spanning tree of pairwise mutual informations, as MST does) that records are drawn from
(:func:`mechanisms.pgm.sample_tree`).  Post-processing: no budget is charged and the confidential
data are never read.  Each file is recorded in table ``synthetic_files`` (release id, path, rows,
seed, sha256; its own ``MetaData``).  An integer cell is written as its lowest integer, a bin as
its lower edge, a category as itself, so every value lies in the release's domain; dependencies
off the tree's edges are approximated through the tree.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from dprelease.catalog.errors import CatalogError, SpecError
from dprelease.catalog.ledger.schema import now
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import build_workload
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.spec.domain import Attribute, Categorical, IntegerRange
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.pgm import TreeModel, chow_liu_tree, sample_tree
from dprelease.mechanisms.primitives.workload import axes_of, item_subset

MAX_SYNTHETIC_ROWS = 100_000_000
_CHUNK_ROWS = 1_000_000  # rows sampled and written per Parquet row group: memory O(chunk × d)

synthetic_metadata = sa.MetaData()
synthetic_files = sa.Table(
    "synthetic_files",
    synthetic_metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("release_id", sa.String(128), nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("seed", sa.String(40), nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
)


@dataclass(frozen=True, kw_only=True)
class SyntheticFile:
    release_id: str
    path: str
    rows: int
    seed: int
    sha256: str
    created_at: str


def fit_model(release_id: str, catalog: Catalog) -> tuple[ReleaseSpec, TreeModel]:
    """The spec and the tree model of a published ``pgm`` release, from its verified tables."""
    record = catalog.release(release_id)
    if record.status != "published":
        raise CatalogError(
            f"release {release_id!r} is {record.status}; synth samples from a published release "
            "only (approve it with `dprelease review`)"
        )
    directory = Path(record.published_directory or record.directory or "")
    manifest = artifacts.read_manifest(directory)
    details = manifest.get("mechanism", {}).get("details", {})
    if details.get("estimator") != "pgm":
        raise SpecError(
            f"release {release_id!r} was reconstructed with "
            f"{details.get('estimator', 'least_squares')!r}; synth needs consistent, non-negative "
            "tables: release with reconstruct: pgm"
        )
    spec = ReleaseSpec.model_validate(manifest["spec"])
    workload = build_workload(spec)
    shape = spec.domain_shape
    d = len(shape)
    tables: dict[int, np.ndarray] = {}
    for item in workload.items:
        mask = item_subset(item)
        if mask is None:
            continue
        name = f"tables/{item.name}.parquet"
        path = directory / name
        if artifacts.sha256_file(path) != manifest.get("artifacts", {}).get(name):
            raise CatalogError(
                f"release {release_id!r}: {name} does not match its manifest hash; run "
                "`dprelease verify` on the release directory"
            )
        estimate = pq.read_table(path, columns=["estimate"])["estimate"].to_numpy()
        tables[mask] = estimate.reshape(tuple(shape[a] for a in axes_of(mask, d)))
    one_way = {i: t for i in range(d) if (t := _project(tables, 1 << i, d)) is not None}
    missing = [name for i, name in enumerate(spec.domain) if i not in one_way]
    if missing:
        raise SpecError(
            f"release {release_id!r}: attributes {missing} are in no released table; synth needs "
            "every domain attribute in at least one marginal"
        )
    two_way = {
        (i, j): t
        for i, j in combinations(range(d), 2)
        if (t := _project(tables, 1 << i | 1 << j, d)) is not None
    }
    return spec, chow_liu_tree(domain_shape=shape, one_way=one_way, two_way=two_way)


def _project(tables: dict[int, np.ndarray], target: int, d: int) -> np.ndarray | None:
    """The table of ``target``'s attributes, summed from the first released table covering them."""
    mask = next((m for m in tables if m & target == target), None)
    if mask is None:
        return None
    summed = tuple(k for k, a in enumerate(axes_of(mask, d)) if not target >> a & 1)
    return tables[mask].sum(axis=summed) if summed else tables[mask]


def cell_values(attribute: Attribute) -> pa.Array:
    """One in-domain value per cell: an integer cell's lowest value, a bin's lower edge, a
    category itself."""
    if isinstance(attribute, IntegerRange):
        return pa.array(attribute.cell_bounds()[0].astype(np.int64))
    if isinstance(attribute, Categorical):
        return pa.array(list(attribute.values))
    return pa.array(attribute.pairs()[:, 0].astype(np.float64))


def synthesize(
    release_id: str,
    *,
    rows: int,
    out: Path,
    catalog: Catalog,
    seed: int | None = None,
) -> SyntheticFile:
    """Sample ``rows`` records from the release's model into the Parquet file ``out`` and record
    it in the catalog.  ``seed`` (public randomness; drawn fresh and recorded when None) makes
    the file reproducible.  O(rows · d) time, O(chunk · d) memory."""
    if not 1 <= rows <= MAX_SYNTHETIC_ROWS:
        raise SpecError(f"--rows ({rows}) must be between 1 and {MAX_SYNTHETIC_ROWS:,}")
    if out.exists():
        raise SpecError(f"--out: {str(out)!r} exists; choose a new file (nothing is overwritten)")
    spec, model = fit_model(release_id, catalog)
    seed = secrets.randbits(63) if seed is None else int(seed)
    rng = np.random.default_rng(seed)
    values = [cell_values(attribute) for attribute in spec.domain.values()]
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    schema = pa.schema(
        [pa.field(name, v.type) for name, v in zip(spec.domain, values, strict=True)]
    )
    try:
        with pq.ParquetWriter(partial, schema) as writer:
            for start in range(0, rows, _CHUNK_ROWS):
                cells = sample_tree(model, rows=min(_CHUNK_ROWS, rows - start), rng=rng)
                columns = [v.take(pa.array(cells[:, k])) for k, v in enumerate(values)]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
        partial.replace(out)  # the file appears whole or not at all
    finally:
        partial.unlink(missing_ok=True)
    record = SyntheticFile(
        release_id=release_id,
        path=str(out.resolve()),
        rows=rows,
        seed=seed,
        sha256=artifacts.sha256_file(out),
        created_at=now(),
    )
    synthetic_metadata.create_all(catalog.engine, checkfirst=True)
    with catalog.engine.begin() as conn:
        conn.execute(synthetic_files.insert().values(**asdict(record) | {"seed": str(seed)}))
    return record


def synthetic_records(catalog: Catalog, release_id: str | None = None) -> list[SyntheticFile]:
    """The recorded synthetic files (of one release, when given), oldest first.  Read-only: a
    catalog in which ``synth`` never ran has no such table and no files."""
    if not sa.inspect(catalog.engine).has_table(synthetic_files.name):
        return []
    query = sa.select(synthetic_files).order_by(synthetic_files.c.seq)
    if release_id is not None:
        query = query.where(synthetic_files.c.release_id == release_id)
    with catalog.engine.connect() as conn:
        return [
            SyntheticFile(
                **{k: v for k, v in r._asdict().items() if k != "seq"}
                | {"rows": int(r.rows), "seed": int(r.seed)}
            )
            for r in conn.execute(query)
        ]
