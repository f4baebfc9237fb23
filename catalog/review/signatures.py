"""Signed review decisions: who may approve, counted by key, and what ``verify`` checks.

On a dataset whose custodian registered keys (:func:`catalog.identity.roles.requires_signatures`)
every decision carries a reviewer's signature: an in-toto review attestation over the release's
staged content (:mod:`catalog.identity.attestations`) in a DSSE envelope, made where the private
key is (the reviewer's ``dprelease review``) and passed on as public JSON.  It is accepted only
when its key holds the ``reviewer`` role on the dataset now, is not a key that signed the
release's run or charges (its operator's: whatever name anyone declares), has not approved this
release already, and signs exactly the staged files.  Table ``review_signatures`` (its own
``MetaData``) keeps it with the ledger head ``seq`` when it was recorded (the point whose roles
it is checked against), one approval per key and release (a unique constraint, in the
transaction that records the decision).  Each is also written into the release directory as
``attestations/<n>-<decision>-<key id>.json`` so that any DSSE/in-toto verifier can check it.

Migration: decisions on a dataset without registered keys stay unsigned and verify as before;
``verify`` lists them as unsigned.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dprelease.catalog.errors import CatalogError, VerificationError
from dprelease.catalog.identity import attestations
from dprelease.catalog.identity.dsse import Envelope
from dprelease.catalog.identity.keys import IdentityError, SigningKey
from dprelease.catalog.identity.roles import (
    ENTRY_KIND,
    Roster,
    entries,
    identity_problems,
    roster,
)
from dprelease.catalog.identity.signing import operator_keys, step_problems
from dprelease.catalog.ledger.schema import ledger, now, release_rows, with_tables
from dprelease.catalog.ledger.store import Catalog, ReviewRecord

# the catalog's decision words and the attestation's
ATTESTED = {"approved": "approve", "rejected": "reject"}

signature_metadata = sa.MetaData()

review_signatures = sa.Table(
    "review_signatures",
    signature_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("release_id", sa.String(128), nullable=False, index=True),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("reviewer", sa.String(128), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("ledger_seq", sa.Integer, nullable=False),
    sa.Column("signed_at", sa.String(40), nullable=False),
    sa.Column("envelope", sa.Text, nullable=False),
    sa.UniqueConstraint("release_id", "key_id", "decision", name="one_decision_per_key"),
)


def _engine(catalog: Catalog) -> Engine:
    return with_tables(catalog.engine, signature_metadata)


def sign_decision(
    directory: Path, *, key: SigningKey, approve: bool, note: str = "", role: str = "reviewer"
) -> Envelope:
    """The reviewer's signed decision on the staged release in ``directory``.  O(bytes)."""
    decision = "approve" if approve else "reject"
    return attestations.attest_release(directory, key=key, decision=decision, role=role, note=note)


def sign_release_decision(
    catalog: Catalog, release_id: str, *, key: SigningKey, approve: bool, note: str = ""
) -> Envelope:
    """:func:`sign_decision` on ``release_id``'s staged directory, in the role it will be checked
    in: ``operator`` for a rejection by a key that ran the release (withdrawing it), else
    ``reviewer``.  O(bytes)."""
    record = catalog.release(release_id)
    if record.directory is None:
        raise CatalogError(f"release {release_id!r} has no staged directory")
    withdraws = not approve and key.key_id in operator_keys(catalog, release_id)
    return sign_decision(
        Path(record.directory),
        key=key,
        approve=approve,
        note=note,
        role="operator" if withdraws else "reviewer",
    )


def envelope_from_json(text: str) -> Envelope:
    try:
        return Envelope.from_dict(json.loads(text))
    except ValueError as exc:
        raise IdentityError(f"signed decision: not JSON ({exc})") from None


