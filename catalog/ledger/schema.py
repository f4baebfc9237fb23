"""The catalog's tables, the timestamps they store, and what a database is: fresh, current, or a
catalog of an older schema to migrate (never one of a newer dprelease, nor something else).

Other dprelease modules keep their own tables in the catalog database (:data:`AUXILIARY_TABLES`,
each with its own ``MetaData``, created with :func:`create_tables`)."""

from __future__ import annotations

import weakref
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.chain import CHAIN_FORMAT, GENESIS, row_digest
from dprelease.catalog.ledger.database import redacted

SCHEMA_NAME = "dprelease-catalog"
SCHEMA_VERSION = 3  # 1: before the hash chain and leases; 2: before partitions and skipped entries
# catalog_meta key present in catalogs created with every review decision anchored in the ledger
DECISIONS_MARKER = "decisions"
SCHEMA_LOCK_ID = 0x64707265  # PostgreSQL advisory lock key of schema changes ("dpre")
# Tables other dprelease modules keep in the catalog database (watch_state, ldp_release,
# identity.roles, review.signatures).
AUXILIARY_TABLES = frozenset(
    {
        "announced_files",
        "review_runs",
        "ldp_collections",
        "review_policies",
        "synthetic_files",
        "series_plans",
        "series_periods",
        "series_claims",
        "entry_sessions",  # ledger.pg_roles: who wrote each entry (PostgreSQL roles only)
    }
    | {"identity_entries", "signed_steps", "review_signatures"}
)

metadata = sa.MetaData()

