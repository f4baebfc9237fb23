"""Audited review of a staged release: approval publishes a copy, rejection refunds nothing.

The release's review policy (``catalog.review.policy``) says how many distinct reviewers must
approve and whether its operator is excluded; until the last approval it stays ``staged``.  One
rejection decides.  The manifest's review trail lists every decision the catalog holds, in order.

Idempotent: the review is recorded once, in the catalog, and everything after it is derived from
that record, so re-running a decision after a crash finishes what was left undone.  An approval,
each step repeatable: (1) public checks (reviewer, not the operator, status, a free publication
target; on a dataset that requires signatures, the signed decision: ``catalog.review.signatures``)
before anything is written; (2) ``Catalog.record_review``, the decision, its signature and the
publication target in one transaction; (3) the signed decisions as attestation files, the
manifest's trail, status ``published`` and the report; (4) ``artifacts.publish``, a complete copy
renamed into place; (5) the catalog status ``published`` with the manifest's sha256.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.identity.dsse import Envelope
from dprelease.catalog.ledger.leases import ReleaseRecord
from dprelease.catalog.ledger.names import normalize_reviewer, same_person
from dprelease.catalog.ledger.store import Catalog, ReviewRecord
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.report import write_report
from dprelease.catalog.review import signatures as signing
from dprelease.catalog.review.policy import ReviewPolicyRecord, policy_of

# The manifest's review status for each catalog status a decision leaves.
_TRAIL_STATUS = {"staged": "staged", "approved": "published", "rejected": "rejected"}


def review(
    catalog: Catalog,
    release_id: str,
    *,
    approve: bool,
    reviewer: str,
    note: str,
    publish_dir: Path | None = None,
    signature: Envelope | None = None,
) -> dict[str, Any]:
    """Record a decision; approval publishes a copy once the policy's approvals are in, rejection
    keeps the spent budget spent.  ``signature``: the reviewer's signed decision
    (:func:`catalog.review.signatures.sign_decision`), required on a dataset with registered keys.

    Re-running an approval of an ``approved`` (or ``published``) release finishes (or confirms) its
    publication; re-running a rejection of a ``rejected`` release finishes its manifest.  Returns
    the release id and status, and while approvals are missing ``approvals`` (who approved) and
    ``required_approvals``.
    """
    reviewer = normalize_reviewer(reviewer)
    record = catalog.release(release_id)
    if record.directory is None:
        raise CatalogError(f"release {release_id!r} has no staged directory")
    if record.status in ("approved", "published"):
        if not approve:
            raise CatalogError(
                f"release {release_id!r} is {record.status}; an approved release cannot be "
                "rejected (re-run with --approve to finish an unfinished publication)"
            )
        return _finish(catalog, record, publish_dir)
    if record.status == "rejected" and not approve:
        return _finish(catalog, record, publish_dir)
    policy = check_reviewer(catalog, release_id, approve=approve, reviewer=reviewer)
    accepted = signing.accept(catalog, release_id, approve=approve, signature=signature)
    target = _target(record, publish_dir)
    if approve and target.exists():  # refused before the decision is recorded
        raise CatalogError(f"published copy {target} already exists; refusing to overwrite it")
    decision = "approved" if approve else "rejected"
    catalog.record_review(
        release_id,
        decision=decision,
        reviewer=reviewer,
        note=note,
        published_directory=str(target) if approve else None,
        required_approvals=policy.required_approvals,
        also=None if accepted is None else accepted.recorder(release_id, decision, reviewer),
        key_id=None if accepted is None else accepted.key_id,
        envelope_sha256=None if accepted is None else accepted.envelope_sha256,
    )
    return _finish(catalog, catalog.release(release_id), publish_dir)


def check_reviewer(
    catalog: Catalog, release_id: str, *, approve: bool, reviewer: str
) -> ReviewPolicyRecord:
    """Refuse, before anything is recorded or a paused run is resumed, an approval by the person
    who ran the release (when the policy excludes them) or by someone who already approved it;
    return the release's policy.  ``Catalog.record_review`` repeats the second check atomically."""
    reviewer = normalize_reviewer(reviewer)
    policy = policy_of(catalog, release_id)
    if not approve:
        return policy
    if policy.exclude_operator and policy.operator and same_person(reviewer, policy.operator):
        raise CatalogError(
            f"reviewer {reviewer!r} ran release {release_id!r} (operator {policy.operator!r}) and "
            f"may not approve it: it needs {policy.required_approvals} approval(s) by someone "
            "other than the person who ran it; ask another reviewer (a one-person setup sets "
            "review: {allow_self_approval: true} in the spec, for releases run after that)"
        )
    if any(
        r.decision == "approved" and same_person(r.reviewer, reviewer)
        for r in catalog.reviews(release_id)
    ):
        raise CatalogError(
            f"reviewer {reviewer!r} already approved release {release_id!r}; it needs "
            f"{policy.required_approvals} approvals by distinct reviewers"
        )
    return policy