@dataclass(frozen=True, kw_only=True)
class AcceptedSignature:
    """A signed decision checked before it is recorded: the key that signed it, in which role."""

    key_id: str
    role: str
    envelope: Envelope
    dataset_id: str | None = None
    checked_at: int | None = None
    """The ledger head when the key's roles were read: a key entry of the dataset after it (a
    revocation, a role change) refuses the decision in its transaction."""

    @property
    def stored(self) -> str:
        """The envelope as table ``review_signatures`` stores it (what its anchor digests)."""
        return json.dumps(self.envelope.as_dict(), sort_keys=True)

    @property
    def envelope_sha256(self) -> str:
        return hashlib.sha256(self.stored.encode()).hexdigest()

    def recorder(self, release_id: str, decision: str, reviewer: str) -> Any:
        """``also`` for :meth:`Catalog.record_review`: the signature row, same transaction."""

        def record(conn: Connection) -> None:
            if self.checked_at is not None:  # under the chain lock: no key entry can follow
                changed = conn.execute(
                    sa.select(sa.func.min(ledger.c.seq)).where(
                        ledger.c.dataset_id == self.dataset_id,
                        ledger.c.entry_kind == ENTRY_KIND,
                        ledger.c.seq > self.checked_at,
                    )
                ).scalar_one()
                if changed is not None:
                    raise IdentityError(
                        f"the keys of dataset {self.dataset_id!r} changed (ledger entry "
                        f"#{changed}) after key {self.key_id}'s roles were checked; nothing was "
                        "recorded: decide again"
                    )
            seq = conn.execute(sa.select(sa.func.max(ledger.c.seq))).scalar_one() or 0
            conn.execute(
                review_signatures.insert().values(
                    release_id=release_id,
                    decision=decision,
                    reviewer=reviewer,
                    key_id=self.key_id,
                    role=self.role,
                    ledger_seq=int(seq),
                    signed_at=now(),
                    envelope=self.stored,
                )
            )

        return record


def signatures(catalog: Catalog, release_id: str) -> list[Any]:
    """The recorded signature rows of ``release_id``, in the order they were recorded."""
    return release_rows(_engine(catalog), review_signatures, release_id)


def _signer_refusal(
    current: Roster, key_id: str, *, approve: bool, operators: set[str], release_id: str
) -> tuple[str | None, str]:
    """Why ``key_id`` may not decide (or None) and the role it decides in."""
    if approve and key_id in operators:
        return (
            f"key {key_id} signed the run of release {release_id!r} (its operator's key) and may "
            "not approve it, whatever reviewer name or DPRELEASE_OPERATOR is given; ask another "
            "reviewer",
            "reviewer",
        )
    if not approve and key_id in operators and current.holds(key_id, "operator"):
        return None, "operator"  # the operator may withdraw their own release
    doing = f"{'approve' if approve else 'reject'} releases of dataset {current.dataset_id!r}"
    return current.refusal(key_id, "reviewer", doing=doing), "reviewer"


def accept(
    catalog: Catalog,
    release_id: str,
    *,
    approve: bool,
    signature: Envelope | None,
) -> AcceptedSignature | None:
    """Check a decision's signature before anything is recorded; None for an unsigned decision on
    a dataset that requires none.  Raises :class:`IdentityError` (naming the key and the rule)."""
    _engine(catalog)  # the table the accepted signature is recorded in, before that transaction
    record = catalog.release(release_id)
    checked_at = catalog.chain_head().seq  # before the roster is read
    current = roster(catalog, record.dataset_id)
    if not current.keys:
        if signature is not None:
            raise IdentityError(
                f"dataset {record.dataset_id!r} has no registered keys, so a signed decision "
                "cannot be checked against a role: decide without --key, or have its custodian "
                "register keys first (dprelease keys register)"
            )
        return None
    if signature is None:
        raise IdentityError(
            f"dataset {record.dataset_id!r} requires signed reviews: decide with --key NAME (or "
            "DPRELEASE_KEY), a key registered with the reviewer role on it"
        )
    if len(signature.signatures) != 1:
        raise IdentityError(
            f"a signed decision carries exactly one signature (this one has "
            f"{len(signature.signatures)}): each reviewer signs their own"
        )
    key_id = signature.signatures[0].keyid
    refusal, role = _signer_refusal(
        current,
        key_id,
        approve=approve,
        operators=operator_keys(catalog, release_id),
        release_id=release_id,
    )
    if refusal is not None:
        raise IdentityError(refusal)
    directory = Path(str(record.directory))
    try:
        checked = attestations.verify_release_attestation(
            directory, signature, {key_id: current.keys[key_id].public}
        )
    except VerificationError as exc:
        raise IdentityError(f"signed decision by key {key_id} refused: {exc}") from None
    if checked.decision != ("approve" if approve else "reject") or checked.role != role:
        raise IdentityError(
            f"signed decision by key {key_id} says {checked.decision} as {checked.role}, not "
            f"{'approve' if approve else 'reject'} as {role}"
        )
    earlier = [row for row in signatures(catalog, release_id) if row.decision == "approved"]
    if approve and any(row.key_id == key_id for row in earlier):
        raise IdentityError(
            f"key {key_id} already approved release {release_id!r}; approvals are counted by "
            "distinct reviewer keys"
        )
    for row in earlier if approve else []:  # every approval must be of this very content
        try:
            attestations.verify_release_attestation(
                directory, envelope_from_json(row.envelope), {row.key_id: _public(catalog, row)}
            )
        except VerificationError as exc:
            raise IdentityError(
                f"the earlier approval by key {row.key_id} ({row.reviewer}) is not of the release "
                f"as it is now, so the approvals would not be of the same content: {exc}"
            ) from None
    return AcceptedSignature(
        key_id=key_id,
        role=role,
        envelope=signature,
        dataset_id=record.dataset_id,
        checked_at=checked_at,
    )


