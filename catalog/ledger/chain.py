"""The ledger's hash chain: what an entry's hash covers, and what no longer verifies.

Tamper evidence: every ledger entry stores the SHA-256 of its canonical content including the hash
of the entry before it (a hash chain), and the chain's length and head are anchored outside the
database, authenticated with the catalog key (``catalog.keys``).  A deleted, edited or reordered
entry, or a catalog database deleted or replaced by an empty or another one, no longer verifies,
and new charges and releases are refused until it does (``Ledger.verify_chain``).  The anchor is
written after the commit, under a host-wide lock: a crash in between leaves it one entry behind,
which is accepted and repaired by the next write.  Pure functions over rows: no database here."""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256
from typing import Any

from dprelease.catalog import keys

GENESIS = "0" * 64  # the "previous hash" of the first ledger entry
CHAIN_FORMAT = "dprelease-ledger-entry/1"
# Entries that are not plain whole-dataset charges (a partition, or a skipped release) are hashed
# in format 2, which adds the kind and the partition; plain charges keep format 1, so every entry
# written before schema 3 still verifies.
CHAIN_FORMAT_V2 = "dprelease-ledger-entry/2"
# key: a key registered with roles, or revoked; series-plan: a series' horizon plan recorded;
# decision: a review decision (its label carries :func:`decision_digest`)
DECISION_KIND = "decision"
ENTRY_KINDS = ("charge", "skipped", "key", "series-plan", DECISION_KIND)
DECISION_FORMAT = "dprelease-decision/1"
MAX_PROBLEMS_SHOWN = 20


@dataclass(frozen=True, kw_only=True)
class ChainHead:
    """A point of the ledger's hash chain: the entry ``seq`` and its hash (``seq`` 0: empty)."""

    seq: int
    entry_hash: str

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "entry_hash": self.entry_hash}


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
    """SHA-256 of one ledger entry's canonical content, chained to ``prev_hash``. O(1).

    Length-prefixed fields (unambiguous whatever a label contains), floats by ``repr``.  A plain
    whole-dataset charge is hashed in format 1 (as before schema 3); any other entry in format 2,
    which also covers its kind and partition: a changed kind or partition changes the format or
    the content, so it never verifies.
    """
    kind = entry_kind or "charge"
    plain = kind == "charge" and partition_key is None
    extra = () if plain else (str(kind), "" if partition_key is None else f"={partition_key}")
    parts = (
        CHAIN_FORMAT if plain else CHAIN_FORMAT_V2,
        str(int(seq)),
        *(receipt_id, dataset_id, release_id, label, measure),
        *(repr(float(value)) for value in (epsilon, rho, delta)),
        created_at,
        *extra,
        prev_hash,
    )
    return sha256("".join(f"{len(p)}:{p};" for p in parts).encode()).hexdigest()


def decision_digest(
    *,
    release_id: str,
    decision: str,
    reviewer: str,
    note: str,
    key_id: str | None,
    envelope_sha256: str | None,
) -> str:
    """SHA-256 of a review decision as its ledger entry anchors it: the release, the decision,
    the reviewer, the note, and for a signed decision the key id and the SHA-256 of its DSSE
    envelope (as the catalog stores it).  Length-prefixed, so unambiguous.  O(len(note))."""
    parts = (
        DECISION_FORMAT,
        release_id,
        decision,
        reviewer,
        note,
        key_id or "",
        envelope_sha256 or "",
    )
    return sha256("".join(f"{len(p)}:{p};" for p in parts).encode()).hexdigest()


def decision_label(decision: str, digest: str) -> str:
    """The label of a decision's ledger entry (at most 256 characters)."""
    return f"{decision} {digest}"


@dataclass(frozen=True, kw_only=True)
class DecisionAnchoring:
    """Which review decisions the ledger anchors (:func:`match_decisions`)."""

    problems: tuple[str, ...]
    notes: tuple[str, ...]  # decisions recorded before decisions were anchored
    review_entries: dict[int, int]  # reviews.seq -> ledger seq of its anchor
    signature_entries: dict[int, int]  # review_signatures.id -> ledger seq of its anchor


