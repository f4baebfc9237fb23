"""The catalog database: datasets with lifetime budget caps, the append-only privacy ledger, releases.

SQLite under ``$DPRELEASE_HOME/catalog.db`` by default (``./.dprelease``); any SQLAlchemy URL
(``DPRELEASE_CATALOG_URL``, e.g. PostgreSQL) for shared deployments.

Ledger rules (privacy obligations): a charge is committed in its own transaction *before*
noise is drawn; it is never updated, deleted or refunded (a crashed or rejected release keeps its
charge); a charge that would take the dataset over its cap is refused with the requested, spent
and cap values in the message.  Charges are serialised: SQLite takes the write lock up front
(``BEGIN IMMEDIATE``) and other databases lock the chain row and the dataset row
(``SELECT … FOR UPDATE``), so two processes can never overspend together.

Tamper evidence: every ledger entry stores the SHA-256 of its canonical content including the hash
of the entry before it (a hash chain), and the chain's length and head are anchored outside the
database, authenticated with the catalog key (``catalog.keys``).  A deleted, edited or reordered
entry, or a catalog database deleted or replaced by an empty or another one, no longer verifies,
and new charges and releases are refused until it does (:meth:`Catalog.verify_chain`).  The anchor
is written after the commit, under a host-wide lock: a crash in between leaves it one entry behind,
which is accepted and repaired by the next write.

Partitions (parallel composition): a dataset may declare that its partitions (its files, or the
cells of one domain column) hold disjoint sets of people (``dataset.partitions`` in the spec,
recorded as ``datasets.partitioned_by``).  A charge then names the partitions the release reads
and appends one entry per partition, each with the full cost; an entry without a partition is a
whole-dataset charge and counts against every partition.  What a partition has spent is the
whole-dataset charges plus its own; what the dataset has spent (the most any one person has lost,
under the declared assumption) is the whole-dataset charges plus the largest partition's.  Every
partition has the dataset's cap.

Skipped releases: a scheduled or triggered release whose input and spec equal those of the last
release of its series charges nothing and appends a ``skipped`` entry (zero cost) instead
(:meth:`Catalog.create_release`), decided in the same transaction that would record the release,
so two arrivals of the same content never start two releases.

Releases hold a lease (owner pid, host and a heartbeat): :meth:`Catalog.recover` moves a release
whose process died, or whose heartbeat is older than the lease, from ``measuring`` to ``failed``
(``aborted`` when the process recorded an interrupt); its charges stay spent.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import unicodedata
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from catalog import keys
from catalog.errors import BudgetExceededError, CatalogError
from catalog.home import default_home
from catalog.processes import is_alive, process_start
from mechanisms.privacy import PrivacyCost, convert

SCHEMA_NAME = "dprelease-catalog"
SCHEMA_VERSION = 3  # 1: before the hash chain and leases; 2: before partitions and skipped entries
GENESIS = "0" * 64  # the "previous hash" of the first ledger entry
CHAIN_FORMAT = "dprelease-ledger-entry/1"
# Entries that are not plain whole-dataset charges (a partition, or a skipped release) are hashed
# in format 2, which adds the kind and the partition; plain charges keep format 1, so every entry
# written before schema 3 still verifies.
CHAIN_FORMAT_V2 = "dprelease-ledger-entry/2"
ENTRY_KINDS = ("charge", "skipped")
MAX_PARTITIONS_PER_RELEASE = 1000  # one ledger entry each, written in one transaction
DEFAULT_LEASE_SECONDS = 3600.0
MAX_REVIEWER_LENGTH = 128
MAX_PROBLEMS_SHOWN = 20
SQLITE_HEADER = b"SQLite format 3\x00"
SCHEMA_LOCK_ID = 0x64707265  # PostgreSQL advisory lock key of schema changes ("dpre")
# Tables other dprelease modules keep in the catalog database (watch_state, ldp_release).
AUXILIARY_TABLES = frozenset(
    {"announced_files", "review_runs", "ldp_collections", "review_policies", "synthetic_files"}
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
# A release that failed or was aborted released nothing: "unchanged" never compares with it.
_NOT_RELEASED = ("failed", "aborted")

STATUSES = ("measuring", "failed", "aborted", "staged", "approved", "rejected", "published")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


_stamp = now  # for methods whose ``now`` parameter shadows the function


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
    prev_hash: str | None = None
    entry_hash: str | None = None
    kind: str = "charge"
    partition: str | None = None

    def receipt(self) -> dict[str, Any]:
        """What a manifest records of this charge (``artifacts.verify`` compares every field)."""
        receipt = {
            "receipt_id": self.receipt_id,
            "label": self.label,
            "cost": self.cost.as_dict(),
            "paid_by_release": self.release_id,
            "seq": self.seq,
            "entry_hash": self.entry_hash,
        }
        if self.partition is not None:
            receipt["partition"] = self.partition
        return receipt


@dataclass(frozen=True, kw_only=True)
class PartitionSpending:
    """What one partition of a partitioned dataset has spent (its own charges plus every
    whole-dataset charge) and has left of the dataset's cap.  Public."""

    partition: str
    spent: PrivacyCost
    remaining: PrivacyCost
    entries: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "spent": self.spent.as_dict(),
            "remaining": self.remaining.as_dict(),
            "entries": self.entries,
        }


@dataclass(frozen=True, kw_only=True)
class SkippedRelease:
    """A release that was not made: its input and spec equal those of ``unchanged_since``, the
    last release of its series.  Nothing was charged; ``receipt_id`` is the ``skipped`` entry."""

    release_id: str
    name: str
    dataset_id: str
    unchanged_since: str
    receipt_id: str


@dataclass(frozen=True, kw_only=True)
class ChainHead:
    """A point of the ledger's hash chain: the entry ``seq`` and its hash (``seq`` 0: empty)."""

    seq: int
    entry_hash: str

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "entry_hash": self.entry_hash}


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
    owner_pid: int | None = None
    owner_host: str | None = None
    owner_start: str | None = None
    heartbeat_at: str | None = None
    interrupted_at: str | None = None
    series_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class ReviewRecord:
    release_id: str
    decision: str
    reviewer: str
    note: str
    at: str