catalog_meta = sa.Table(
    "catalog_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

datasets = sa.Table(
    "datasets",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("measure", sa.String(16), nullable=False),
    sa.Column("cap_epsilon", sa.Float, nullable=False, default=0.0),
    sa.Column("cap_rho", sa.Float, nullable=False, default=0.0),
    sa.Column("cap_delta", sa.Float, nullable=False, default=0.0),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("partitioned_by", sa.String(96)),  # None, "file" or "column:NAME" (schema 3)
)

ledger = sa.Table(
    "ledger",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("receipt_id", sa.String(64), nullable=False, unique=True),
    sa.Column("dataset_id", sa.String(64), sa.ForeignKey("datasets.id"), nullable=False),
    sa.Column("release_id", sa.String(128), nullable=False),
    sa.Column("label", sa.String(256), nullable=False),
    sa.Column("measure", sa.String(16), nullable=False),
    sa.Column("epsilon", sa.Float, nullable=False),
    sa.Column("rho", sa.Float, nullable=False),
    sa.Column("delta", sa.Float, nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("prev_hash", sa.String(64)),
    sa.Column("entry_hash", sa.String(64)),
    sa.Column("entry_kind", sa.String(16), nullable=False, server_default="charge"),
    sa.Column("partition_key", sa.String(256)),  # None: the whole dataset
)

releases = sa.Table(
    "releases",
    metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("spec_fingerprint", sa.String(64), nullable=False),
    sa.Column("input_fingerprint", sa.String(64)),
    sa.Column("mechanism", sa.String(32)),
    sa.Column("directory", sa.Text),
    sa.Column("manifest_sha256", sa.String(64)),
    sa.Column("published_directory", sa.Text),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.Column("owner_pid", sa.Integer),
    sa.Column("owner_host", sa.String(255)),
    sa.Column("owner_start", sa.String(32)),
    sa.Column("heartbeat_at", sa.String(40)),
    sa.Column("interrupted_at", sa.String(40)),
    sa.Column("series_key", sa.String(64)),  # ReleaseSpec.series_key(): what "unchanged" compares
)

reviews = sa.Table(
    "reviews",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("release_id", sa.String(128), sa.ForeignKey("releases.id"), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("reviewer", sa.String(128), nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("at", sa.String(40), nullable=False),
)

# Columns added by schema version 2 (migrated onto version-1 catalogs).
_V2_COLUMNS = {
    "ledger": ("prev_hash", "entry_hash"),
    "releases": ("owner_pid", "owner_host", "owner_start", "heartbeat_at", "interrupted_at"),
}

# Columns added by schema version 3 (migrated onto version-1 and version-2 catalogs).
_V3_COLUMNS = {
    "datasets": ("partitioned_by",),
    "ledger": ("entry_kind", "partition_key"),
    "releases": ("series_key",),
}

STATUSES = ("measuring", "failed", "aborted", "staged", "approved", "rejected", "published")


def now() -> str:
    """The time as the catalog stores it (UTC, ISO 8601, microseconds)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def lock_schema(conn: Connection) -> None:
    """PostgreSQL: one process at a time creates or migrates tables (transaction-scoped advisory
    lock; concurrent CREATE TABLE would fail); SQLite's ``BEGIN IMMEDIATE`` already serialises."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(SCHEMA_LOCK_ID)))


def create_tables(engine: Engine, tables: sa.MetaData) -> None:
    """Create the tables of ``tables`` the catalog database lacks (another module's own)."""
    with engine.begin() as conn:
        lock_schema(conn)
        tables.create_all(conn)


_created: weakref.WeakKeyDictionary[Engine, set[int]] = weakref.WeakKeyDictionary()


def with_tables(engine: Engine, tables: sa.MetaData) -> Engine:
    """``engine``, once the tables of ``tables`` exist in its database (:func:`create_tables` on
    first use, once per engine and ``MetaData``: a module's own tables, created lazily)."""
    created = _created.setdefault(engine, set())
    if id(tables) not in created:
        create_tables(engine, tables)
        created.add(id(tables))
    return engine


def release_rows(engine: Engine, table: sa.Table, release_id: str) -> list[Any]:
    """The rows of ``table`` (a module's own table with ``release_id`` and an ``id`` counter) that
    belong to ``release_id``, in the order they were recorded. O(rows)."""
    query = sa.select(table).where(table.c.release_id == release_id).order_by(table.c.id)
    with engine.connect() as conn:
        return list(conn.execute(query).all())


def chain_rows(conn: Connection) -> list[Any]:
    """Every ledger row in ``seq`` order: what the hash chain verifies. O(entries)."""
    return list(conn.execute(sa.select(ledger).order_by(ledger.c.seq)).all())


def open_schema(engine: Engine, url: str) -> bool:
    """Initialise a fresh catalog database or migrate one of an older schema (one process; the
    others wait); True when it did either.  Raises for a database that is not a catalog."""
    with engine.connect() as conn:
        if _schema_state(conn, url) == "current":
            return False
    with engine.begin() as conn:
        lock_schema(conn)
        state = _schema_state(conn, url)
        if state == "fresh":
            metadata.create_all(conn)
            _write_marker(conn)
            # every review decision of this catalog is anchored in the ledger (none is legacy)
            conn.execute(catalog_meta.insert().values(key=DECISIONS_MARKER, value="anchored"))
        elif state == "legacy":
            _migrate_v1(conn)
        elif state == "outdated":
            _migrate_v2(conn)
    return state != "current"


def _schema_state(conn: Connection, url: str) -> str:
    """``current``, ``fresh`` (no catalog tables yet), ``legacy`` (version 1) or ``outdated``
    (version 2); raises for a database that belongs to something else or to a newer dprelease."""
    names = set(sa.inspect(conn).get_table_names())
    core = {"datasets", "ledger", "releases", "reviews"}
    if "catalog_meta" in names:
        marker = dict(conn.execute(sa.select(catalog_meta.c.key, catalog_meta.c.value)).all())
        if marker.get("schema") != SCHEMA_NAME:
            raise _foreign(url, f"its catalog_meta table does not name {SCHEMA_NAME!r}")
        version = int(marker.get("version", "0"))
        if version > SCHEMA_VERSION:
            raise CatalogError(
                f"catalog {redacted(url)} has schema version {version}, written by a newer dprelease; this "
                f"version reads up to {SCHEMA_VERSION}: upgrade dprelease"
            )
        if not core <= names:
            raise _foreign(url, f"tables {sorted(core - names)} are missing")
        return "current" if version == SCHEMA_VERSION else "outdated"
    present = names & core
    if not present:
        if names - AUXILIARY_TABLES:
            raise _foreign(url, f"it holds other tables ({', '.join(sorted(names)[:5])})")
        return "fresh"
    if present != core:
        raise _foreign(url, f"tables {sorted(core - present)} are missing")
    inspector = sa.inspect(conn)
    for table in (datasets, ledger, releases, reviews):
        have = {column["name"] for column in inspector.get_columns(table.name)}
        added = (*_V2_COLUMNS.get(table.name, ()), *_V3_COLUMNS.get(table.name, ()))
        need = {c.name for c in table.columns} - set(added)
        if not need <= have:
            raise _foreign(url, f"table {table.name} lacks columns {sorted(need - have)}")
    return "legacy"


def _foreign(url: str, why: str) -> CatalogError:
    return CatalogError(
        f"catalog {redacted(url)} is not a dprelease catalog ({why}); it was left unchanged. Point "
        "DPRELEASE_HOME or DPRELEASE_CATALOG_URL at a dprelease catalog"
    )


def _write_marker(conn: Connection) -> None:
    conn.execute(
        catalog_meta.insert(),
        [
            {"key": "schema", "value": SCHEMA_NAME},
            {"key": "version", "value": str(SCHEMA_VERSION)},
            {"key": "chain", "value": CHAIN_FORMAT},  # locked FOR UPDATE by every ledger write
        ],
    )


def _add_columns(conn: Connection, added: dict[str, tuple[str, ...]]) -> None:
    """ALTER TABLE … ADD COLUMN for every column of ``added`` the database lacks (portable DDL:
    the type compiled for the dialect, a server default as a quoted literal)."""
    inspector = sa.inspect(conn)
    for name, columns in added.items():
        have = {column["name"] for column in inspector.get_columns(name)}
        table = metadata.tables[name]
        for column in columns:
            if column in have:
                continue
            definition = table.c[column].type.compile(dialect=conn.dialect)
            default = table.c[column].server_default
            if default is not None:  # existing rows get the default (SQLite and PostgreSQL)
                definition += f" DEFAULT '{default.arg}' NOT NULL"  # type: ignore[attr-defined]
            conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN {column} {definition}")


def _migrate_v2(conn: Connection) -> None:
    """Version 2 → 3: partitions (``datasets.partitioned_by``, ``ledger.partition_key``), entry
    kinds (``ledger.entry_kind``, existing entries are charges) and ``releases.series_key``.
    Existing entries keep their hashes: a plain charge is hashed as before. O(1)."""
    _add_columns(conn, _V3_COLUMNS)
    conn.execute(
        catalog_meta.update()
        .where(catalog_meta.c.key == "version")
        .values(value=str(SCHEMA_VERSION))
    )


def _migrate_v1(conn: Connection) -> None:
    """Version 1 → 3: add the chain, lease and version-3 columns, chain the existing entries.
    O(entries)."""
    _add_columns(conn, _V2_COLUMNS)
    _add_columns(conn, _V3_COLUMNS)
    catalog_meta.create(conn, checkfirst=True)
    _write_marker(conn)
    previous = GENESIS
    for row in chain_rows(conn):
        digest = row_digest(row, previous)
        # The one write to existing ledger rows: filling the new chain columns once, at migration.
        conn.execute(
            sa.update(ledger)
            .where(ledger.c.seq == row.seq)
            .values(prev_hash=previous, entry_hash=digest)
        )
        previous = digest
