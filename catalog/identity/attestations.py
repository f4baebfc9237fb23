"""A review decision as an in-toto Statement v1 in a DSSE envelope.

The statement's ``subject`` is the release's staged content, what a decision is about and what a
later decision leaves unchanged: ``manifest.json#content`` (the sha256 of the manifest's
canonical JSON, sorted keys and no spaces, without its ``review`` and ``artifacts`` sections,
which every decision rewrites) and every other file of the release directory (relative POSIX
paths with their sha256, hashed by :mod:`catalog.publishing.artifacts` exactly as the manifest
lists them) except those a decision rewrites: ``report.html``, the report's table pages and the
``attestations/`` folder where signed decisions are kept.  Its predicate, of type
:data:`PREDICATE_TYPE`, is::

    {"release_id": str, "decision": "approve" | "reject", "role": one of ROLES, "note": str}

Verifying checks the signatures against trusted keys and that the release on disk now is exactly
the subjects: a table changed, removed or added after the decision fails, naming the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.identity.dsse import Envelope, sign_envelope, verify_envelope
from dprelease.catalog.identity.keys import IdentityError, PublicKey, SigningKey
from dprelease.catalog.identity.roles import ROLES

# scan_release_files is the manifest's own listing (regular files, links found, never followed).
from dprelease.catalog.publishing.artifacts import (
    MANIFEST,
    SHOWN_PROBLEMS,
    read_manifest,
    scan_release_files,
)
from dprelease.catalog.publishing.report import TABLE_PAGES

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://dprelease.dev/review/v1"
ATTESTATIONS_FOLDER = "attestations"
DECISIONS = ("approve", "reject")
MANIFEST_SUBJECT = f"{MANIFEST}#content"
# rewritten by every decision (the review trail): not what a reviewer decides on
REWRITTEN = ("report.html", f"{TABLE_PAGES}/", f"{ATTESTATIONS_FOLDER}/")


@dataclass(frozen=True, kw_only=True)
class ReviewAttestation:
    """A verified decision: what was decided, on which release, and which trusted keys signed."""

    release_id: str
    decision: str
    role: str
    note: str
    signers: tuple[str, ...]


def manifest_content_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its ``review`` and ``artifacts``."""
    content = {k: v for k, v in manifest.items() if k not in ("review", "artifacts")}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def release_digests(release_dir: Path) -> dict[str, str]:
    """The staged content: the manifest's content digest and the sha256 of every other file a
    decision does not rewrite.  O(bytes)."""
    hashes, links = scan_release_files(release_dir)
    if links:
        raise VerificationError(
            f"release directory {release_dir} holds symbolic links ({', '.join(links)})"
        )
    hashes[MANIFEST_SUBJECT] = manifest_content_digest(read_manifest(release_dir))
    return {
        name: digest
        for name, digest in sorted(hashes.items())
        if name != "report.html" and not name.startswith(REWRITTEN[1:])
    }


def _release_id(release_dir: Path) -> str:
    release_id = read_manifest(release_dir).get("release_id")
    if not isinstance(release_id, str) or not release_id:
        raise VerificationError(
            f"{release_dir / MANIFEST}: release_id {release_id!r} is not a string"
        )
    return release_id


def attest_release(
    release_dir: Path, *, key: SigningKey, decision: str, role: str = "reviewer", note: str = ""
) -> Envelope:
    """The signed decision on the release in ``release_dir`` as it is now.  O(bytes)."""
    if decision not in DECISIONS:
        raise IdentityError(f"decision {decision!r} must be one of {', '.join(DECISIONS)}")
    if role not in ROLES:
        raise IdentityError(f"role {role!r} must be one of {', '.join(ROLES)}")
    if not isinstance(note, str):
        raise IdentityError(f"note {note!r} must be a string")
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": digest}}
            for name, digest in release_digests(release_dir).items()
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "release_id": _release_id(release_dir),
            "decision": decision,
            "role": role,
            "note": note,
        },
    }
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    return sign_envelope(payload, payload_type=PAYLOAD_TYPE, keys=key)


def _statement(envelope: Envelope) -> tuple[dict[str, str], dict[str, Any]]:
    """The subjects (name → sha256) and predicate of a well-formed review statement."""
    try:
        statement = json.loads(envelope.payload)
    except ValueError as exc:
        raise VerificationError(f"attestation payload is not JSON ({exc})") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise VerificationError(f"attestation _type must be {STATEMENT_TYPE!r}")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise VerificationError(
            f"attestation predicateType {statement.get('predicateType')!r} is not {PREDICATE_TYPE!r}"
        )
    subjects: dict[str, str] = {}
    entries = statement.get("subject")
    for entry in entries if isinstance(entries, list) else [None]:
        digest = entry.get("digest") if isinstance(entry, dict) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(digest, dict) or name in subjects:
            raise VerificationError(
                f"attestation subject {entry!r} is not a unique name and digest"
            )
        if not isinstance(digest.get("sha256"), str):
            raise VerificationError(f"attestation subject {name!r} has no sha256 digest")
        subjects[name] = digest["sha256"]
    predicate = statement.get("predicate")
    if (
        not isinstance(predicate, dict)
        or predicate.get("decision") not in DECISIONS
        or predicate.get("role") not in ROLES
        or not isinstance(predicate.get("release_id"), str)
        or not isinstance(predicate.get("note"), str)
    ):
        raise VerificationError(f"attestation predicate {predicate!r} is not a review decision")
    return subjects, predicate


def verify_release_attestation(
    release_dir: Path, envelope: Envelope, trusted: Mapping[str, PublicKey]
) -> ReviewAttestation:
    """Refused (:class:`VerificationError`, naming each file) unless a trusted key signed
    ``envelope`` and the files in ``release_dir`` are exactly its subjects.  O(bytes)."""
    signers = verify_envelope(envelope, trusted, payload_type=PAYLOAD_TYPE)
    if not signers:
        raise VerificationError("attestation: no valid signature by a trusted key")
    subjects, predicate = _statement(envelope)
    on_disk = release_digests(release_dir)
    problems = [
        f"{name}: changed since the attestation (sha256 {on_disk[name]}, attested {digest})"
        for name, digest in subjects.items()
        if name in on_disk and on_disk[name] != digest
    ]
    problems += [f"{name}: attested but missing" for name in subjects if name not in on_disk]
    problems += [f"{name}: not attested" for name in on_disk if name not in subjects]
    if predicate["release_id"] != _release_id(release_dir):
        problems.append(f"release_id {predicate['release_id']!r} is not this release's")
    if problems:
        raise VerificationError(
            f"{release_dir} does not match its attestation: "
            + "; ".join(problems[:SHOWN_PROBLEMS]),
            problems=tuple(problems),
        )
    return ReviewAttestation(
        release_id=predicate["release_id"],
        decision=predicate["decision"],
        role=predicate["role"],
        note=predicate["note"],
        signers=tuple(signers),
    )