def _public(catalog: Catalog, row: Any) -> Any:
    return roster(catalog, catalog.release(row.release_id).dataset_id).keys[row.key_id].public


def write_attestations(catalog: Catalog, release_id: str, directory: Path) -> bool:
    """Write every recorded signed decision of ``release_id`` into ``directory/attestations``
    (a file already holding it is left alone); True when a file was written.  O(decisions)."""
    written = False
    folder = directory / attestations.ATTESTATIONS_FOLDER
    for number, row in enumerate(signatures(catalog, release_id), start=1):
        path = folder / attestation_name(number, row)
        text = json.dumps(json.loads(row.envelope), indent=2, sort_keys=True) + "\n"
        if path.is_file() and path.read_text() == text:
            continue
        folder.mkdir(exist_ok=True)
        path.write_text(text)
        written = True
    return written


def attestation_name(number: int, row: Any) -> str:
    return f"{number:02d}-{ATTESTED[row.decision]}-{row.key_id[:16]}.json"


def _required_from(catalog: Catalog, dataset_id: str) -> str | None:
    """When the dataset started requiring signatures (its first key entry's time), or None."""
    found = entries(catalog, dataset_id)
    return found[0].created_at if found else None


def signed_trail(catalog: Catalog, release_id: str, decisions: list[ReviewRecord]) -> list[dict]:
    """Each decision with the key that signed it (None: unsigned), in order.  O(decisions)."""
    rows = signatures(catalog, release_id)
    trail = []
    for decision in decisions:
        match = next(
            (
                r
                for r in rows
                if r.decision == decision.decision and r.reviewer == decision.reviewer
            ),
            None,
        )
        trail.append(
            {
                "decision": decision.decision,
                "reviewer": decision.reviewer,
                "at": decision.at,
                "key_id": None if match is None else match.key_id,
                "role": None if match is None else match.role,
            }
        )
    return trail