@dataclass(frozen=True, kw_only=True)
class RecoveredRelease:
    """A release :meth:`Catalog.recover` moved out of ``measuring`` (its charges stay spent)."""

    release_id: str
    dataset_id: str
    previous_status: str
    status: str
    reason: str
    charges: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def entry_digest(
    *,
    seq: int,
    receipt_id: str,
    dataset_id: str,
    release_id: str,
    label: str,
    measure: str,
    epsilon: float,
    rho: float,
    delta: float,
    created_at: str,
    prev_hash: str,
    entry_kind: str = "charge",
    partition_key: str | None = None,
) -> str:
    """SHA-256 of one ledger entry's canonical content, chained to ``prev_hash``. O(1)."""
    return _digest(
        (
            seq,
            receipt_id,
            dataset_id,
            release_id,
            label,
            measure,
            epsilon,
            rho,
            delta,
            created_at,
            entry_kind,
            partition_key,
        ),
        prev_hash,
    )


_CHAIN_COLUMNS = (
    "seq",
    "receipt_id",
    "dataset_id",
    "release_id",
    "label",
    "measure",
    "epsilon",
    "rho",
    "delta",
    "created_at",
    "entry_kind",
    "partition_key",
)


def _digest(values: tuple[Any, ...], prev_hash: str) -> str:
    """Length-prefixed fields (unambiguous whatever a label contains), floats by ``repr``.

    A plain whole-dataset charge is hashed in format 1 (as before schema 3); any other entry in
    format 2, which also covers its kind and partition: a changed kind or partition changes the
    format or the content, so it never verifies.
    """
    fields = dict(zip(_CHAIN_COLUMNS, values, strict=True))
    kind, partition = fields["entry_kind"] or "charge", fields["partition_key"]
    plain = kind == "charge" and partition is None
    extra = () if plain else (str(kind), "" if partition is None else f"={partition}")
    parts = (
        CHAIN_FORMAT if plain else CHAIN_FORMAT_V2,
        str(int(fields["seq"])),
        *(fields[name] for name in ("receipt_id", "dataset_id", "release_id", "label", "measure")),
        *(repr(float(fields[name])) for name in ("epsilon", "rho", "delta")),
        fields["created_at"],
        *extra,
        prev_hash,
    )
    return sha256("".join(f"{len(p)}:{p};" for p in parts).encode()).hexdigest()


def chain_problems(rows: list[Any]) -> list[str]:
    """Entries (in ``seq`` order) whose hash or link to the previous entry does not verify. O(n).

    ``rows``: the ledger's chain columns (:data:`_CHAIN_COLUMNS`, ``prev_hash``, ``entry_hash``).
    """
    problems = []
    expected_prev, previous = GENESIS, "the start of the ledger"
    for row in rows:
        *values, prev_hash, entry_hash = row
        problem = None
        if entry_hash is None or prev_hash is None:
            problem = "carries no chain hash: it was inserted outside dprelease"
        elif _digest(tuple(values), prev_hash) != entry_hash:
            problem = "was edited: its content no longer matches its hash"
        elif prev_hash != expected_prev:
            problem = (
                f"does not follow {previous}: an entry was deleted or inserted, or the entries "
                "were reordered"
            )
        if problem is not None:
            problems.append(f"ledger entry #{row.seq} (receipt {row.receipt_id}) {problem}")
        expected_prev, previous = entry_hash, f"entry #{row.seq}"
    return problems


def anchor_problems(anchor: keys.Anchor | None, rows: list[Any]) -> list[str]:
    """Does the chain match its anchor?  The anchor may be one entry behind (a crash between a
    commit and the anchor update); it is never ahead.  No anchor yet: nothing to compare."""
    if anchor is None:
        return []
    count = len(rows)
    if anchor.entries > count:
        return [
            f"the ledger has {count} entries but its anchor records {anchor.entries}: entries "
            "were deleted, or the catalog database was deleted or replaced (by an empty or "
            "another one)"
        ]
    if anchor.entries < count - 1:
        return [
            f"the ledger has {count} entries but its anchor records only {anchor.entries}: "
            "entries were added outside dprelease, or another host charges this catalog without "
            "sharing its key directory"
        ]
    anchored = rows[anchor.entries - 1].entry_hash if anchor.entries else GENESIS
    if anchored != anchor.head:
        return [
            f"ledger entry {anchor.entries} of {count} does not have the hash its anchor records: "
            "the ledger was rewritten or the catalog database was replaced"
        ]
    return []


def normalize_reviewer(reviewer: str) -> str:
    """NFKC-normalised, stripped, visible and non-empty: the name a review record keeps.

    Refused: control and format characters (zero-width spaces and joiners, bidi overrides, soft
    hyphens), separators other than a space, and the invisible default-ignorable code points that
    Unicode files as letters or marks (Hangul fillers, the combining grapheme joiner, variation
    selectors): two names that look the same must be the same name.
    """
    name = unicodedata.normalize("NFKC", str(reviewer)).strip()
    if not name:
        raise CatalogError("reviewer must name a person (got an empty string)")
    if len(name) > MAX_REVIEWER_LENGTH:
        raise CatalogError(
            f"reviewer must be at most {MAX_REVIEWER_LENGTH} characters (got {len(name)})"
        )
    for position, char in enumerate(name):
        kind = _invisible_kind(char)
        if kind is not None:
            raise CatalogError(
                f"reviewer {name!r} must be printable text: character U+{ord(char):04X} "
                f"({unicodedata.name(char, 'unnamed')}) at position {position} is not printable "
                f"({kind})"
            )
    return name


def same_person(first: str, second: str) -> bool:
    """Do two (normalised) names name the same person?  Case and spacing do not count."""
    return " ".join(first.casefold().split()) == " ".join(second.casefold().split())


# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) outside the categories
# ``str.isprintable`` already refuses: rendered as nothing.
_DEFAULT_IGNORABLE = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
_CATEGORY_KINDS = {
    "Cc": "a control character",
    "Cf": "a format character: invisible",
    "Cs": "a surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


def _invisible_kind(char: str) -> str | None:
    """Why ``char`` may not be part of a name, or None.  O(1)."""
    if char == " ":
        return None
    category = unicodedata.category(char)
    if category in _CATEGORY_KINDS:
        return _CATEGORY_KINDS[category]
    if category == "Zs":
        return "a space other than U+0020"
    code = ord(char)
    if any(low <= code <= high for low, high in _DEFAULT_IGNORABLE):
        return "a default-ignorable character: invisible"
    if code == 0x2800:  # BRAILLE PATTERN BLANK: a symbol that renders as a blank
        return "a blank symbol: invisible"
    return None


class Catalog:
    """Datasets, ledger and releases in one SQLAlchemy database.

    Opening checks what the database is: a fresh one is initialised, a catalog of the previous
    schema is migrated (chain hashes built over its existing entries), and a file that is not
    SQLite or an SQLite database without the catalog's tables raises :class:`CatalogError` and is
    left untouched.
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_url()
        self._key: keys.CatalogKey | None = None
        _refuse_foreign_file(self.url)
        self.engine = _make_engine(self.url)
        dispose_with(self, self.engine)
        try:
            self._open_schema()
        except sa.exc.OperationalError as exc:
            raise CatalogError(
                f"catalog {redacted(self.url)} cannot be opened: {exc.orig}"
            ) from None
        except sa.exc.DatabaseError as exc:
            raise CatalogError(
                f"catalog {redacted(self.url)} is damaged and cannot be read ({exc.orig}); it was left "
                "unchanged: restore it from a backup"
            ) from None

    # --- the key and the hash chain ---------------------------------------------------------------
    @property
    def key(self) -> keys.CatalogKey:
        """The catalog's secret (created with mode 0600 at first use); ``key.key_id`` is public."""
        if self._key is None:
            self._key = keys.catalog_key(self.url)
        return self._key

    def fingerprint_key_id(self) -> str:
        """The id of the key input fingerprints are computed with (what a manifest records)."""
        return self.key.key_id

    def chain_head(self, dataset_id: str | None = None) -> ChainHead:
        """The last ledger entry (of ``dataset_id``, or of the whole ledger) as a point of the chain.

        A release's manifest records it after the release's charges: ``verify`` then checks that
        this point is still on the chain.
        """
        query = sa.select(ledger.c.seq, ledger.c.entry_hash).order_by(ledger.c.seq.desc()).limit(1)
        if dataset_id is not None:
            query = query.where(ledger.c.dataset_id == dataset_id)
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return ChainHead(seq=0, entry_hash=GENESIS)
        return ChainHead(seq=row.seq, entry_hash=row.entry_hash or "")

    def verify_chain(self) -> list[str]:
        """Every problem of the hash chain and its anchor, as readable lines (empty: it verifies).

        Reads only; O(entries).
        """
        with self.engine.connect() as conn:
            rows = _chain_rows(conn)
        return chain_problems(rows) + self._anchor_problems(rows)

    def adopt_ledger(self, *, reason: str) -> ChainHead:
        """Accept the ledger as it is now as the anchored truth (e.g. a catalog restored from a
        backup on purpose).  Only an internally consistent chain can be adopted; the previous
        anchor and ``reason`` are kept in the anchor's history."""
        reason = " ".join(str(reason).split())
        if not reason:
            raise CatalogError("reason must say why the ledger is adopted (got an empty string)")
        key = self.key
        with key.locked(), self._write() as conn:
            _lock_chain(conn, self.url)
            rows = _chain_rows(conn)
            problems = chain_problems(rows)
            if problems:
                raise CatalogError(
                    "the ledger's own hash chain does not verify, so it cannot be adopted:\n"
                    + _bullets(problems)
                )
            try:
                anchor = key.read_anchor()
                previous: Any = (
                    None if anchor is None else {"entries": anchor.entries, "head": anchor.head}
                )
                history = list(anchor.adopted) if anchor is not None else []
            except CatalogError as exc:
                previous, history = f"unreadable: {exc}", []
            head = rows[-1].entry_hash if rows else GENESIS
            stamp = now()
            history.append(
                {
                    "at": stamp,
                    "reason": reason,
                    "previous": previous,
                    "entries": len(rows),
                    "head": head,
                }
            )
            key.write_anchor(entries=len(rows), head=head, written_at=stamp, adopted=history)
        return ChainHead(seq=rows[-1].seq if rows else 0, entry_hash=head)

    # --- datasets and budget ----------------------------------------------------------------------
    def ensure_dataset(
        self, dataset_id: str, *, cap: PrivacyCost, partitioned_by: str | None = None
    ) -> PrivacyCost:
        """Register ``dataset_id`` with ``cap`` on first use; afterwards the cap must match.

        ``partitioned_by`` (``"file"`` or ``"column:NAME"``) records the spec's declaration that
        the partitions hold disjoint sets of people.  It may be added to a dataset registered
        without one (its whole-dataset charges keep counting against every partition) but never
        changed to another partitioning: charges of one partitioning say nothing about the
        partitions of another.  A spec without the declaration releases the whole dataset.
        """
        with self._ledger_write() as conn:
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
                        partitioned_by=partitioned_by,
                    )
                )
                return cap
            registered = _cap_from_row(row)
            if registered != cap:
                raise CatalogError(
                    f"dataset {dataset_id!r} is registered with budget {registered.as_dict()}, but "
                    f"the spec says {cap.as_dict()}; a lifetime cap cannot be changed by a spec"
                )
            if partitioned_by is not None and row.partitioned_by not in (None, partitioned_by):
                raise CatalogError(
                    f"dataset {dataset_id!r} is registered as partitioned by "
                    f"{row.partitioned_by!r}, but the spec's dataset.partitions says "
                    f"{partitioned_by!r}; a partitioning cannot be changed (charges of one "
                    "partitioning say nothing about the partitions of another): use a new "
                    "dataset id, or drop dataset.partitions to release the whole dataset"
                )
            if partitioned_by is not None and row.partitioned_by is None:
                conn.execute(
                    datasets.update()
                    .where(datasets.c.id == dataset_id)
                    .values(partitioned_by=partitioned_by)
                )
        return registered

    def partitioned_by(self, dataset_id: str) -> str | None:
        """The dataset's registered partitioning (``"file"``, ``"column:NAME"``) or None."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(datasets.c.partitioned_by).where(datasets.c.id == dataset_id)
            ).first()
        if row is None:
            raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
        return row.partitioned_by

    def cap(self, dataset_id: str) -> PrivacyCost:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(datasets).where(datasets.c.id == dataset_id)).first()
        if row is None:
            raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
        return _cap_from_row(row)

    def spent(self, dataset_id: str, *, partitions: tuple[str, ...] | None = None) -> PrivacyCost:
        """What the dataset has spent: the whole-dataset charges plus the largest partition's.

        With ``partitions``: the most any of those partitions has spent (what bounds a release
        that reads them).  Without partitions in the ledger, the sum of all charges.  O(entries).
        """
        with self.engine.connect() as conn:
            spending = _Spending.read(conn, dataset_id, self.cap(dataset_id).measure)
        return spending.worst(partitions)[1]

    def partition_spending(self, dataset_id: str) -> list[PartitionSpending]:
        """Per partition charged so far (sorted by name): spent, remaining, entries.  Empty for a
        dataset never charged by partition.  O(entries)."""
        cap = self.cap(dataset_id)
        with self.engine.connect() as conn:
            spending = _Spending.read(conn, dataset_id, cap.measure)
        result = []
        for name in sorted(spending.parts):
            spent = spending.whole + spending.parts[name]
            result.append(
                PartitionSpending(
                    partition=name,
                    spent=spent,
                    remaining=spent.remaining(cap),
                    entries=spending.counts[name],
                )
            )
        return result

    def check_budget(
        self, dataset_id: str, cost: PrivacyCost, *, partitions: tuple[str, ...] | None = None
    ) -> PrivacyCost:
        """Raise :class:`BudgetExceededError` if ``cost`` does not fit (in every one of
        ``partitions``, when given); return it in the cap's measure.

        Reads only; the authoritative check is repeated atomically by :meth:`charge`.
        """
        _check_partitions(partitions)
        cap = self.cap(dataset_id)
        charged = convert(cost, to=cap.measure)
        with self.engine.connect() as conn:
            spending = _Spending.read(conn, dataset_id, cap.measure)
        spending.check(dataset_id, charged, cap, partitions)
        return charged

    def charge(
        self,
        dataset_id: str,
        cost: PrivacyCost,
        *,
        release_id: str,
        label: str,
        partitions: tuple[str, ...] | None = None,
    ) -> str:
        """Atomically check the cap and append chained ledger rows; return the first receipt id.

        Without ``partitions``: one whole-dataset row.  With: one row per partition, each with
        the full cost, after checking every partition's cap (parallel composition: each person
        is in at most one partition, as the dataset declares).
        """
        _check_partitions(partitions)
        with self._ledger_write() as conn:
            cap_row = conn.execute(
                sa.select(datasets).where(datasets.c.id == dataset_id).with_for_update()
            ).first()
            if cap_row is None:
                raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
            cap = _cap_from_row(cap_row)
            charged = convert(cost, to=cap.measure)
            _Spending.read(conn, dataset_id, cap.measure).check(
                dataset_id, charged, cap, partitions
            )
            receipts = [
                _append_entry(
                    conn,
                    dataset_id=dataset_id,
                    release_id=release_id,
                    label=label,
                    cost=charged,
                    partition=partition,
                )
                for partition in (partitions or (None,))
            ]
            # a charge is a sign of life of the release that pays it
            conn.execute(
                releases.update()
                .where(releases.c.id == release_id, releases.c.status == "measuring")
                .values(heartbeat_at=now())
            )
        return receipts[0]

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
                prev_hash=row.prev_hash,
                entry_hash=row.entry_hash,
                kind=row.entry_kind,
                partition=row.partition_key,
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
        self,
        *,
        release_id: str,
        name: str,
        dataset_id: str,
        spec_fingerprint: str,
        mechanism: str,
        input_fingerprint: str | None = None,
        series_key: str | None = None,
        skip_unchanged: bool = False,
    ) -> SkippedRelease | None:
        """Record a release's intent (status ``measuring``), leased to this process.

        ``skip_unchanged``: when the last release of the series (same ``name`` and
        ``dataset_id``; failed and aborted ones released nothing and do not count; one still
        measuring does) has the same ``series_key`` and ``input_fingerprint``, record nothing but a
        zero-cost ``skipped`` ledger entry and return it.  Decided in the transaction that would
        record the release, so two runs on the same content never both release.
        """
        if skip_unchanged and (series_key is None or input_fingerprint is None):
            raise CatalogError(
                "skip_unchanged needs the release's series_key and input_fingerprint"
            )
        stamp = now()
        with self._ledger_write() as conn:
            if skip_unchanged:
                skipped = _skip_if_unchanged(
                    conn,
                    release_id=release_id,
                    name=name,
                    dataset_id=dataset_id,
                    series_key=str(series_key),
                    input_fingerprint=str(input_fingerprint),
                )
                if skipped is not None:
                    return skipped
            conn.execute(
                releases.insert().values(
                    id=release_id,
                    name=name,
                    dataset_id=dataset_id,
                    status="measuring",
                    spec_fingerprint=spec_fingerprint,
                    input_fingerprint=input_fingerprint,
                    series_key=series_key,
                    mechanism=mechanism,
                    created_at=stamp,
                    updated_at=stamp,
                    heartbeat_at=stamp,
                    **process_owner(),
                )
            )
        return None

    def skip_if_unchanged(
        self,
        *,
        release_id: str,
        name: str,
        dataset_id: str,
        series_key: str,
        input_fingerprint: str,
    ) -> SkippedRelease | None:
        """Record a ``skipped`` entry for ``release_id`` and return it when the last release of
        the series is unchanged (see :meth:`create_release`); else record nothing, return None."""
        with self._ledger_write() as conn:
            return _skip_if_unchanged(
                conn,
                release_id=release_id,
                name=name,
                dataset_id=dataset_id,
                series_key=series_key,
                input_fingerprint=input_fingerprint,
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

    def heartbeat(self, release_id: str) -> None:
        """Renew the lease of a ``measuring`` release (call it from long stages, from any process;
        the owner stays the process that registered the release).

        Raises :class:`CatalogError` when the release is no longer ``measuring`` (e.g. ``recover``
        moved it to ``failed`` after its lease expired): the run must stop; its charges stay spent.
        """
        with self._write() as conn:
            row = conn.execute(  # locked: a concurrent recover waits, then sees this heartbeat
                sa.select(releases.c.status).where(releases.c.id == release_id).with_for_update()
            ).first()
            if row is None:
                raise CatalogError(f"release {release_id!r} is not in the catalog")
            if row.status != "measuring":
                raise CatalogError(
                    f"release {release_id!r} is {row.status}, not measuring: its lease ended "
                    "(see `dprelease recover`); this run must stop, its charges stay spent"
                )
            conn.execute(
                releases.update().where(releases.c.id == release_id).values(heartbeat_at=now())
            )

    def mark_interrupted(self, release_id: str) -> None:
        """Record that the release's process was interrupted (Ctrl-C): ``recover`` then moves it
        to ``aborted`` rather than ``failed`` if the process dies before recording that itself."""
        self.update_release(release_id, interrupted_at=now())

    def recover(
        self, *, now: datetime | None = None, lease_seconds: float = DEFAULT_LEASE_SECONDS
    ) -> list[RecoveredRelease]:
        """Move every ``measuring`` release whose process is gone to ``failed`` (``aborted`` if it
        recorded an interrupt); return what moved.  Charges are kept (the ledger is untouched).

        Gone: the owner process on this host no longer exists (or its pid was reused), or the last
        sign of life (heartbeat, charge, update) is older than ``lease_seconds``.
        """
        if not lease_seconds > 0:
            raise CatalogError(f"lease_seconds ({lease_seconds!r}) must be > 0")
        clock = now or datetime.now(UTC)
        if clock.tzinfo is None:
            raise CatalogError(f"now ({clock.isoformat()}) must carry a time zone (UTC)")
        moved = []
        for record in self.releases(status="measuring"):
            reason = _stuck_reason(record, clock=clock, lease_seconds=lease_seconds)
            if reason is None:
                continue
            status = "aborted" if record.interrupted_at else "failed"
            with self._write() as conn:
                result = conn.execute(
                    releases.update()
                    .where(
                        releases.c.id == record.id,
                        releases.c.status == "measuring",
                        releases.c.heartbeat_at.is_not_distinct_from(record.heartbeat_at),
                        releases.c.updated_at == record.updated_at,
                    )
                    .values(status=status, updated_at=_stamp())
                )
                charges = conn.execute(
                    sa.select(sa.func.count()).where(ledger.c.release_id == record.id)
                ).scalar_one()
            if result.rowcount == 1:  # else it showed a sign of life meanwhile
                moved.append(
                    RecoveredRelease(
                        release_id=record.id,
                        dataset_id=record.dataset_id,
                        previous_status="measuring",
                        status=status,
                        reason=reason,
                        charges=int(charges),
                    )
                )
        return moved

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
        self,
        release_id: str,
        *,
        decision: str,
        reviewer: str,
        note: str,
        published_directory: str | None = None,
        required_approvals: int = 1,
    ) -> ReviewRecord:
        """Append a review decision and move the release to approved/rejected (staged only).

        ``reviewer`` is NFKC-normalised and must be printable and non-empty.  A rejection decides;
        an approval decides once ``required_approvals`` distinct reviewers (:func:`same_person`)
        approved, until then the release stays ``staged``.  The deciding approval may record where
        the release will be published (``published_directory``) in the same transaction, so an
        interrupted publication resumes to the same place.
        """
        if decision not in ("approved", "rejected"):
            raise CatalogError(f"decision {decision!r} must be 'approved' or 'rejected'")
        if required_approvals < 1:
            raise CatalogError(f"required_approvals ({required_approvals}) must be >= 1")
        reviewer = normalize_reviewer(reviewer)
        stamp = now()
        with self._write() as conn:
            row = conn.execute(  # locked: of two concurrent reviews only the first sees "staged"
                sa.select(releases).where(releases.c.id == release_id).with_for_update()
            ).first()
            if row is None:
                raise CatalogError(f"release {release_id!r} is not in the catalog")
            if row.status != "staged":
                raise CatalogError(
                    f"release {release_id!r} is {row.status}; only a staged release can be reviewed"
                )
            approvers = conn.execute(
                sa.select(reviews.c.reviewer).where(
                    reviews.c.release_id == release_id, reviews.c.decision == "approved"
                )
            ).scalars()
            approvals = 0
            for earlier in approvers:
                approvals += 1
                if same_person(earlier, reviewer):
                    raise CatalogError(
                        f"reviewer {reviewer!r} already approved release {release_id!r}; it needs "
                        f"{required_approvals} approvals by distinct reviewers"
                    )
            conn.execute(
                reviews.insert().values(
                    release_id=release_id, decision=decision, reviewer=reviewer, note=note, at=stamp
                )
            )
            values: dict[str, Any] = {"updated_at": stamp}
            if decision == "rejected" or approvals + 1 >= required_approvals:
                values["status"] = decision
            if published_directory is not None and "status" in values:
                values["published_directory"] = published_directory
            conn.execute(releases.update().where(releases.c.id == release_id).values(**values))
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

    @contextlib.contextmanager
    def _ledger_write(self) -> Iterator[Connection]:
        """A write transaction that first verifies the chain and its anchor (refusing with
        :class:`CatalogError` when they do not verify) and afterwards moves the anchor to the new
        head.  Host lock first, then the database lock (never the other way round). O(entries)."""
        key = self.key
        with key.locked():
            with self._write() as conn:
                _lock_chain(conn, self.url)
                rows = _chain_rows(conn)
                problems = chain_problems(rows) + self._anchor_problems(rows)
                if problems:
                    raise CatalogError(
                        f"catalog {redacted(self.url)} failed its integrity check; new charges and releases "
                        "are refused:\n"
                        + _bullets(problems)
                        + "\nIf the catalog was restored from a backup on purpose, accept its "
                        "ledger with `dprelease recover --adopt-ledger REASON`."
                    )
                anchor = key.read_anchor()
                yield conn
                entries, head = _head(conn)
            if anchor is None or (anchor.entries, anchor.head) != (entries, head):
                key.write_anchor(
                    entries=entries,
                    head=head,
                    written_at=now(),
                    adopted=() if anchor is None else anchor.adopted,
                )

    def _anchor_problems(self, rows: list[Any]) -> list[str]:
        try:
            path = keys.key_path(self.url)
            if path is not None and not path.exists() and not path.with_suffix(".anchor").exists():
                return []  # no key and no anchor yet: the next write anchors the ledger
            return anchor_problems(keys.catalog_key(self.url).read_anchor(), rows)
        except CatalogError as exc:  # e.g. the key is missing but its anchor exists
            return [str(exc)]

    def _open_schema(self) -> None:
        with self.engine.connect() as conn:
            state = _schema_state(conn, self.url)
        if state == "current":
            return
        with self._write() as conn:  # one process initialises or migrates; the others wait
            lock_schema(conn)
            state = _schema_state(conn, self.url)
            if state == "fresh":
                metadata.create_all(conn)
                _write_marker(conn)
            elif state == "legacy":
                _migrate_v1(conn)
            elif state == "outdated":
                _migrate_v2(conn)
        if state != "current":
            self._anchor_initial_state()

    def _anchor_initial_state(self) -> None:
        """Anchor a new or just-migrated catalog, unless an anchor already vouches for entries
        (then this database replaced another one, and the integrity check reports it)."""
        key = self.key
        with key.locked():
            try:
                anchor = key.read_anchor()
            except CatalogError:
                return  # reported by every integrity check
            if anchor is not None and anchor.entries > 0:
                return
            with self.engine.connect() as conn:
                entries, head = _head(conn)
            if anchor is None or entries > 0:
                key.write_anchor(entries=entries, head=head, written_at=now())


@dataclass(frozen=True, kw_only=True)
class _Spending:
    """A dataset's charges summed per partition: ``whole`` (entries without a partition, which
    count against every partition) and ``parts`` (each partition's own entries)."""

    measure: str
    whole: PrivacyCost
    parts: dict[str, PrivacyCost]
    counts: dict[str, int]

    @classmethod
    def read(cls, conn: Connection, dataset_id: str, measure: str) -> _Spending:
        """One GROUP BY over the dataset's entries. O(entries)."""
        rows = conn.execute(
            sa.select(
                ledger.c.partition_key,
                sa.func.coalesce(sa.func.sum(ledger.c.epsilon), 0.0),
                sa.func.coalesce(sa.func.sum(ledger.c.rho), 0.0),
                sa.func.coalesce(sa.func.sum(ledger.c.delta), 0.0),
                sa.func.count(),
            )
            .where(ledger.c.dataset_id == dataset_id, ledger.c.entry_kind == "charge")
            .group_by(ledger.c.partition_key)
        ).all()
        whole = PrivacyCost.zero(measure)
        parts: dict[str, PrivacyCost] = {}
        counts: dict[str, int] = {}
        for key, epsilon, rho, delta, count in rows:
            cost = PrivacyCost(
                measure=measure, epsilon=float(epsilon), rho=float(rho), delta=float(delta)
            )
            if key is None:
                whole = cost
            else:
                parts[key], counts[key] = cost, int(count)
        return cls(measure=measure, whole=whole, parts=parts, counts=counts)

    def worst(self, partitions: tuple[str, ...] | None) -> tuple[str | None, PrivacyCost]:
        """The partition that has spent the most among ``partitions`` (all charged ones when None)
        and the most any of them spent, whole-dataset charges included (None and ``whole`` when
        there is none).  Each component is the largest of any partition's, so a check against it
        is a check against every one.  O(partitions)."""
        names = sorted(self.parts) if partitions is None else list(partitions)
        zero = PrivacyCost.zero(self.measure)
        costs = [self.parts.get(name, zero) for name in names]
        if not costs:
            return None, self.whole
        top = PrivacyCost(
            measure=self.measure,
            epsilon=max(c.epsilon for c in costs),
            rho=max(c.rho for c in costs),
            delta=max(c.delta for c in costs),
        )
        largest = max(range(len(costs)), key=lambda k: (costs[k].epsilon, costs[k].rho))
        return names[largest], self.whole + top

    def check(
        self,
        dataset_id: str,
        charged: PrivacyCost,
        cap: PrivacyCost,
        partitions: tuple[str, ...] | None,
    ) -> None:
        partition, spent = self.worst(partitions)
        if (spent + charged).exceeds(cap):
            raise _over_budget(
                dataset_id, charged, spent, cap, partition=partition if partitions else None
            )


def running_spend(entries: list[LedgerEntry], measure: str) -> list[PrivacyCost]:
    """The spend after each entry (in ``seq`` order, of one dataset): for a partition's entry what
    that partition has spent, for any other entry what the dataset has spent (the whole-dataset
    charges plus the largest partition's); without partitions, the running sum.  Skipped entries
    charge nothing.  O(entries × partitions)."""
    whole, parts = PrivacyCost.zero(measure), {}
    result = []
    for entry in entries:
        if entry.kind == "charge" and entry.partition is None:
            whole = whole + entry.cost
        elif entry.kind == "charge":
            parts[entry.partition] = parts.get(entry.partition, PrivacyCost.zero(measure)) + (
                entry.cost
            )
        spending = _Spending(measure=measure, whole=whole, parts=dict(parts), counts={})
        result.append(spending.worst(None if entry.partition is None else (entry.partition,))[1])
    return result


def _check_partitions(partitions: tuple[str, ...] | None) -> None:
    if partitions is None:
        return
    if not partitions:
        raise CatalogError("partitions must name at least one partition (None: the whole dataset)")
    if len(set(partitions)) != len(partitions):
        raise CatalogError(f"partitions {list(partitions)[:10]} name a partition twice")
    if len(partitions) > MAX_PARTITIONS_PER_RELEASE:
        raise CatalogError(
            f"a release reads {len(partitions)} partitions; at most "
            f"{MAX_PARTITIONS_PER_RELEASE} are charged by partition (declare coarser partitions, "
            "or drop dataset.partitions to charge the whole dataset once)"
        )
    for name in partitions:
        if not isinstance(name, str) or not name or len(name) > 256:
            raise CatalogError(
                f"partition {name!r} must be a non-empty name of at most 256 characters"
            )


def _skip_if_unchanged(
    conn: Connection,
    *,
    release_id: str,
    name: str,
    dataset_id: str,
    series_key: str,
    input_fingerprint: str,
) -> SkippedRelease | None:
    """Inside a ledger write: the ``skipped`` entry when the series' last release is unchanged.

    The series is the spec's ``name`` within its dataset id; its last release is the newest one
    that did not fail or abort (one still measuring counts: a second run on the same content
    is skipped, unless the first one's process is gone or its lease expired, see
    :meth:`Catalog.recover`: it will release nothing, so this run releases).  Unchanged: same
    ``series_key`` (the spec without its source) and same keyed input fingerprint.
    O(releases of the series) with no index.
    """
    last = conn.execute(
        sa.select(releases)
        .where(
            releases.c.name == name,
            releases.c.dataset_id == dataset_id,
            releases.c.status.not_in(_NOT_RELEASED),
        )
        .order_by(releases.c.created_at.desc(), releases.c.id.desc())
        .limit(1)
    ).first()
    if last is None or (last.series_key, last.input_fingerprint) != (
        series_key,
        input_fingerprint,
    ):
        return None
    if last.status == "measuring" and _stuck_reason(
        ReleaseRecord(**last._asdict()),
        clock=datetime.now(UTC),
        lease_seconds=DEFAULT_LEASE_SECONDS,
    ):
        return None
    measure = conn.execute(
        sa.select(datasets.c.measure).where(datasets.c.id == dataset_id)
    ).scalar_one()
    receipt = _append_entry(
        conn,
        dataset_id=dataset_id,
        release_id=release_id,
        label=f"{name}: skipped, input and spec unchanged since {last.id}",
        cost=PrivacyCost.zero(measure),
        kind="skipped",
    )
    return SkippedRelease(
        release_id=release_id,
        name=name,
        dataset_id=dataset_id,
        unchanged_since=last.id,
        receipt_id=receipt,
    )


def _append_entry(
    conn: Connection,
    *,
    dataset_id: str,
    release_id: str,
    label: str,
    cost: PrivacyCost,
    kind: str = "charge",
    partition: str | None = None,
) -> str:
    """Append one chained ledger entry (inside a :meth:`Catalog._ledger_write`); its receipt id."""
    if kind not in ENTRY_KINDS:
        raise CatalogError(f"ledger entry kind {kind!r} must be one of {ENTRY_KINDS}")
    last = conn.execute(
        sa.select(ledger.c.seq, ledger.c.entry_hash).order_by(ledger.c.seq.desc()).limit(1)
    ).first()
    values: dict[str, Any] = {
        "seq": 1 if last is None else last.seq + 1,
        "receipt_id": f"rcpt-{uuid.uuid4().hex}",
        "dataset_id": dataset_id,
        "release_id": release_id,
        "label": label,
        "measure": cost.measure,
        "epsilon": cost.epsilon,
        "rho": cost.rho,
        "delta": cost.delta,
        "created_at": now(),
        "prev_hash": GENESIS if last is None else last.entry_hash,
        "entry_kind": kind,
        "partition_key": partition,
    }
    values["entry_hash"] = entry_digest(**values)
    conn.execute(ledger.insert().values(**values))
    return str(values["receipt_id"])


def _bullets(problems: list[str]) -> str:
    shown = [f"  - {p}" for p in problems[:MAX_PROBLEMS_SHOWN]]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown.append(f"  - ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
    return "\n".join(shown)


def _chain_rows(conn: Connection) -> list[Any]:
    columns = [ledger.c[name] for name in (*_CHAIN_COLUMNS, "prev_hash", "entry_hash")]
    return list(conn.execute(sa.select(*columns).order_by(ledger.c.seq)).all())


def _lock_chain(conn: Connection, url: str) -> None:
    """Serialise ledger writes across processes and hosts (SQLite: ``BEGIN IMMEDIATE`` already
    did): lock the chain row until commit.  Without that row nothing would be locked: refuse."""
    if conn.dialect.name == "sqlite":
        return
    locked = conn.execute(
        sa.select(catalog_meta.c.value).where(catalog_meta.c.key == "chain").with_for_update()
    ).scalar_one_or_none()
    if locked is None:
        raise CatalogError(
            f"catalog {redacted(url)} lacks its catalog_meta 'chain' row, which serialises ledger writes; "
            "charges are refused until it is restored from a backup"
        )


def lock_schema(conn: Connection) -> None:
    """PostgreSQL: one process at a time creates or migrates tables (transaction-scoped advisory
    lock; concurrent CREATE TABLE would fail); SQLite's ``BEGIN IMMEDIATE`` already serialises."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(SCHEMA_LOCK_ID)))


def _head(conn: Connection) -> tuple[int, str]:
    entries = conn.execute(sa.select(sa.func.count()).select_from(ledger)).scalar_one()
    last = conn.execute(
        sa.select(ledger.c.entry_hash).order_by(ledger.c.seq.desc()).limit(1)
    ).scalar_one_or_none()
    return int(entries), last or GENESIS


# --- schema: what the database is, initialisation and migration ---------------------------------------
def _refuse_foreign_file(url: str) -> None:
    """An SQLite catalog path must be an SQLite database (or not exist yet); never overwritten."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return
    path = Path(parsed.database)
    if parsed.database == ":memory:" or not path.exists():
        return
    if not path.is_file():
        raise CatalogError(f"catalog path {path} is not a file; point the catalog at a file")
    with open(path, "rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if header and header != SQLITE_HEADER:  # an empty file is an empty SQLite database
        raise CatalogError(
            f"catalog file {path} is not an SQLite database; it was left unchanged. Point "
            "DPRELEASE_HOME or DPRELEASE_CATALOG_URL at a dprelease catalog, or move the file away"
        )


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
    for row in _chain_rows(conn):
        digest = _digest(tuple(row)[: len(_CHAIN_COLUMNS)], previous)
        # The one write to existing ledger rows: filling the new chain columns once, at migration.
        conn.execute(
            sa.update(ledger)
            .where(ledger.c.seq == row.seq)
            .values(prev_hash=previous, entry_hash=digest)
        )
        previous = digest


# --- leases -------------------------------------------------------------------------------------------
def process_owner() -> dict[str, Any]:
    """This process as a release's lease owner: pid, host and start time (to tell a reused pid
    apart); recorded on every release it registers."""
    return {
        "owner_pid": os.getpid(),
        "owner_host": socket.gethostname(),
        "owner_start": process_start(os.getpid()),
    }


def _stuck_reason(record: ReleaseRecord, *, clock: datetime, lease_seconds: float) -> str | None:
    if (
        record.owner_pid is not None
        and record.owner_host == socket.gethostname()
        and not is_alive(record.owner_pid, started_at=record.owner_start)
    ):
        return f"its process {record.owner_pid} on {record.owner_host} is gone"
    stamps = [record.updated_at, record.heartbeat_at or record.created_at]
    last = max(datetime.fromisoformat(s) for s in stamps)
    idle = (clock - last).total_seconds()
    if idle > lease_seconds:
        return f"no sign of life for {idle:.0f} s (lease {lease_seconds:g} s)"
    return None


def _cap_from_row(row: Any) -> PrivacyCost:
    return PrivacyCost(
        measure=row.measure, epsilon=row.cap_epsilon, rho=row.cap_rho, delta=row.cap_delta
    )


def _over_budget(
    dataset_id: str,
    requested: PrivacyCost,
    spent: PrivacyCost,
    cap: PrivacyCost,
    *,
    partition: str | None = None,
) -> BudgetExceededError:
    where = f"dataset {dataset_id!r}" + (f" partition {partition!r}" if partition else "")
    return BudgetExceededError(
        f"privacy budget of {where} would be exceeded: requested "
        f"{requested.describe()}, spent {spent.describe()}, cap {cap.describe()} "
        f"(remaining {spent.remaining(cap).describe()})"
    )


PG_CONNECT_TIMEOUT = 10
"""Seconds a PostgreSQL connection may take to open (libpq's ``connect_timeout``) unless the URL
sets ``?connect_timeout=``: an unreachable catalog host fails with a CatalogError in seconds, not
after the operating system's TCP time-out (minutes)."""


def _make_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        connect_args: dict[str, Any] = {}
        if url.startswith("postgresql") and "connect_timeout" not in sa.engine.make_url(url).query:
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT
        try:
            return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        except (ModuleNotFoundError, sa.exc.NoSuchModuleError) as exc:
            shown = sa.engine.make_url(url).render_as_string(hide_password=True)
            raise CatalogError(
                f"catalog URL {shown} needs a database driver that is not installed ({exc}); "
                "for PostgreSQL write postgresql+psycopg://… (psycopg is installed with dprelease)"
            ) from None
    if keys.key_path(url) is None:  # in memory: one connection shared by all users
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False}, poolclass=sa.pool.StaticPool
        )
    else:
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


def dispose_with(owner: object, engine: Engine) -> None:
    """Close a client-server engine's pooled connections when ``owner`` is garbage-collected (an
    engine lives on in reference cycles, and psycopg warns about connections left open)."""
    if engine.dialect.name != "sqlite":
        weakref.finalize(owner, engine.dispose)


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``: what messages may show of a catalog URL."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url.split("@")[-1] if "@" in url else url


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, indent=2, default=str)


class DatasetAccountant:
    """The :class:`mechanisms.choke_point.Accountant` of one release on one dataset: every charge is a
    committed ledger row, and the receipts are kept for the manifest."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        dataset_id: str,
        release_id: str,
        partitions: tuple[str, ...] | None = None,
    ) -> None:
        self.catalog = catalog
        self.dataset_id = dataset_id
        self.release_id = release_id
        self.partitions = partitions  # None: the whole dataset; else each is charged the cost
        self.receipts: list[str] = []

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        receipt = self.catalog.charge(
            self.dataset_id,
            cost,
            release_id=self.release_id,
            label=label,
            partitions=self.partitions,
        )
        self.receipts.append(receipt)
        return receipt

    def holds(self, receipt_id: str) -> bool:
        """True when ``receipt_id`` is a charge on this dataset's ledger (a reusable payment)."""
        return any(
            e.receipt_id == receipt_id and e.kind == "charge"
            for e in self.catalog.ledger_entries(self.dataset_id)
        )