def match_decisions(
    reviews: list[Any], signatures: list[Any], anchors: list[Any], *, anchored_from_start: bool
) -> DecisionAnchoring:
    """Match each decision row (``reviews`` in ``seq`` order; its signature among
    ``signatures``, matched by release, decision and reviewer) to the first unused ledger entry
    of kind ``decision`` (``anchors``, in ledger order) of its release whose label carries its
    :func:`decision_digest`.  A decision without an entry is a problem, unless it was recorded
    before the catalog's first anchored decision (and the catalog was not created anchoring
    them: ``anchored_from_start``); an entry without its decision, or a signature row no entry
    covers, is a problem.  O(decisions · anchors of a release)."""
    by_release: dict[str, list[Any]] = {}
    for anchor in anchors:
        by_release.setdefault(anchor.release_id, []).append(anchor)
    used: set[int] = set()
    review_entries: dict[int, int] = {}
    signature_entries: dict[int, int] = {}
    unanchored = []
    for row in reviews:
        candidates: dict[str, Any] = {_row_digest(row, None): None}
        for signature in signatures:
            same = (signature.release_id, signature.decision, signature.reviewer)
            if same == (row.release_id, row.decision, row.reviewer):
                candidates[_row_digest(row, signature)] = signature
        found = next(
            (
                anchor
                for anchor in by_release.get(row.release_id, [])
                if anchor.seq not in used and anchor.label.rsplit(" ", 1)[-1] in candidates
            ),
            None,
        )
        if found is None:
            unanchored.append(row)
            continue
        used.add(found.seq)
        review_entries[row.seq] = found.seq
        signature = candidates[found.label.rsplit(" ", 1)[-1]]
        if signature is not None:
            signature_entries[signature.id] = found.seq
    boundary = 0 if anchored_from_start else min(review_entries, default=None)
    problems, notes, legacy = [], [], set()
    for row in unanchored:
        what = f"decision {row.decision} by {row.reviewer} on release {row.release_id}"
        if boundary is None or 0 < row.seq < boundary:
            notes.append(f"{what}: not anchored (recorded before decisions were anchored)")
            legacy.add((row.release_id, row.decision, row.reviewer))
        else:
            problems.append(
                f"{what} (review #{row.seq}) has no decision entry in the ledger: it was "
                "inserted or edited outside dprelease"
            )
    problems += [
        f"ledger entry #{anchor.seq} anchors a decision on release {anchor.release_id} that table "
        "reviews does not hold: a decision was deleted or edited outside dprelease"
        for anchor in anchors
        if anchor.seq not in used
    ]
    problems += [
        f"signature #{s.id} ({s.decision} by {s.reviewer} on release {s.release_id}, key "
        f"{s.key_id}) is not the one its decision's ledger entry anchors: it was inserted or "
        "edited outside dprelease"
        for s in signatures
        if s.id not in signature_entries and (s.release_id, s.decision, s.reviewer) not in legacy
    ]
    return DecisionAnchoring(
        problems=tuple(problems),
        notes=tuple(notes),
        review_entries=review_entries,
        signature_entries=signature_entries,
    )


def _row_digest(review: Any, signature: Any) -> str:
    return decision_digest(
        release_id=review.release_id,
        decision=review.decision,
        reviewer=review.reviewer,
        note=review.note,
        key_id=None if signature is None else signature.key_id,
        envelope_sha256=None
        if signature is None
        else sha256(signature.envelope.encode()).hexdigest(),
    )


def row_digest(row: Any, prev_hash: str) -> str:
    """:func:`entry_digest` of a row of the ledger table, chained to ``prev_hash``. O(1)."""
    fields = row._asdict()
    del fields["entry_hash"]
    return entry_digest(**{**fields, "prev_hash": prev_hash})


def chain_problems(rows: list[Any]) -> list[str]:
    """Entries (rows of the ledger table in ``seq`` order) whose hash or link to the previous
    entry does not verify. O(n)."""
    problems = []
    expected_prev, previous = GENESIS, "the start of the ledger"
    for row in rows:
        problem = None
        if row.entry_hash is None or row.prev_hash is None:
            problem = "carries no chain hash: it was inserted outside dprelease"
        elif row_digest(row, row.prev_hash) != row.entry_hash:
            problem = "was edited: its content no longer matches its hash"
        elif row.prev_hash != expected_prev:
            problem = (
                f"does not follow {previous}: an entry was deleted or inserted, or the entries "
                "were reordered"
            )
        if problem is not None:
            problems.append(f"ledger entry #{row.seq} (receipt {row.receipt_id}) {problem}")
        expected_prev, previous = row.entry_hash, f"entry #{row.seq}"
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


def bullets(problems: list[str]) -> str:
    """``problems`` as an indented list, the first :data:`MAX_PROBLEMS_SHOWN` of them."""
    shown = [f"  - {p}" for p in problems[:MAX_PROBLEMS_SHOWN]]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown.append(f"  - ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
    return "\n".join(shown)