def signature_problems(
    directory: Path, catalog: Catalog, *, required_approvals: int
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the signatures of the release in ``directory``: each recorded
    signature verifies with the roles in force at its ledger point, was not made by a key after
    its revocation, by the release's operator key, or twice; its attestation file is present and
    the release on disk is what it signed; on a dataset requiring signatures, no decision made
    after that is unsigned and a published release holds ``required_approvals`` valid approvals by
    distinct reviewer keys.  Notes say which decisions are signed and which are not (legacy).
    O(decisions · bytes)."""
    manifest = attestations.read_manifest(directory)
    release_id = str(manifest.get("release_id"))
    record = catalog.release(release_id)
    dataset_id = record.dataset_id
    problems = [f"keys: {p}" for p in identity_problems(catalog, dataset_id)]
    problems += step_problems(catalog, release_id, dataset_id)
    rows = signatures(catalog, release_id)
    operators = operator_keys(catalog, release_id)
    anchoring = catalog.decision_anchoring()
    legacy = [n for n in anchoring.notes if f" on release {release_id}: " in n]
    rosters: dict[int, Roster] = {}
    valid_approvers: set[str] = set()
    for number, row in enumerate(rows, start=1):
        where = f"{row.decision} by {row.reviewer} (key {row.key_id})"
        # the roles in force where the ledger anchors the decision (before: where it was read)
        point = anchoring.signature_entries.get(row.id, row.ledger_seq)
        if point not in rosters:
            rosters[point] = roster(catalog, dataset_id, upto=point)
        refusal, role = _signer_refusal(
            rosters[point],
            row.key_id,
            approve=row.decision == "approved",
            operators=operators,
            release_id=release_id,
        )
        state = rosters[point].keys.get(row.key_id)
        revoked = roster(catalog, dataset_id).keys.get(row.key_id)
        if (
            refusal is None
            and row.id not in anchoring.signature_entries  # unanchored: only its timestamps
            and revoked
            and revoked.revoked_at
            and revoked.revoked_at < row.signed_at
        ):
            refusal = f"signed at {row.signed_at}, after its revocation ({revoked.revoked_at})"
        if refusal is not None:
            problems.append(f"{where}: {refusal}")
            continue
        file = directory / attestations.ATTESTATIONS_FOLDER / attestation_name(number, row)
        if not file.is_file() or json.loads(file.read_text()) != json.loads(row.envelope):
            problems.append(f"{where}: its attestation file {file.name} is missing or differs")
            continue
        try:
            checked = attestations.verify_release_attestation(
                directory, envelope_from_json(row.envelope), {row.key_id: state.public}
            )
        except (VerificationError, IdentityError) as exc:
            problems.append(f"{where}: {exc}")
            continue
        if checked.decision != ATTESTED[row.decision] or checked.role != role:
            problems.append(f"{where}: its attestation says {checked.decision} as {checked.role}")
            continue
        if row.decision == "approved":
            valid_approvers.add(row.key_id)
    required_from = _required_from(catalog, dataset_id)
    if required_from is None and not rows:
        return problems, legacy  # a dataset that never registered keys: reviews as before
    notes = list(legacy)
    for entry in signed_trail(catalog, release_id, catalog.reviews(release_id)):
        who = f"{entry['decision']} by {entry['reviewer']} at {entry['at']}"
        if entry["key_id"] is not None:
            notes.append(f"{who}: signed by key {entry['key_id']} ({entry['role']})")
        elif required_from is not None and entry["at"] >= required_from:
            problems.append(f"{who}: unsigned, but dataset {dataset_id!r} requires signatures")
        else:
            notes.append(f"{who}: unsigned (dataset {dataset_id!r} required no signatures then)")
    signed_approvals = [r for r in rows if r.decision == "approved"]
    decided = record.status in ("approved", "published")
    if decided and signed_approvals and len(valid_approvers) < required_approvals:
        problems.append(
            f"release {release_id} is {record.status} with {len(valid_approvers)} valid "
            f"approval(s) by distinct reviewer keys; its policy requires {required_approvals}"
        )
    return problems, notes


def verify_release(
    directory: Path, catalog: Catalog, *, input_path: str | Path | None = None
) -> list[str]:
    """``artifacts.verify`` and the signatures (:func:`signature_problems`): raise
    :class:`VerificationError` with every problem; return the notes (which decisions are signed,
    which are not).  Offline: the catalog and the release directory only."""
    from dprelease.catalog.publishing import artifacts
    from dprelease.catalog.review.policy import policy_of

    try:
        artifacts.verify(directory, catalog, input_path=input_path)
        problems: list[str] = []
    except VerificationError as exc:
        problems = list(exc.problems) or [str(exc)]
    try:
        release_id = str(artifacts.read_manifest(directory).get("release_id"))
        required = policy_of(catalog, release_id).required_approvals
        found, notes = signature_problems(directory, catalog, required_approvals=required)
    except (CatalogError, VerificationError):  # no manifest, or not in the catalog: reported
        found, notes = [], []
    problems += found
    if problems:
        artifacts.raise_problems(directory, problems)
    return notes
