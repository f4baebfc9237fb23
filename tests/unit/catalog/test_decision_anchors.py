"""Review decisions anchored in the ledger's hash chain (``Catalog.record_review``,
``chain.match_decisions``): each decision, signed or not, is recorded with a zero-cost
``decision`` entry carrying the digest of its release, decision, reviewer, note, key and
envelope, so a decision row inserted, edited or backdated by anyone with write access to the
database, or an anchor whose row was deleted, fails the catalog's chain check and ``dprelease
verify``; revocations are ordered against decisions by ledger position, not by timestamps.  A
catalog's decisions recorded before anchoring are listed as not anchored and still verify.  On
SQLite and on a real PostgreSQL server (``catalog_url``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.identity import roles
from dprelease.catalog.identity.keys import IdentityError
from dprelease.catalog.ledger import chain
from dprelease.catalog.ledger.schema import DECISIONS_MARKER, catalog_meta, reviews
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.review import decisions as review_module
from dprelease.catalog.review import signatures
from dprelease.catalog.review.policy import OPERATOR_ENV, record_policy
from dprelease.catalog.show import describe_release
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.unit.catalog.test_review import RELEASE, build_staged, fake_report, policy_spec
from tests.unit.catalog.test_signed_review import People, decide, ran_by


@pytest.fixture(autouse=True)
def _quick_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(review_module, "write_report", fake_report)
    monkeypatch.setenv(OPERATOR_ENV, "Olga")


def write(catalog: Catalog, statement: sa.Executable) -> None:
    """A write by hand: what anyone with write access to the database could do."""
    with catalog.engine.begin() as conn:
        conn.execute(statement)


def anchors(catalog: Catalog) -> list:
    return [e for e in catalog.ledger_entries() if e.kind == chain.DECISION_KIND]


def test_each_decision_is_anchored_by_a_zero_cost_entry_in_its_transaction(
    tmp_path: Path, catalog_url: str
) -> None:
    staged = build_staged(tmp_path, url=catalog_url)
    catalog = staged.catalog
    review_module.review(catalog, RELEASE, approve=False, reviewer="Ada", note="too noisy")
    [anchor] = anchors(catalog)
    assert anchor.release_id == RELEASE and anchor.cost == PrivacyCost.zero("pure")
    digest = chain.decision_digest(
        release_id=RELEASE,
        decision="rejected",
        reviewer="Ada",
        note="too noisy",
        key_id=None,
        envelope_sha256=None,
    )
    assert anchor.label == f"rejected {digest}" and len(anchor.label) <= 256
    assert catalog.spent("ds") == PrivacyCost(measure="pure", epsilon=0.5)  # nothing charged
    assert catalog.verify_chain() == []
    assert catalog.decision_anchoring().review_entries == {1: anchor.seq}
    # `dprelease show` lists the release's charges as its receipts, not the decision's anchor
    receipts = describe_release(catalog, RELEASE)["receipts"]
    assert [r["receipt_id"] for r in receipts] == [
        e.receipt_id for e in catalog.ledger_entries() if e.kind == "charge"
    ]


@pytest.mark.parametrize(
    "tamper",
    ["insert a decision", "edit the note", "backdate the decision", "delete the decision"],
)
def test_a_decision_row_changed_by_hand_fails_the_chain_check_and_verify(
    tmp_path: Path, catalog_url: str, tamper: str
) -> None:
    staged = build_staged(tmp_path, url=catalog_url)
    catalog = staged.catalog
    review_module.review(catalog, RELEASE, approve=False, reviewer="Ada", note="too noisy")
    assert catalog.verify_chain() == []
    signatures.verify_release(staged.directory, catalog)
    row = reviews.c.release_id == RELEASE
    statement = {
        "insert a decision": reviews.insert().values(
            release_id=RELEASE, decision="approved", reviewer="Eve", note="", at="2020-01-01"
        ),
        "edit the note": reviews.update().where(row).values(note="fine"),
        "backdate the decision": reviews.update().where(row).values(at="2020-01-01"),
        "delete the decision": reviews.delete().where(row),
    }[tamper]
    write(catalog, statement)
    problems = catalog.verify_chain()
    if tamper == "backdate the decision":  # the time is not what the digest covers
        assert problems == []
        return
    expected = {
        "insert a decision": ["decision approved by Eve on release rel-1 (review #2) has no"],
        "edit the note": ["decision rejected by Ada on release rel-1 (review #1) has no", "#2 "],
        "delete the decision": ["ledger entry #2 anchors a decision on release rel-1 that"],
    }[tamper]
    assert len(problems) == len(expected)
    assert all(p.startswith(e) or e in p for p, e in zip(problems, expected, strict=True))
    with pytest.raises(VerificationError, match=r"inserted or edited outside|deleted or edited"):
        signatures.verify_release(staged.directory, catalog)


def test_a_signature_swapped_or_inserted_by_hand_is_not_the_anchored_one(
    tmp_path: Path, catalog_url: str
) -> None:
    staged = build_staged(tmp_path, url=catalog_url)
    record_policy(staged.catalog, release_id=RELEASE, spec=policy_spec(approvers=2))
    people = People(staged)
    ran_by(staged, people.olga)
    decide(staged, people.ada, "Ada")
    assert staged.catalog.verify_chain() == []
    [row] = signatures.signatures(staged.catalog, RELEASE)
    other = signatures.sign_decision(staged.directory, key=people.bob, approve=True)
    write(
        staged.catalog,
        signatures.review_signatures.update()
        .where(signatures.review_signatures.c.id == row.id)
        .values(key_id=people.bob.key_id, envelope=json.dumps(other.as_dict(), sort_keys=True)),
    )
    problems = staged.catalog.verify_chain()
    assert any(
        p.startswith("decision approved by Ada on release rel-1 (review #1) has no")
        for p in problems
    )
    assert any(f"key {people.bob.key_id}) is not the one" in p for p in problems)


def test_revocations_are_ordered_by_ledger_position_not_by_timestamps(
    tmp_path: Path, catalog_url: str
) -> None:
    staged = build_staged(tmp_path, url=catalog_url)
    record_policy(staged.catalog, release_id=RELEASE, spec=policy_spec(approvers=2))
    people = People(staged)
    ran_by(staged, people.olga)
    decide(staged, people.ada, "Ada")
    copy = Path(decide(staged, people.bob, "Bob")["published_directory"])
    roles.revoke_key(staged.catalog, dataset_id="ds", key_id=people.ada.key_id, signer=people.cara)
    # the signing time is the signer's (and any database writer's) to choose: a time after the
    # revocation changes nothing, the decision's ledger entry precedes the revocation's
    table = signatures.review_signatures
    write(staged.catalog, table.update().values(signed_at="2999-01-01T00:00:00+00:00"))
    notes = signatures.verify_release(copy, staged.catalog)
    assert f"signed by key {people.ada.key_id} (reviewer)" in notes[0]


def test_decisions_recorded_before_anchoring_are_listed_and_still_verify(
    tmp_path: Path, catalog_url: str
) -> None:
    staged = build_staged(tmp_path, url=catalog_url)
    catalog = staged.catalog
    # a catalog created before decisions were anchored: no marker, and a decision without entry
    write(catalog, catalog_meta.delete().where(catalog_meta.c.key == DECISIONS_MARKER))
    write(
        catalog,
        reviews.insert().values(
            release_id=RELEASE, decision="approved", reviewer="Ada", note="", at="2020-01-01"
        ),
    )
    (tmp_path / "second").mkdir()
    second = build_staged(tmp_path / "second", release_id="rel-2", url=catalog.url)
    assert catalog.verify_chain() == []
    [note] = catalog.decision_anchoring().notes
    assert note == (
        "decision approved by Ada on release rel-1: not anchored (recorded before decisions "
        "were anchored)"
    )
    review_module.review(catalog, "rel-2", approve=False, reviewer="Bob", note="")
    assert catalog.verify_chain() == []
    assert signatures.verify_release(second.directory, catalog) == []
    # after the first anchored decision, a decision without its entry is no longer legacy
    write(
        catalog,
        reviews.insert().values(
            release_id=RELEASE, decision="approved", reviewer="Eve", note="", at="2019-01-01"
        ),
    )
    [problem] = catalog.verify_chain()
    assert problem.startswith("decision approved by Eve on release rel-1 (review #3) has no")


def test_a_revocation_between_the_check_and_the_decisions_transaction_refuses_it(
    tmp_path: Path, catalog_url: str
) -> None:
    staged = build_staged(tmp_path, url=catalog_url)
    people = People(staged)
    ran_by(staged, people.olga)
    envelope = signatures.sign_decision(staged.directory, key=people.ada, approve=False)
    accepted = signatures.accept(staged.catalog, RELEASE, approve=False, signature=envelope)
    assert accepted is not None
    # the custodian revokes Ada's key after her signature was checked, before it is recorded
    roles.revoke_key(staged.catalog, dataset_id="ds", key_id=people.ada.key_id, signer=people.cara)
    entries = staged.catalog.ledger_entries()
    with pytest.raises(IdentityError, match=r"keys of dataset 'ds' changed \(ledger entry #\d+\)"):
        staged.catalog.record_review(
            RELEASE,
            decision="rejected",
            reviewer="Ada",
            note="",
            also=accepted.recorder(RELEASE, "rejected", "Ada"),
            key_id=accepted.key_id,
            envelope_sha256=accepted.envelope_sha256,
        )
    assert staged.catalog.reviews(RELEASE) == [] and staged.catalog.ledger_entries() == entries
    assert staged.catalog.release(RELEASE).status == "staged"
