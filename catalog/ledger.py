"""The catalog database: datasets with lifetime budget caps, the append-only privacy ledger, releases.

SQLite under ``$DPRELEASE_HOME/catalog.db`` by default (``./.dprelease``); any SQLAlchemy URL
(``DPRELEASE_CATALOG_URL``, e.g. PostgreSQL) for shared deployments.

Ledger rules (DESIGN.md, privacy rules 3): a charge is committed in its own transaction *before*
noise is drawn; it is never updated, deleted or refunded (a crashed or rejected release keeps its
charge); a charge that would take the dataset over its cap is refused with the requested, spent
and cap values in the message.  Charges are serialised per dataset: SQLite takes the write lock
up front (``BEGIN IMMEDIATE``) and other databases lock the dataset row (``SELECT … FOR UPDATE``),
so two processes can never overspend together.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from catalog.errors import BudgetExceededError, CatalogError
from mechanisms.privacy import PrivacyCost, convert

metadata = sa.MetaData()

datasets = sa.Table(
    "datasets",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("measure", sa.String(16), nullable=False),
    sa.Column("cap_epsilon", sa.Float, nullable=False, default=0.0),
    sa.Column("cap_rho", sa.Float, nullable=False, default=0.0),
    sa.Column("cap_delta", sa.Float, nullable=False, default=0.0),
    sa.Column("created_at", sa.String(40), nullable=False),
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

STATUSES = ("measuring", "failed", "staged", "approved", "rejected", "published")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def default_home() -> Path:
    return Path(os.environ.get("DPRELEASE_HOME", ".dprelease")).resolve()


def default_url() -> str:
    url = os.environ.get("DPRELEASE_CATALOG_URL")
    if url:
        return url
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'catalog.db'}"


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    seq: int
    receipt_id: str
    dataset_id: str
    release_id: str
    label: str
    cost: PrivacyCost
    created_at: str


@dataclass(frozen=True, kw_only=True)
class ReleaseRecord:
    id: str
    name: str
    dataset_id: str
    status: str
    spec_fingerprint: str
    input_fingerprint: str | None
    mechanism: str | None
    directory: str | None
    manifest_sha256: str | None
    published_directory: str | None
    created_at: str
    updated_at: str


@dataclass(frozen=True, kw_only=True)
class ReviewRecord:
    release_id: str
    decision: str
    reviewer: str
    note: str
    at: str


class Catalog:
    """Datasets, ledger and releases in one SQLAlchemy database."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_url()
        self.engine = _make_engine(self.url)
        metadata.create_all(self.engine)

    # --- datasets and budget ----------------------------------------------------------------------
    def ensure_dataset(self, dataset_id: str, *, cap: PrivacyCost) -> PrivacyCost:
        """Register ``dataset_id`` with ``cap`` on first use; afterwards the cap must match."""
        with self._write() as conn:
            row = conn.execute(sa.select(datasets).where(datasets.c.id == dataset_id)).first()
            if row is None:
                conn.execute(
                    datasets.insert().values(
                        id=dataset_id,
                        measure=cap.measure,
                        cap_epsilon=cap.epsilon,
                        cap_rho=cap.rho,
                        cap_delta=cap.delta,
                        created_at=now(),
                    )
                )
                return cap
        registered = _cap_from_row(row)
        if registered != cap:
            raise CatalogError(
                f"dataset {dataset_id!r} is registered with budget {registered.as_dict()}, but the "
                f"spec says {cap.as_dict()}; a lifetime cap cannot be changed by a spec"
            )
        return registered

    def cap(self, dataset_id: str) -> PrivacyCost:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(datasets).where(datasets.c.id == dataset_id)).first()
        if row is None:
            raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
        return _cap_from_row(row)

    def spent(self, dataset_id: str) -> PrivacyCost:
        with self.engine.connect() as conn:
            return self._spent(conn, dataset_id, self.cap(dataset_id).measure)

    def check_budget(self, dataset_id: str, cost: PrivacyCost) -> PrivacyCost:
        """Raise :class:`BudgetExceededError` if ``cost`` does not fit; return it in the cap's measure.

        Reads only; the authoritative check is repeated atomically by :meth:`charge`.
        """
        cap = self.cap(dataset_id)
        charged = convert(cost, to=cap.measure)
        spent = self.spent(dataset_id)
        if (spent + charged).exceeds(cap):
            raise _over_budget(dataset_id, charged, spent, cap)
        return charged

    def charge(self, dataset_id: str, cost: PrivacyCost, *, release_id: str, label: str) -> str:
        """Atomically check the cap and append one ledger row; return its receipt id."""
        with self._write() as conn:
            cap_row = conn.execute(
                sa.select(datasets).where(datasets.c.id == dataset_id).with_for_update()
            ).first()
            if cap_row is None:
                raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
            cap = _cap_from_row(cap_row)
            charged = convert(cost, to=cap.measure)
            spent = self._spent(conn, dataset_id, cap.measure)
            if (spent + charged).exceeds(cap):
                raise _over_budget(dataset_id, charged, spent, cap)
            receipt_id = f"rcpt-{uuid.uuid4().hex}"
            conn.execute(
                ledger.insert().values(
                    receipt_id=receipt_id,
                    dataset_id=dataset_id,
                    release_id=release_id,
                    label=label,
                    measure=charged.measure,
                    epsilon=charged.epsilon,
                    rho=charged.rho,
                    delta=charged.delta,
                    created_at=now(),
                )
            )
        return receipt_id

    def ledger_entries(self, dataset_id: str | None = None) -> list[LedgerEntry]:
        query = sa.select(ledger).order_by(ledger.c.seq)
        if dataset_id is not None:
            query = query.where(ledger.c.dataset_id == dataset_id)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [
            LedgerEntry(
                seq=row.seq,
                receipt_id=row.receipt_id,
                dataset_id=row.dataset_id,
                release_id=row.release_id,
                label=row.label,
                cost=PrivacyCost(
                    measure=row.measure, epsilon=row.epsilon, rho=row.rho, delta=row.delta
                ),
                created_at=row.created_at,
            )
            for row in rows
        ]

    def dataset_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return [
                row.id for row in conn.execute(sa.select(datasets.c.id).order_by(datasets.c.id))
            ]

    # --- releases ------------------------------------------------------------------------------------
    def create_release(
        self, *, release_id: str, name: str, dataset_id: str, spec_fingerprint: str, mechanism: str
    ) -> None:
        stamp = now()
        with self._write() as conn:
            conn.execute(
                releases.insert().values(
                    id=release_id,
                    name=name,
                    dataset_id=dataset_id,
                    status="measuring",
                    spec_fingerprint=spec_fingerprint,
                    mechanism=mechanism,
                    created_at=stamp,
                    updated_at=stamp,
                )
            )

    def update_release(self, release_id: str, **values: Any) -> None:
        if "status" in values and values["status"] not in STATUSES:
            raise CatalogError(f"status {values['status']!r} must be one of {STATUSES}")
        with self._write() as conn:
            result = conn.execute(
                releases.update()
                .where(releases.c.id == release_id)
                .values(updated_at=now(), **values)
            )
            if result.rowcount != 1:
                raise CatalogError(f"release {release_id!r} is not in the catalog")

    def release(self, release_id: str) -> ReleaseRecord:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(releases).where(releases.c.id == release_id)).first()
        if row is None:
            raise CatalogError(f"release {release_id!r} is not in the catalog")
        return ReleaseRecord(**row._asdict())

    def releases(
        self, *, dataset_id: str | None = None, status: str | None = None
    ) -> list[ReleaseRecord]:
        query = sa.select(releases).order_by(releases.c.created_at)
        if dataset_id is not None:
            query = query.where(releases.c.dataset_id == dataset_id)
        if status is not None:
            query = query.where(releases.c.status == status)
        with self.engine.connect() as conn:
            return [ReleaseRecord(**row._asdict()) for row in conn.execute(query)]

    def record_review(
        self, release_id: str, *, decision: str, reviewer: str, note: str
    ) -> ReviewRecord:
        """Append a review decision and move the release to approved/rejected (staged only)."""
        if decision not in ("approved", "rejected"):
            raise CatalogError(f"decision {decision!r} must be 'approved' or 'rejected'")
        if not reviewer.strip():
            raise CatalogError("reviewer must name a person (got an empty string)")
        stamp = now()
        with self._write() as conn:
            row = conn.execute(sa.select(releases).where(releases.c.id == release_id)).first()
            if row is None:
                raise CatalogError(f"release {release_id!r} is not in the catalog")
            if row.status != "staged":
                raise CatalogError(
                    f"release {release_id!r} is {row.status}; only a staged release can be reviewed"
                )
            conn.execute(
                reviews.insert().values(
                    release_id=release_id, decision=decision, reviewer=reviewer, note=note, at=stamp
                )
            )
            conn.execute(
                releases.update()
                .where(releases.c.id == release_id)
                .values(status=decision, updated_at=stamp)
            )
        return ReviewRecord(
            release_id=release_id, decision=decision, reviewer=reviewer, note=note, at=stamp
        )

    def reviews(self, release_id: str) -> list[ReviewRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(reviews).where(reviews.c.release_id == release_id).order_by(reviews.c.seq)
            ).all()
        return [
            ReviewRecord(
                release_id=r.release_id,
                decision=r.decision,
                reviewer=r.reviewer,
                note=r.note,
                at=r.at,
            )
            for r in rows
        ]

    # --- internals -------------------------------------------------------------------------------------
    def _write(self) -> Any:
        return self.engine.begin()

    @staticmethod
    def _spent(conn: Connection, dataset_id: str, measure: str) -> PrivacyCost:
        row = conn.execute(
            sa.select(
                sa.func.coalesce(sa.func.sum(ledger.c.epsilon), 0.0),
                sa.func.coalesce(sa.func.sum(ledger.c.rho), 0.0),
                sa.func.coalesce(sa.func.sum(ledger.c.delta), 0.0),
            ).where(ledger.c.dataset_id == dataset_id)
        ).one()
        return PrivacyCost(
            measure=measure, epsilon=float(row[0]), rho=float(row[1]), delta=float(row[2])
        )


