"""The catalog: the privacy ledger, plus the releases it pays for and their reviews.

Skipped releases: a scheduled or triggered release whose input and spec equal those of the last
release of its series charges nothing and appends a ``skipped`` entry (zero cost) instead
(:meth:`Catalog.create_release`), decided in the same transaction that would record the release,
so two arrivals of the same content never start two releases.  A release that is measuring holds
a lease (``catalog.ledger.leases``); reviews are appended, never changed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger import chain
from dprelease.catalog.ledger.budget import Ledger, append_entry
from dprelease.catalog.ledger.leases import (
    DEFAULT_LEASE_SECONDS,
    RecoveredRelease,
    ReleaseRecord,
    process_owner,
    stuck_reason,
)
from dprelease.catalog.ledger.names import normalize_reviewer, same_person
from dprelease.catalog.ledger.schema import (
    DECISIONS_MARKER,
    STATUSES,
    catalog_meta,
    datasets,
    ledger,
    now,
    releases,
    reviews,
)
from dprelease.mechanisms.primitives.privacy import PrivacyCost

# The columns of catalog.review.signatures' table that a decision's ledger entry covers.
_review_signatures = sa.table(
    "review_signatures",
    *(sa.column(name) for name in ("id", "release_id", "decision", "reviewer", "key_id")),
    sa.column("envelope"),
)

# A release that failed or was aborted released nothing: "unchanged" never compares with it.
_NOT_RELEASED = ("failed", "aborted")
_stamp = now  # for methods whose ``now`` parameter shadows the function


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
class ReviewRecord:
    release_id: str
    decision: str
    reviewer: str
    note: str
    at: str


class Catalog(Ledger):
    """The ledger (datasets, caps, charges) with the releases it pays for and their reviews, in
    one SQLAlchemy database (:class:`~catalog.ledger.budget.Ledger` opens and checks it)."""

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
        series = _Series(name, dataset_id, series_key, input_fingerprint)
        with self._ledger_write() as conn:
            skipped = series.skip(conn, release_id=release_id) if skip_unchanged else None
            if skipped is not None:
                return skipped
            conn.execute(
                releases.insert().values(
                    id=release_id,
                    status="measuring",
                    spec_fingerprint=spec_fingerprint,
                    mechanism=mechanism,
                    **asdict(series),
                    **dict.fromkeys(("created_at", "updated_at", "heartbeat_at"), now()),
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
        series = _Series(name, dataset_id, series_key, input_fingerprint)
        with self._ledger_write() as conn:
            return series.skip(conn, release_id=release_id)

    def update_release(self, release_id: str, **values: Any) -> None:
        if "status" in values and values["status"] not in STATUSES:
            raise CatalogError(f"status {values['status']!r} must be one of {STATUSES}")
        with self.engine.begin() as conn:
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
        with self.engine.begin() as conn:
            # locked: a concurrent recover waits, then sees this heartbeat
            row = _locked_release(conn, release_id)
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
            reason = stuck_reason(record, clock=clock, lease_seconds=lease_seconds)
            if reason is None:
                continue
            status = "aborted" if record.interrupted_at else "failed"
            with self.engine.begin() as conn:
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
        also: Callable[[Connection], None] | None = None,
        key_id: str | None = None,
        envelope_sha256: str | None = None,
    ) -> ReviewRecord:
        """Append a review decision and move the release to approved/rejected (staged only).

        ``reviewer`` is NFKC-normalised and must be printable and non-empty.  A rejection decides;
        an approval decides once ``required_approvals`` distinct reviewers (:func:`same_person`)
        approved, until then the release stays ``staged``.  The deciding approval may record where
        the release will be published (``published_directory``) in the same transaction, so an
        interrupted publication resumes to the same place.  ``also(conn)`` writes the caller's own
        row of the decision (its signature) in the same transaction.

        The decision is anchored in the ledger's hash chain in that transaction: a zero-cost
        ``decision`` entry whose label carries :func:`chain.decision_digest` of the release,
        decision, reviewer, note and, for a signed decision, ``key_id`` and ``envelope_sha256``
        (the SHA-256 of its envelope as stored).  A decision row without its entry, or an entry
        without its row, no longer verifies.  O(entries) (the chain is verified first).
        """
        if decision not in ("approved", "rejected"):
            raise CatalogError(f"decision {decision!r} must be 'approved' or 'rejected'")
        if required_approvals < 1:
            raise CatalogError(f"required_approvals ({required_approvals}) must be >= 1")
        reviewer = normalize_reviewer(reviewer)
        stamp = now()
        with self._ledger_write() as conn:
            # locked: of two concurrent reviews only the first sees "staged"
            row = _locked_release(conn, release_id)
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
            if also is not None:
                also(conn)
            measure = conn.execute(
                sa.select(datasets.c.measure).where(datasets.c.id == row.dataset_id)
            ).scalar_one()
            digest = chain.decision_digest(
                release_id=release_id,
                decision=decision,
                reviewer=reviewer,
                note=note,
                key_id=key_id,
                envelope_sha256=envelope_sha256,
            )
            append_entry(
                conn,
                dataset_id=row.dataset_id,
                release_id=release_id,
                label=chain.decision_label(decision, digest),
                cost=PrivacyCost.zero(measure),
                kind=chain.DECISION_KIND,
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

    def verify_chain(self) -> list[str]:
        """The hash chain and its anchor (:meth:`Ledger.verify_chain`), and every review decision
        against its ledger entry (:meth:`decision_anchoring`).  Reads only; O(entries)."""
        return super().verify_chain() + list(self.decision_anchoring().problems)

    def decision_anchoring(self) -> chain.DecisionAnchoring:
        """Which decisions (and their signatures) the ledger anchors, and what does not match
        (:func:`chain.match_decisions`).  O(decisions + entries)."""
        with self.engine.connect() as conn:
            decisions = conn.execute(sa.select(reviews).order_by(reviews.c.seq)).all()
            anchors = conn.execute(
                sa.select(ledger.c.seq, ledger.c.release_id, ledger.c.label)
                .where(ledger.c.entry_kind == chain.DECISION_KIND)
                .order_by(ledger.c.seq)
            ).all()
            signed = []
            if sa.inspect(conn).has_table(_review_signatures.name):
                signed = conn.execute(
                    sa.select(_review_signatures).order_by(_review_signatures.c.id)
                ).all()
            marker = conn.execute(
                sa.select(catalog_meta.c.value).where(catalog_meta.c.key == DECISIONS_MARKER)
            ).scalar_one_or_none()
        return chain.match_decisions(
            list(decisions), list(signed), list(anchors), anchored_from_start=marker is not None
        )

    def reviews(self, release_id: str) -> list[ReviewRecord]:
        columns = [reviews.c[name] for name in ("release_id", "decision", "reviewer", "note", "at")]
        query = sa.select(*columns).where(reviews.c.release_id == release_id)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(reviews.c.seq)).all()
        return [ReviewRecord(**row._asdict()) for row in rows]


def _locked_release(conn: Connection, release_id: str) -> Any:
    """The release's row, locked until the transaction ends (concurrent writers wait)."""
    query = sa.select(releases).where(releases.c.id == release_id).with_for_update()
    row = conn.execute(query).first()
    if row is None:
        raise CatalogError(f"release {release_id!r} is not in the catalog")
    return row


