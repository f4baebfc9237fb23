"""Audited review of a staged release: approval publishes a copy, rejection refunds nothing.

Idempotent: a review is recorded once, in the catalog, and everything after it (the manifest's
review trail, the report, the published copy, the status ``published``) is derived from that
record.  Re-running the same decision after a crash finishes what was left undone without a
second review record: an ``approved`` release whose copy or status update did not happen is
published; a ``rejected`` release whose manifest was not updated gets its trail.

Order of an approval (every step can be repeated):

1. the public checks (reviewer name, status, a free publication target) before anything is written;
2. ``Catalog.record_review`` — the decision and the publication target, in one transaction;
3. the manifest's review trail and status ``published``, the report (written in place);
4. ``artifacts.publish`` — a complete copy under a temporary name, renamed into place;
5. the catalog status ``published`` with the manifest's sha256.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from catalog import artifacts
from catalog.errors import CatalogError
from catalog.ledger import Catalog, ReleaseRecord, normalize_reviewer
from catalog.release import write_report


def review(
    catalog: Catalog,
    release_id: str,
    *,
    approve: bool,
    reviewer: str,
    note: str,
    publish_dir: Path | None = None,
) -> dict[str, Any]:
    """Record a decision; approval publishes a copy, rejection keeps the spent budget spent.

    Re-running an approval of an ``approved`` (or ``published``) release finishes (or confirms) its
    publication; re-running a rejection of a ``rejected`` release finishes its manifest.
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
    target = _target(record, publish_dir)
    if approve and target.exists():  # refused before the decision is recorded
        raise CatalogError(f"published copy {target} already exists; refusing to overwrite it")
    catalog.record_review(
        release_id,
        decision="approved" if approve else "rejected",
        reviewer=reviewer,
        note=note,
        published_directory=str(target) if approve else None,
    )
    return _finish(catalog, catalog.release(release_id), publish_dir)


def _target(record: ReleaseRecord, publish_dir: Path | None) -> Path:
    directory = Path(str(record.directory))
    destination = publish_dir or directory.parent.parent / artifacts.PUBLISHED_FOLDER
    return Path(destination).resolve() / directory.name


def _finish(catalog: Catalog, record: ReleaseRecord, publish_dir: Path | None) -> dict[str, Any]:
    """Bring the manifest, the report, the published copy and the status in line with the
    recorded decision; each step is skipped when it is already done."""
    result: dict[str, Any] = {"release_id": record.id, "status": record.status}
    if record.status == "published":
        return {**result, "published_directory": record.published_directory}
    decision = next(
        (r for r in reversed(catalog.reviews(record.id)) if r.decision == record.status), None
    )
    if decision is None:
        raise CatalogError(
            f"release {record.id!r} is {record.status} but the catalog holds no such review "
            "record; the catalog was edited outside dprelease"
        )
    directory = Path(str(record.directory))
    manifest = artifacts.read_manifest(directory)
    entry = {
        "decision": decision.decision,
        "reviewer": decision.reviewer,
        "note": decision.note,
        "at": decision.at,
    }
    trail_status = "published" if decision.decision == "approved" else "rejected"
    section = manifest.setdefault("review", {"status": "staged", "trail": []})
    trail = section.setdefault("trail", [])
    if entry not in trail or section.get("status") != trail_status:
        if entry not in trail:
            trail.append(entry)
        section["status"] = trail_status
        write_report(directory, manifest, catalog)
        digest = artifacts.write_manifest(directory, manifest)
    else:
        digest = artifacts.sha256_file(directory / artifacts.MANIFEST)
    if decision.decision == "rejected":
        catalog.update_release(record.id, manifest_sha256=digest)
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