def status(catalog: Catalog, release_id: str) -> dict[str, Any]:
    """Where the review of ``release_id`` stands (public): the policy, who approved, how many
    approvals are missing, and every decision in order."""
    record = catalog.release(release_id)
    policy = policy_of(catalog, release_id)
    decisions = catalog.reviews(release_id)
    approvers = [r.reviewer for r in decisions if r.decision == "approved"]
    missing = max(policy.required_approvals - len(approvers), 0) if record.status == "staged" else 0
    return {
        "release_id": record.id,
        "status": record.status,
        "operator": policy.operator,
        "operator_excluded": policy.exclude_operator,
        "required_approvals": policy.required_approvals,
        "approvers": approvers,
        "approvals_missing": missing,
        "notify": policy.notify,
        "notified_at": policy.notified_at,
        "notify_error": policy.notify_error,
        "trail": [_entry(r) for r in decisions],
        "signed": signing.signed_trail(catalog, release_id, decisions),
    }


def _entry(decision: ReviewRecord) -> dict[str, str]:
    """A decision as a trail lists it: decision, reviewer, note, at (the release is implied)."""
    return {k: v for k, v in asdict(decision).items() if k != "release_id"}


def _target(record: ReleaseRecord, publish_dir: Path | None) -> Path:
    directory = Path(str(record.directory))
    destination = publish_dir or directory.parent.parent / artifacts.PUBLISHED_FOLDER
    return Path(destination).resolve() / directory.name


def _finish(catalog: Catalog, record: ReleaseRecord, publish_dir: Path | None) -> dict[str, Any]:
    """Bring the manifest, the report, the published copy and the status in line with the
    recorded decisions; each step is skipped when it is already done."""
    result: dict[str, Any] = {"release_id": record.id, "status": record.status}
    if record.status == "published":
        return {**result, "published_directory": record.published_directory}
    decisions = catalog.reviews(record.id)
    if record.status != "staged" and not any(r.decision == record.status for r in decisions):
        raise CatalogError(
            f"release {record.id!r} is {record.status} but the catalog holds no such review "
            "record; the catalog was edited outside dprelease"
        )
    policy = policy_of(catalog, record.id)
    directory = Path(str(record.directory))
    manifest = artifacts.read_manifest(directory)
    section = {
        "status": _TRAIL_STATUS[record.status],
        "required_approvals": policy.required_approvals,
        "operator": policy.operator,
        "trail": [_entry(r) for r in decisions],
    }
    signed = signing.signed_trail(catalog, record.id, decisions)
    if any(entry["key_id"] for entry in signed):  # unsigned (legacy) manifests keep their form
        section["signatures"] = [
            {k: entry[k] for k in ("decision", "reviewer", "key_id", "role")} for entry in signed
        ]
    attested = signing.write_attestations(catalog, record.id, directory)
    if manifest.get("review") != section or attested:
        manifest["review"] = section
        write_report(directory, manifest, catalog)
        digest = artifacts.write_manifest(directory, manifest)
    else:
        digest = artifacts.sha256_file(directory / artifacts.MANIFEST)
    if record.status in ("staged", "rejected"):
        catalog.update_release(record.id, manifest_sha256=digest)
        if record.status == "staged":
            approvers = [r.reviewer for r in decisions if r.decision == "approved"]
            result |= {"approvals": approvers, "required_approvals": policy.required_approvals}
        return result
    target = _target(record, publish_dir)
    if record.published_directory is not None:
        planned = Path(record.published_directory)
        if publish_dir is not None and target != planned.resolve():
            raise CatalogError(
                f"release {record.id!r} was approved for publication to {planned.parent}; re-run "
                f"without --publish-dir (or with {planned.parent}) to finish it, not {publish_dir}"
            )
        target = planned
    if target.exists():
        copied = target / artifacts.MANIFEST
        if not copied.is_file() or artifacts.sha256_file(copied) != digest:
            raise CatalogError(
                f"{target} exists but is not a copy of release {record.id}'s final manifest; "
                "move it away and re-run the approval"
            )
    else:
        artifacts.discard_partial_copies(target.parent, directory.name)
        target = artifacts.publish(directory, target.parent)
    catalog.update_release(
        record.id, status="published", published_directory=str(target), manifest_sha256=digest
    )
    return {**result, "status": "published", "published_directory": str(target)}