@dataclass(frozen=True)
class _Series:
    """A release's series (the spec's ``name`` within its dataset id) and what "unchanged"
    compares: ``series_key`` (the spec without its source) and the keyed input fingerprint."""

    name: str
    dataset_id: str
    series_key: str | None
    input_fingerprint: str | None

    def skip(self, conn: Connection, *, release_id: str) -> SkippedRelease | None:
        """Inside a ledger write: the ``skipped`` entry when the series' last release is unchanged.

        Its last release is the newest one that did not fail or abort (one still measuring
        counts: a second run on the same content is skipped, unless the first one's process is
        gone or its lease expired, see :meth:`Catalog.recover`: it will release nothing, so this
        run releases).  O(releases of the series) with no index.
        """
        last = conn.execute(
            sa.select(releases)
            .where(
                releases.c.name == self.name,
                releases.c.dataset_id == self.dataset_id,
                releases.c.status.not_in(_NOT_RELEASED),
            )
            .order_by(releases.c.created_at.desc(), releases.c.id.desc())
            .limit(1)
        ).first()
        unchanged = (self.series_key, self.input_fingerprint)
        if last is None or (last.series_key, last.input_fingerprint) != unchanged:
            return None
        if last.status == "measuring" and stuck_reason(
            ReleaseRecord(**last._asdict()),
            clock=datetime.now(UTC),
            lease_seconds=DEFAULT_LEASE_SECONDS,
        ):
            return None
        measure = conn.execute(
            sa.select(datasets.c.measure).where(datasets.c.id == self.dataset_id)
        ).scalar_one()
        receipt = append_entry(
            conn,
            dataset_id=self.dataset_id,
            release_id=release_id,
            label=f"{self.name}: skipped, input and spec unchanged since {last.id}",
            cost=PrivacyCost.zero(measure),
            kind="skipped",
        )
        return SkippedRelease(
            release_id=release_id,
            name=self.name,
            dataset_id=self.dataset_id,
            unchanged_since=last.id,
            receipt_id=receipt,
        )
