"""Who ran a release and who must approve it: the review policy recorded when a release registers.

Table ``review_policies`` (its own ``MetaData``): per release, the operator, the distinct
approvals needed, whether the operator is excluded (unless ``review: {allow_self_approval:
true}``) and the notification block.  Written once at registration from the spec that ran, so a
later edit of the spec or manifest cannot lower the bar; a release without a row needs one
approval by anyone.  The operator is ``DPRELEASE_OPERATOR`` when set (for a service account), else
the login name.  Names are self-declared: the rule stops self-approval by mistake and leaves every
decision in the audit trail; it authenticates no one.  Everything stored here is public.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.leases import process_owner
from dprelease.catalog.ledger.names import normalize_reviewer
from dprelease.catalog.ledger.schema import now, with_tables
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.spec.model import ReleaseSpec

OPERATOR_ENV = "DPRELEASE_OPERATOR"

policy_metadata = sa.MetaData()

review_policies = sa.Table(
    "review_policies",
    policy_metadata,
    sa.Column("release_id", sa.String(128), primary_key=True),
    sa.Column("operator", sa.String(128), nullable=False),
    sa.Column("operator_host", sa.String(255)),
    sa.Column("required_approvals", sa.Integer, nullable=False),
    sa.Column("exclude_operator", sa.Boolean, nullable=False),
    sa.Column("notify", sa.String(128)),
    sa.Column("recorded_at", sa.String(40), nullable=False),
    sa.Column("notified_at", sa.String(40)),
    sa.Column("notify_error", sa.Text),
)


@dataclass(frozen=True, kw_only=True)
class ReviewPolicyRecord:
    """What a release's review needs (public)."""

    release_id: str
    required_approvals: int
    exclude_operator: bool
    operator: str | None = None
    operator_host: str | None = None
    notify: str | None = None
    recorded_at: str | None = None
    notified_at: str | None = None
    """When reviewers were last told (through ``notify``) that the release is staged."""
    notify_error: str | None = None
    """Why the last notification failed (the release stays staged; notify again)."""


def current_operator() -> str:
    """The person running this process: ``DPRELEASE_OPERATOR``, else the login name."""
    declared = os.environ.get(OPERATOR_ENV, "")
    if declared.strip():
        try:
            return normalize_reviewer(declared)
        except CatalogError as exc:
            raise CatalogError(f"{OPERATOR_ENV}: {exc}") from None
    try:
        login = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers): the uid still identifies
        login = f"uid-{os.getuid()}"
    return normalize_reviewer(login)


def _engine(catalog: Catalog) -> Engine:
    """The catalog's engine, with the table created on first use (once per engine)."""
    return with_tables(catalog.engine, policy_metadata)


def record_policy(catalog: Catalog, *, release_id: str, spec: ReleaseSpec) -> ReviewPolicyRecord:
    """Record who runs ``release_id`` (this process's operator) and what its review needs."""
    policy = spec.review
    record = ReviewPolicyRecord(
        release_id=release_id,
        operator=current_operator(),
        operator_host=str(process_owner()["owner_host"]),
        required_approvals=1 if policy is None else policy.approvers,
        exclude_operator=policy is None or not policy.allow_self_approval,
        notify=None if policy is None else policy.notify,
        recorded_at=now(),
    )
    with _engine(catalog).begin() as conn:
        conn.execute(review_policies.insert().values(**asdict(record)))
    return record


def policy_of(catalog: Catalog, release_id: str) -> ReviewPolicyRecord:
    """The recorded policy of ``release_id``; one approval by anyone when none was recorded."""
    with _engine(catalog).connect() as conn:
        row = conn.execute(
            sa.select(review_policies).where(review_policies.c.release_id == release_id)
        ).first()
    if row is None:
        return ReviewPolicyRecord(
            release_id=release_id, required_approvals=1, exclude_operator=False
        )
    return ReviewPolicyRecord(**row._asdict())


def record_notification(catalog: Catalog, release_id: str, *, error: str | None) -> None:
    """Record that reviewers of ``release_id`` were notified (``error`` None) or why not."""
    values: dict[str, Any] = {"notify_error": error}
    if error is None:
        values["notified_at"] = now()
    with _engine(catalog).begin() as conn:
        result = conn.execute(
            review_policies.update()
            .where(review_policies.c.release_id == release_id)
            .values(**values)
        )
    if result.rowcount != 1:
        raise CatalogError(f"release {release_id!r} has no recorded review policy")
