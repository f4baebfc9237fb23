"""Operational state kept next to the catalog: announced data files and releases awaiting review.

Two small tables in the catalog database (same SQLAlchemy URL, their own ``MetaData`` so the
catalog's schema is untouched):

* ``announced_files`` — one row per (dataset id, content fingerprint) the arrival watcher has
  announced.  The primary key makes an announcement at-most-once across restarts *and* across two
  watchers racing on the same folder: :meth:`WatchState.claim` inserts the row before the event is
  emitted, and only a failed emission gives the claim back.  At-most-once is the safe side: every
  announcement starts a release that spends privacy budget.
* ``review_runs`` — which Prefect flow run is paused waiting for the review of a release (and on
  which API), so ``dprelease review`` can resume that run instead of deciding behind its back.

Everything stored here is public metadata: paths, content hashes, ids and URLs of the Prefect API
(no credentials: the API URL is the one the worker was given).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.database import default_url, dispose_with, make_engine
from dprelease.catalog.ledger.schema import create_tables, lock_schema, now

operations_metadata = sa.MetaData()

announced_files = sa.Table(
    "announced_files",
    operations_metadata,
    sa.Column("dataset_id", sa.String(64), primary_key=True),
    sa.Column("fingerprint", sa.String(64), primary_key=True),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("announced_at", sa.String(40), nullable=False),
)

review_runs = sa.Table(
    "review_runs",
    operations_metadata,
    sa.Column("release_id", sa.String(128), primary_key=True),
    sa.Column("flow_run_id", sa.String(64), nullable=False),
    sa.Column("api_url", sa.Text),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    # where an approval publishes (the deployment's publish_dir; None: next to the releases):
    # the reviewer's own process records the decision and publishes
    sa.Column("publish_dir", sa.Text),
)

# Columns added to a table of this module after it was first created (nullable, so existing rows
# need no value); added when missing by whoever may (the custodian under database roles).
ADDED_COLUMNS = {"review_runs": ("publish_dir",)}

REVIEW_RUN_STATUSES: tuple[str, ...] = ("awaiting", "decided", "expired")
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")  # hex sha256


@dataclass(frozen=True, kw_only=True)
class Announcement:
    """A data file the watcher announced (one ``dprelease.data.arrived`` event)."""

    dataset_id: str
    fingerprint: str
    path: str
    size: int
    announced_at: str


@dataclass(frozen=True, kw_only=True)
class ReviewRun:
    """The flow run that paused for the review of ``release_id``."""

    release_id: str
    flow_run_id: str
    api_url: str | None
    status: str
    created_at: str
    updated_at: str
    publish_dir: str | None = None


class _OperationsTables:
    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_url()
        self.engine: Engine = make_engine(self.url)  # SQLite waits for a writer charging the ledger
        create_tables(self.engine, operations_metadata)
        _add_missing_columns(self.engine)
        dispose_with(self, self.engine)


def _add_missing_columns(engine: Engine) -> None:
    """``ALTER TABLE … ADD COLUMN`` for each :data:`ADDED_COLUMNS` column a table created by an
    earlier dprelease lacks.  O(columns)."""
    inspector = sa.inspect(engine)
    missing = [
        (name, column)
        for name, columns in ADDED_COLUMNS.items()
        for column in columns
        if column not in {c["name"] for c in inspector.get_columns(name)}
    ]
    if not missing:
        return
    with engine.begin() as conn:
        lock_schema(conn)
        have = {
            name: {c["name"] for c in sa.inspect(conn).get_columns(name)} for name, _ in missing
        }
        for name, column in missing:
            if column not in have[name]:
                kind = operations_metadata.tables[name].c[column].type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN {column} {kind}")


def _announced(dataset_id: str, fingerprint: str) -> sa.ColumnElement[bool]:
    files = announced_files.c
    return (files.dataset_id == dataset_id) & (files.fingerprint == fingerprint)


class WatchState(_OperationsTables):
    """Fingerprints of files already announced, persisted in the catalog database."""

    def claim(self, *, dataset_id: str, fingerprint: str, path: str, size: int) -> bool:
        """Record that this content is being announced for ``dataset_id``; ``False`` (and nothing
        changed) when the same content was announced before."""
        if not _FINGERPRINT.fullmatch(fingerprint):
            raise ValueError(
                f"fingerprint ({fingerprint!r}) must be a lowercase hex sha256 (64 characters)"
            )
        if size < 0:
            raise ValueError(f"size ({size}) must be >= 0")
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    announced_files.insert().values(
                        dataset_id=dataset_id,
                        fingerprint=fingerprint,
                        path=path,
                        size=size,
                        announced_at=now(),
                    )
                )
        except IntegrityError:
            return False
        return True

    def unclaim(self, *, dataset_id: str, fingerprint: str) -> None:
        """Give a claim back after the event could not be emitted (it will be retried)."""
        with self.engine.begin() as conn:
            conn.execute(announced_files.delete().where(_announced(dataset_id, fingerprint)))

    def announcement(self, *, dataset_id: str, fingerprint: str) -> Announcement | None:
        with self.engine.connect() as conn:
            query = sa.select(announced_files).where(_announced(dataset_id, fingerprint))
            row = conn.execute(query).first()
        return None if row is None else Announcement(**row._asdict())

    def announcements(self, dataset_id: str | None = None) -> list[Announcement]:
        query = sa.select(announced_files).order_by(announced_files.c.announced_at)
        if dataset_id is not None:
            query = query.where(announced_files.c.dataset_id == dataset_id)
        with self.engine.connect() as conn:
            return [Announcement(**row._asdict()) for row in conn.execute(query)]


class ReviewRuns(_OperationsTables):
    """Which paused Prefect flow run waits for the review of which release."""

    def record(
        self,
        *,
        release_id: str,
        flow_run_id: str,
        api_url: str | None,
        publish_dir: str | None = None,
    ) -> None:
        """Remember that ``flow_run_id`` pauses for the review of ``release_id`` and where an
        approval publishes it (``publish_dir``)."""
        stamp = now()
        with self.engine.begin() as conn:
            conn.execute(review_runs.delete().where(review_runs.c.release_id == release_id))
            conn.execute(
                review_runs.insert().values(
                    release_id=release_id,
                    flow_run_id=flow_run_id,
                    api_url=api_url,
                    publish_dir=publish_dir,
                    status="awaiting",
                    created_at=stamp,
                    updated_at=stamp,
                )
            )

    def get(self, release_id: str) -> ReviewRun | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(review_runs).where(review_runs.c.release_id == release_id)
            ).first()
        return None if row is None else ReviewRun(**row._asdict())

    def mark(self, release_id: str, *, status: str) -> None:
        if status not in REVIEW_RUN_STATUSES:
            raise ValueError(f"status ({status!r}) must be one of {REVIEW_RUN_STATUSES}")
        with self.engine.begin() as conn:
            result = conn.execute(
                review_runs.update()
                .where(review_runs.c.release_id == release_id)
                .values(status=status, updated_at=now())
            )
        if result.rowcount != 1:
            raise CatalogError(f"release {release_id!r} has no flow run awaiting review")