def _cap_from_row(row: Any) -> PrivacyCost:
    return PrivacyCost(
        measure=row.measure, epsilon=row.cap_epsilon, rho=row.cap_rho, delta=row.cap_delta
    )


def _over_budget(
    dataset_id: str, requested: PrivacyCost, spent: PrivacyCost, cap: PrivacyCost
) -> BudgetExceededError:
    return BudgetExceededError(
        f"privacy budget of dataset {dataset_id!r} would be exceeded: requested "
        f"{requested.describe()}, spent {spent.describe()}, cap {cap.describe()} "
        f"(remaining {spent.remaining(cap).describe()})"
    )


def _make_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True)
    engine = sa.create_engine(url, connect_args={"timeout": 120})

    @sa.event.listens_for(engine, "connect")
    def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy's "begin" event issue BEGIN

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(conn: Connection) -> None:
        # Take SQLite's write lock at the start of every transaction: the budget check and the
        # ledger insert of two processes can then never interleave.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, indent=2, default=str)


class DatasetAccountant:
    """The :class:`mechanisms.session.Accountant` of one release on one dataset: every charge is a
    committed ledger row, and the receipts are kept for the manifest."""

    def __init__(self, catalog: Catalog, *, dataset_id: str, release_id: str) -> None:
        self.catalog = catalog
        self.dataset_id = dataset_id
        self.release_id = release_id
        self.receipts: list[str] = []

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        receipt = self.catalog.charge(
            self.dataset_id, cost, release_id=self.release_id, label=label
        )
        self.receipts.append(receipt)
        return receipt
