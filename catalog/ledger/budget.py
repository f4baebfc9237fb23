"""The privacy ledger: datasets with lifetime budget caps and the charges against them.

Ledger rules (privacy obligations): a charge is committed in its own transaction *before*
noise is drawn; it is never updated, deleted or refunded (a crashed or rejected release keeps its
charge); a charge that would take the dataset over its cap is refused with the requested, spent
and cap values in the message.  Charges are serialised: SQLite takes the write lock up front
(``BEGIN IMMEDIATE``) and other databases lock the chain row and the dataset row
(``SELECT … FOR UPDATE``), so two processes can never overspend together.  Every write is
refused while the hash chain or its anchor does not verify (``catalog.ledger.chain``)."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dprelease.catalog import keys
from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger import chain, database, spending
from dprelease.catalog.ledger.schema import (
    catalog_meta,
    chain_rows,
    datasets,
    ledger,
    now,
    open_schema,
    releases,
)
from dprelease.mechanisms.primitives.privacy import PrivacyCost, convert


@dataclass(frozen=True, kw_only=True)
class ZeroCostRecord:
    """A zero-cost ledger entry to append (:meth:`Ledger.append_records`): its label and kind,
    and ``also(conn, receipt_id)``, the caller's own row for it, written in the same
    transaction."""

    label: str
    kind: str
    also: Callable[[Connection, str], None] | None = None


class Ledger:
    """Datasets and the hash-chained ledger in one SQLAlchemy database.

    Opening checks what the database is: a fresh one is initialised, a catalog of an older schema is
    migrated (chain hashes built over its existing entries), and a file that is not SQLite or an
    SQLite database without the catalog's tables raises :class:`CatalogError` and is left untouched.
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = url or database.default_url()
        database.refuse_foreign_file(self.url)
        self.engine = database.make_engine(self.url)
        database.dispose_with(self, self.engine)
        try:
            if open_schema(self.engine, self.url):  # a fresh or migrated catalog
                self._anchor_initial_state()
        except sa.exc.OperationalError as exc:
            raise CatalogError(
                f"catalog {database.redacted(self.url)} cannot be opened: {exc.orig}"
            ) from None
        except sa.exc.DatabaseError as exc:
            if getattr(exc.orig, "sqlstate", None) == database.PERMISSION_DENIED:
                raise CatalogError(
                    f"catalog {database.redacted(self.url)} cannot be opened by this database "
                    f"role ({str(exc.orig).splitlines()[0]}): only the custodian creates or "
                    "migrates the catalog's tables; after an upgrade the custodian runs a "
                    "dprelease command, then `dprelease catalog roles --apply`"
                ) from None
            raise CatalogError(
                f"catalog {database.redacted(self.url)} is damaged and cannot be read ({exc.orig}); it was left "
                "unchanged: restore it from a backup"
            ) from None

    @functools.cached_property
    def key(self) -> keys.CatalogKey:
        """The catalog's secret (created with mode 0600 at first use); ``key.key_id`` is public."""
        return keys.catalog_key(self.url)

    def fingerprint_key_id(self) -> str:
        """The id of the key input fingerprints are computed with (what a manifest records)."""
        return self.key.key_id

    def chain_head(self, dataset_id: str | None = None) -> chain.ChainHead:
        """The last ledger entry (of ``dataset_id``, or of the whole ledger) as a point of the chain.

        A release's manifest records it after the release's charges: ``verify`` then checks that
        this point is still on the chain.
        """
        with self.engine.connect() as conn:
            row = _last_entry(conn, dataset_id)
        if row is None:
            return chain.ChainHead(seq=0, entry_hash=chain.GENESIS)
        return chain.ChainHead(seq=row.seq, entry_hash=row.entry_hash or "")

    def verify_chain(self) -> list[str]:
        """Every problem of the hash chain and its anchor, as readable lines (empty: it verifies).

        Reads only; O(entries).
        """
        with self.engine.connect() as conn:
            rows = chain_rows(conn)
        return chain.chain_problems(rows) + self._anchor_problems(rows)

    def adopt_ledger(self, *, reason: str) -> chain.ChainHead:
        """Accept the ledger as it is now as the anchored truth (e.g. a catalog restored from a
        backup on purpose).  Only an internally consistent chain can be adopted; the previous
        anchor and ``reason`` are kept in the anchor's history."""
        reason = " ".join(str(reason).split())
        if not reason:
            raise CatalogError("reason must say why the ledger is adopted (got an empty string)")
        key = self.key
        with key.locked(), self.engine.begin() as conn:
            lock_chain(conn, self.url)
            rows = chain_rows(conn)
            problems = chain.chain_problems(rows)
            if problems:
                raise CatalogError(
                    "the ledger's own hash chain does not verify, so it cannot be adopted:\n"
                    + chain.bullets(problems)
                )
            try:
                anchor = key.read_anchor()
                previous: Any = (
                    None if anchor is None else {"entries": anchor.entries, "head": anchor.head}
                )
                history = list(anchor.adopted) if anchor is not None else []
            except CatalogError as exc:
                previous, history = f"unreadable: {exc}", []
            head = rows[-1].entry_hash if rows else chain.GENESIS
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
        return chain.ChainHead(seq=rows[-1].seq if rows else 0, entry_hash=head)

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
            registered = spending.cap_from_row(row)
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
        return self._dataset(dataset_id).partitioned_by

    def cap(self, dataset_id: str) -> PrivacyCost:
        return spending.cap_from_row(self._dataset(dataset_id))

    def spent(self, dataset_id: str, *, partitions: tuple[str, ...] | None = None) -> PrivacyCost:
        """What the dataset has spent: the whole-dataset charges plus the largest partition's.

        With ``partitions``: the most any of those partitions has spent (what bounds a release
        that reads them).  Without partitions in the ledger, the sum of all charges.  O(entries).
        """
        with self.engine.connect() as conn:
            totals = spending.Spending.read(conn, dataset_id, self.cap(dataset_id).measure)
        return totals.worst(partitions)[1]

    def partition_spending(self, dataset_id: str) -> list[spending.PartitionSpending]:
        """Per partition charged so far (sorted by name): spent, remaining, entries.  Empty for a
        dataset never charged by partition.  O(entries)."""
        cap = self.cap(dataset_id)
        with self.engine.connect() as conn:
            totals = spending.Spending.read(conn, dataset_id, cap.measure)
        result = []
        for name in sorted(totals.parts):
            spent = totals.whole + totals.parts[name]
            result.append(
                spending.PartitionSpending(
                    partition=name,
                    spent=spent,
                    remaining=spent.remaining(cap),
                    entries=totals.counts[name],
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
        spending.check_partitions(partitions)
        cap = self.cap(dataset_id)
        charged = convert(cost, to=cap.measure)
        with self.engine.connect() as conn:
            totals = spending.Spending.read(conn, dataset_id, cap.measure)
        totals.check(dataset_id, charged, cap, partitions)
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
        spending.check_partitions(partitions)
        with self._ledger_write() as conn:
            cap = _locked_cap(conn, dataset_id)
            charged = convert(cost, to=cap.measure)
            spending.Spending.read(conn, dataset_id, cap.measure).check(
                dataset_id, charged, cap, partitions
            )
            each = {partition: charged for partition in (partitions or (None,))}
            receipts = _append_charges(conn, dataset_id, release_id, label, each)
        return receipts[0]

    def charge_each(
        self,
        dataset_id: str,
        costs: Mapping[str | None, PrivacyCost],
        *,
        release_id: str,
        label: str,
    ) -> list[str]:
        """Atomically check and charge each partition its own cost (``None``: the whole
        dataset), one chained entry each; all or none.  A series' period pays each period it
        reads its own increment.  Returns the receipt ids in ``costs``' order.  O(entries)."""
        named = tuple(name for name in costs if name is not None)
        spending.check_partitions(named or None)
        if not costs:
            raise CatalogError("charge_each needs at least one cost")
        with self._ledger_write() as conn:
            cap = _locked_cap(conn, dataset_id)
            totals = spending.Spending.read(conn, dataset_id, cap.measure)
            charged = {name: convert(cost, to=cap.measure) for name, cost in costs.items()}
            for name, cost in charged.items():
                totals.check(dataset_id, cost, cap, None if name is None else (name,))
            receipts = _append_charges(conn, dataset_id, release_id, label, charged)
        return receipts

    def append_record(
        self,
        *,
        dataset_id: str,
        release_id: str,
        label: str,
        kind: str,
        also: Callable[[Connection, str], None] | None = None,
    ) -> str:
        """Append a zero-cost entry of ``kind`` (never a charge: no budget sum counts it) to the
        chain; ``also(conn, receipt_id)`` writes the caller's own row for it in the same
        transaction.  Returns the receipt id.  O(entries) (the chain is verified first)."""
        record = ZeroCostRecord(label=label, kind=kind, also=also)
        return self.append_records(dataset_id=dataset_id, release_id=release_id, records=[record])[
            0
        ]

    def append_records(
        self, *, dataset_id: str, release_id: str, records: Sequence[ZeroCostRecord]
    ) -> list[str]:
        """Append zero-cost entries (:meth:`append_record`), in order, in one transaction: all
        or none.  Returns their receipt ids.  O(entries)."""
        if not records:
            raise CatalogError("append_records needs at least one record")
        if any(record.kind == "charge" for record in records):
            raise CatalogError("append_record writes zero-cost entries; charges go through charge")
        receipts = []
        with self._ledger_write() as conn:
            measure = conn.execute(
                sa.select(datasets.c.measure).where(datasets.c.id == dataset_id)
            ).scalar_one_or_none()
            if measure is None:
                raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
            for record in records:
                receipt = append_entry(
                    conn,
                    dataset_id=dataset_id,
                    release_id=release_id,
                    label=record.label,
                    cost=PrivacyCost.zero(measure),
                    kind=record.kind,
                )
                if record.also is not None:
                    record.also(conn, receipt)
                receipts.append(receipt)
        return receipts

    def ledger_entries(self, dataset_id: str | None = None) -> list[spending.LedgerEntry]:
        query = sa.select(ledger).order_by(ledger.c.seq)
        if dataset_id is not None:
            query = query.where(ledger.c.dataset_id == dataset_id)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [spending.LedgerEntry.from_row(row) for row in rows]

    def dataset_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return [
                row.id for row in conn.execute(sa.select(datasets.c.id).order_by(datasets.c.id))
            ]

    def _dataset(self, dataset_id: str) -> Any:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(datasets).where(datasets.c.id == dataset_id)).first()
        if row is None:
            raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
        return row

    @contextlib.contextmanager
    def _ledger_write(self) -> Iterator[Connection]:
        """A write transaction that first verifies the chain and its anchor (refusing with
        :class:`CatalogError` when they do not verify) and afterwards moves the anchor to the new
        head.  Host lock first, then the database lock (never the other way round). O(entries)."""
        key = self.key
        with key.locked():
            with self.engine.begin() as conn:
                lock_chain(conn, self.url)
                rows = chain_rows(conn)
                problems = chain.chain_problems(rows) + self._anchor_problems(rows)
                if problems:
                    raise CatalogError(
                        f"catalog {database.redacted(self.url)} failed its integrity check; new charges and releases "
                        "are refused:\n"
                        + chain.bullets(problems)
                        + "\nIf the catalog was restored from a backup on purpose, accept its "
                        "ledger with `dprelease recover --adopt-ledger REASON`."
                    )
                anchor = key.read_anchor()
                yield conn
                entries, head = chain_tip(conn)
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
            return chain.anchor_problems(keys.catalog_key(self.url).read_anchor(), rows)
        except CatalogError as exc:  # e.g. the key is missing but its anchor exists
            return [str(exc)]

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
                entries, head = chain_tip(conn)
            if anchor is None or entries > 0:
                key.write_anchor(entries=entries, head=head, written_at=now())


def append_entry(
    conn: Connection,
    *,
    dataset_id: str,
    release_id: str,
    label: str,
    cost: PrivacyCost,
    kind: str = "charge",
    partition: str | None = None,
) -> str:
    """Append one chained ledger entry (inside a :meth:`Ledger._ledger_write`); its receipt id."""
    if kind not in chain.ENTRY_KINDS:
        raise CatalogError(f"ledger entry kind {kind!r} must be one of {chain.ENTRY_KINDS}")
    last = _last_entry(conn)
    values: dict[str, Any] = {
        "seq": 1 if last is None else last.seq + 1,
        "receipt_id": f"rcpt-{uuid.uuid4().hex}",
        "dataset_id": dataset_id,
        "release_id": release_id,
        "label": label,
        **asdict(cost),  # measure, epsilon, rho, delta
        "created_at": now(),
        "prev_hash": chain.GENESIS if last is None else last.entry_hash,
        "entry_kind": kind,
        "partition_key": partition,
    }
    values["entry_hash"] = chain.entry_digest(**values)
    conn.execute(ledger.insert().values(**values))
    return str(values["receipt_id"])


def lock_chain(conn: Connection, url: str) -> None:
    """Serialise ledger writes across processes and hosts (SQLite: ``BEGIN IMMEDIATE`` already
    did): lock the chain row until commit.  Without that row nothing would be locked: refuse."""
    if conn.dialect.name == "sqlite":
        return
    locked = conn.execute(
        sa.select(catalog_meta.c.value).where(catalog_meta.c.key == "chain").with_for_update()
    ).scalar_one_or_none()
    if locked is None:
        raise CatalogError(
            f"catalog {database.redacted(url)} lacks its catalog_meta 'chain' row, which serialises ledger writes; "
            "charges are refused until it is restored from a backup"
        )


def chain_tip(conn: Connection) -> tuple[int, str]:
    """The ledger's length and last hash: what the anchor records."""
    entries = conn.execute(sa.select(sa.func.count()).select_from(ledger)).scalar_one()
    last = _last_entry(conn)
    return int(entries), (last and last.entry_hash) or chain.GENESIS


def _locked_cap(conn: Connection, dataset_id: str) -> PrivacyCost:
    """The dataset's cap, its row locked until ``conn``'s transaction ends: charges of one
    dataset check and append one after the other."""
    cap_row = conn.execute(
        sa.select(datasets).where(datasets.c.id == dataset_id).with_for_update()
    ).first()
    if cap_row is None:
        raise CatalogError(f"dataset {dataset_id!r} is not in the catalog")
    return spending.cap_from_row(cap_row)


def _append_charges(
    conn: Connection,
    dataset_id: str,
    release_id: str,
    label: str,
    costs: Mapping[str | None, PrivacyCost],
) -> list[str]:
    """One chained charge entry per partition (``None``: the whole dataset), already checked
    against the locked cap, in ``costs``' order; their receipt ids.  O(len(costs))."""
    receipts = [
        append_entry(
            conn,
            dataset_id=dataset_id,
            release_id=release_id,
            label=label,
            cost=cost,
            partition=partition,
        )
        for partition, cost in costs.items()
    ]
    # a charge is a sign of life of the release that pays it
    conn.execute(
        releases.update()
        .where(releases.c.id == release_id, releases.c.status == "measuring")
        .values(heartbeat_at=now())
    )
    return receipts


def _last_entry(conn: Connection, dataset_id: str | None = None) -> Any:
    """The ``seq`` and ``entry_hash`` of the last ledger entry (of ``dataset_id``), or None."""
    query = sa.select(ledger.c.seq, ledger.c.entry_hash).order_by(ledger.c.seq.desc()).limit(1)
    if dataset_id is not None:
        query = query.where(ledger.c.dataset_id == dataset_id)
    return conn.execute(query).first()


@dataclass(eq=False)
class DatasetAccountant:
    """The :class:`mechanisms.primitives.protected.Accountant` of one release on one dataset: every
    charge is a committed ledger row, and the receipts are kept for the manifest."""

    catalog: Ledger
    _: KW_ONLY
    dataset_id: str
    release_id: str
    partitions: tuple[str, ...] | None = None  # None: the whole dataset; else each is charged
    receipts: list[str] = field(default_factory=list, init=False)

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
