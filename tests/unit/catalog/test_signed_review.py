"""Signed review (``catalog.review.signatures``): on a dataset whose custodian registered keys,
approvals are counted by distinct reviewer keys, never the key that ran the release, and
``verify`` checks every signature against the roles in force when it was made and the release's
attestation files against the tables; a catalog without keys reviews and verifies as before."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from in_toto.exceptions import SignatureVerificationError
from in_toto.models.metadata import Metadata
from typer.testing import CliRunner

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.identity import attestations, roles, signing
from dprelease.catalog.identity.keys import IdentityError, SigningKey, create_key
from dprelease.catalog.review import decisions as review_module
from dprelease.catalog.review import signatures
from dprelease.catalog.review.policy import OPERATOR_ENV, record_policy
from dprelease.flows.cli import app
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.unit.catalog.test_review import RELEASE, Staged, build_staged, fake_report, policy_spec

runner = CliRunner()


class People:
    """Keys on dataset ``ds``: custodian Cara, operator Olga (who may also review), reviewers
    Ada and Bob, auditor Eve."""

    def __init__(self, staged: Staged) -> None:
        self.cara, self.olga, self.ada, self.bob, self.eve = (
            SigningKey.generate() for _ in range(5)
        )
        for key, name, granted in [
            (self.cara, "cara", ("custodian",)),
            (self.olga, "olga", ("operator", "reviewer")),
            (self.ada, "ada", ("reviewer",)),
            (self.bob, "bob", ("reviewer",)),
            (self.eve, "eve", ("auditor",)),
        ]:
            roles.register_key(
                staged.catalog,
                dataset_id="ds",
                public=key.public,
                name=name,
                roles=granted,
                signer=self.cara,
            )


def ran_by(staged: Staged, key: SigningKey, release_id: str = RELEASE) -> None:
    """What a run with ``DPRELEASE_KEY`` records: the run and its charges signed by ``key``."""
    signing.sign_run(
        staged.catalog, key=key, release_id=release_id, dataset_id="ds", spec_fingerprint="f" * 64
    )
    signing.sign_charges(staged.catalog, key=key, release_id=release_id, dataset_id="ds")


def decide(
    staged: Staged,
    key: SigningKey | None,
    reviewer: str,
    *,
    approve: bool = True,
    release_id: str = RELEASE,
) -> dict:
    directory = Path(str(staged.catalog.release(release_id).directory))
    signature = (
        None if key is None else signatures.sign_decision(directory, key=key, approve=approve)
    )
    return review_module.review(
        staged.catalog,
        release_id,
        approve=approve,
        reviewer=reviewer,
        note="",
        signature=signature,
    )


@pytest.fixture
def signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, catalog_url: str
) -> tuple[Staged, People]:
    """A staged release needing two approvals on a dataset with keys, run by Olga's key; its
    catalog on SQLite and on a real PostgreSQL server (``catalog_url``)."""
    monkeypatch.setattr(review_module, "write_report", fake_report)
    monkeypatch.setenv(OPERATOR_ENV, "Olga")
    staged = build_staged(tmp_path, url=catalog_url)
    record_policy(staged.catalog, release_id=RELEASE, spec=policy_spec(approvers=2))
    people = People(staged)
    ran_by(staged, people.olga)
    return staged, people


def test_one_person_with_one_key_cannot_satisfy_two_approvers(signed) -> None:
    staged, people = signed
    assert decide(staged, people.ada, "Ada")["status"] == "staged"
    for name in ("Ada Lovelace", "someone else"):  # whatever name is declared
        with pytest.raises(IdentityError, match=f"key {people.ada.key_id} already approved"):
            decide(staged, people.ada, name)
    assert staged.catalog.release(RELEASE).status == "staged"
    assert [r.reviewer for r in staged.catalog.reviews(RELEASE)] == ["Ada"]
    # the catalog's own constraint, should two approvals with one key race past the check
    accepted = signatures.AcceptedSignature(
        key_id=people.ada.key_id,
        role="reviewer",
        envelope=signatures.sign_decision(staged.directory, key=people.ada, approve=True),
    )
    with pytest.raises(sa.exc.IntegrityError):
        staged.catalog.record_review(
            RELEASE,
            decision="approved",
            reviewer="Ada again",
            note="",
            required_approvals=2,
            also=accepted.recorder(RELEASE, "approved", "Ada again"),
        )
    assert staged.catalog.release(RELEASE).status == "staged"


@pytest.mark.parametrize("declared", ["Someone", "Ada", "Bob"])
def test_the_operator_key_cannot_approve_whatever_the_names_say(
    signed, monkeypatch: pytest.MonkeyPatch, declared: str
) -> None:
    staged, people = signed
    monkeypatch.setenv(OPERATOR_ENV, declared)  # the environment says nothing about the key
    with pytest.raises(IdentityError, match=r"signed the run of release 'rel-1' \(its operator"):
        decide(staged, people.olga, "Reviewer Not Olga")
    decide(staged, people.ada, "Ada")
    with pytest.raises(IdentityError, match="signed the run"):
        decide(staged, people.olga, "Bob")  # not as the second approver either
    assert staged.catalog.release(RELEASE).status == "staged"


def test_a_key_without_the_reviewer_role_or_no_signature_is_refused(signed) -> None:
    staged, people = signed
    with pytest.raises(IdentityError, match=r"holds the role\(s\) auditor .* not reviewer"):
        decide(staged, people.eve, "Eve")
    with pytest.raises(IdentityError, match="is not registered on dataset 'ds'"):
        decide(staged, SigningKey.generate(), "Mallory")
    with pytest.raises(IdentityError, match="custodian"):
        decide(staged, people.cara, "Cara")
    with pytest.raises(IdentityError, match="dataset 'ds' requires signed reviews"):
        decide(staged, None, "Ada")
    assert staged.catalog.reviews(RELEASE) == []


def test_the_operator_key_may_withdraw_its_release(signed) -> None:
    staged, people = signed
    envelope = signatures.sign_release_decision(
        staged.catalog, RELEASE, key=people.olga, approve=False, note="wrong input"
    )
    assert json.loads(envelope.payload)["predicate"]["role"] == "operator"
    outcome = review_module.review(
        staged.catalog, RELEASE, approve=False, reviewer="Olga", note="", signature=envelope
    )
    assert outcome["status"] == "rejected"
    [row] = signatures.signatures(staged.catalog, RELEASE)
    assert (row.decision, row.key_id, row.role) == ("rejected", people.olga.key_id, "operator")
    assert signatures.verify_release(staged.directory, staged.catalog) == [
        f"rejected by Olga at {staged.catalog.reviews(RELEASE)[0].at}: signed by key "
        f"{people.olga.key_id} (operator)"
    ]


def test_a_signature_over_other_content_is_refused(signed) -> None:
    staged, people = signed
    envelope = signatures.sign_decision(staged.directory, key=people.ada, approve=True)
    pq.write_table(pa.table({"estimate": [5.0, 2.0]}), staged.directory / "tables" / "t.parquet")
    with pytest.raises(IdentityError, match=r"tables/t\.parquet: changed since"):
        review_module.review(
            staged.catalog, RELEASE, approve=True, reviewer="Ada", note="", signature=envelope
        )
    decide(staged, people.ada, "Ada")  # the content as staged
    pq.write_table(pa.table({"estimate": [6.0, 2.0]}), staged.directory / "tables" / "t.parquet")
    with pytest.raises(IdentityError, match=r"earlier approval by key .* \(Ada\) is not of the"):
        decide(staged, people.bob, "Bob")  # signs the changed content: not what Ada approved
    assert staged.catalog.release(RELEASE).status == "staged"
    rejecting = signatures.sign_decision(staged.directory, key=people.bob, approve=False)
    with pytest.raises(IdentityError, match="says reject as reviewer, not approve"):
        review_module.review(
            staged.catalog, RELEASE, approve=True, reviewer="Bob", note="", signature=rejecting
        )


def published(signed) -> tuple[Staged, People, Path]:
    staged, people = signed
    decide(staged, people.ada, "Ada")
    outcome = decide(staged, people.bob, "Bob")
    assert outcome["status"] == "published"
    return staged, people, Path(outcome["published_directory"])


def test_two_reviewer_keys_publish_with_attestation_files_that_verify(signed) -> None:
    staged, people, copy = published(signed)
    for directory in (staged.directory, copy):
        files = sorted(p.name for p in (directory / "attestations").iterdir())
        assert files == [
            f"01-approve-{people.ada.key_id[:16]}.json",
            f"02-approve-{people.bob.key_id[:16]}.json",
        ]
        notes = signatures.verify_release(directory, staged.catalog)
        assert [n.split(": ", 1)[1] for n in notes] == [
            f"signed by key {people.ada.key_id} (reviewer)",
            f"signed by key {people.bob.key_id} (reviewer)",
        ]
    manifest = json.loads((copy / "manifest.json").read_text())
    assert [s["key_id"] for s in manifest["review"]["signatures"]] == [
        people.ada.key_id,
        people.bob.key_id,
    ]
    assert "attestations/" + files[0] in manifest["artifacts"]


def test_a_table_changed_after_approval_fails_verify(signed) -> None:
    staged, _, copy = published(signed)
    pq.write_table(pa.table({"estimate": [7.0, 2.0]}), copy / "tables" / "t.parquet")
    with pytest.raises(VerificationError) as caught:
        signatures.verify_release(copy, staged.catalog)
    attested = [p for p in caught.value.problems if "changed since the attestation" in p]
    assert len(attested) == 2 and all("tables/t.parquet" in p for p in attested)


def test_a_removed_attestation_file_or_an_unsigned_published_release_fails_verify(signed) -> None:
    staged, people, copy = published(signed)
    (copy / "attestations" / f"02-approve-{people.bob.key_id[:16]}.json").unlink()
    with pytest.raises(VerificationError, match="is missing or differs"):
        signatures.verify_release(copy, staged.catalog)


def test_a_revoked_keys_new_signature_is_refused_its_earlier_ones_still_verify(
    signed, tmp_path: Path
) -> None:
    staged, people, copy = published(signed)
    second = build_staged(tmp_path, release_id="rel-2", url=staged.catalog.url)
    ran_by(second, people.olga, "rel-2")
    roles.revoke_key(staged.catalog, dataset_id="ds", key_id=people.ada.key_id, signer=people.cara)
    with pytest.raises(IdentityError, match=r"was revoked on dataset 'ds' at ledger entry #\d+"):
        decide(second, people.ada, "Ada", release_id="rel-2")
    assert signatures.verify_release(copy, staged.catalog)  # signed before the revocation
    # a signature recorded after the revocation (written past the checks) fails verify
    envelope = signatures.sign_decision(second.directory, key=people.ada, approve=True)
    accepted = signatures.AcceptedSignature(
        key_id=people.ada.key_id, role="reviewer", envelope=envelope
    )
    second.catalog.record_review(
        "rel-2",
        decision="approved",
        reviewer="Ada",
        note="",
        also=accepted.recorder("rel-2", "approved", "Ada"),
    )
    review_module.review(second.catalog, "rel-2", approve=True, reviewer="Ada", note="")
    with pytest.raises(VerificationError, match=r"approved by Ada \(key .*\): key .* was revoked"):
        signatures.verify_release(second.directory, second.catalog)


def test_attestation_files_verify_with_the_in_toto_reference_library(signed) -> None:
    _, people, copy = published(signed)
    for key in (people.ada, people.bob):
        path = copy / "attestations" / f"{'01' if key is people.ada else '02'}-approve-"
        path = Path(str(path) + f"{key.key_id[:16]}.json")
        envelope = Metadata.load(str(path))
        public = {
            "keyid": key.key_id,
            "keytype": "ed25519",
            "scheme": "ed25519",
            "keyval": {"public": key.public.raw.hex()},
        }
        envelope.verify_signature(public)  # raises unless the key signed it
        assert envelope.payload_type == attestations.PAYLOAD_TYPE
        statement = json.loads(envelope.payload)
        assert statement["_type"] == "https://in-toto.io/Statement/v1"
        subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
        assert subjects == attestations.release_digests(copy)
        other = {**public, "keyval": {"public": people.eve.public.raw.hex()}}
        with pytest.raises(SignatureVerificationError):
            envelope.verify_signature({**other, "keyid": key.key_id})


def test_legacy_unsigned_reviews_still_verify_and_are_shown_unsigned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(review_module, "write_report", fake_report)
    staged = build_staged(tmp_path)
    outcome = review_module.review(staged.catalog, RELEASE, approve=True, reviewer="Ada", note="")
    copy = Path(outcome["published_directory"])
    assert signatures.verify_release(copy, staged.catalog) == []  # no keys: reviews as before
    assert "signatures" not in json.loads((copy / "manifest.json").read_text())["review"]
    People(staged)  # the custodian registers keys afterwards
    [note] = signatures.verify_release(copy, staged.catalog)
    assert note.endswith("unsigned (dataset 'ds' required no signatures then)")


def test_runs_are_refused_without_an_operator_key_on_a_signed_dataset(
    signed, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    staged, people = signed
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    with pytest.raises(IdentityError, match="requires signed runs: choose an operator key"):
        signing.check_operator(staged.catalog, "ds", key=signing.load_chosen_key())
    with pytest.raises(IdentityError, match=r"holds the role\(s\) reviewer .* not operator"):
        signing.check_operator(staged.catalog, "ds", key=people.ada)
    signing.check_operator(staged.catalog, "ds", key=people.olga)
    key, _ = create_key("svc", home=tmp_path / "home")
    monkeypatch.setenv(signing.KEY_ENV, "svc")
    assert signing.load_chosen_key().key_id == key.key_id


def test_verify_reports_an_unsigned_charge_and_an_edited_step(signed) -> None:
    staged, people = signed
    decide(staged, people.ada, "Ada")
    decide(staged, people.bob, "Bob")
    copy = Path(str(staged.catalog.release(RELEASE).published_directory))
    with staged.catalog.engine.begin() as conn:
        conn.execute(
            signing.signed_steps.update()
            .where(signing.signed_steps.c.step == "charge")
            .values(ledger_seq=0)
        )
    with pytest.raises(VerificationError, match=r"signed charge of rel-1 by key .*: key .* is not"):
        signatures.verify_release(copy, staged.catalog)


def test_review_cli_signs_with_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(review_module, "write_report", fake_report)
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
    monkeypatch.setenv(OPERATOR_ENV, "Olga")
    staged = build_staged(tmp_path)
    record_policy(staged.catalog, release_id=RELEASE, spec=policy_spec(approvers=1))
    cara, _ = create_key("cara")
    ada, _ = create_key("ada")
    for key, name, granted in [(cara, "cara", "custodian"), (ada, "ada", "reviewer")]:
        roles.register_key(
            staged.catalog,
            dataset_id="ds",
            public=key.public,
            name=name,
            roles=[granted],
            signer=cara,
        )
    unsigned = runner.invoke(app, ["review", RELEASE, "--approve", "--reviewer", "Ada"])
    assert unsigned.exit_code == 2 and "requires signed reviews" in unsigned.output
    refused = runner.invoke(app, ["review", RELEASE, "--approve", "--key", "cara"])
    assert refused.exit_code == 2 and "not reviewer" in refused.output
    done = runner.invoke(app, ["review", RELEASE, "--approve", "--key", "ada"])
    assert done.exit_code == 0, done.output
    assert "published" in done.output
    shown = runner.invoke(app, ["review", RELEASE])
    assert f"approved by ada (signed by key {ada.key_id[:16]}" in shown.output
    copy = Path(str(staged.catalog.release(RELEASE).published_directory))
    verified = runner.invoke(app, ["verify", str(copy), "--json"])
    report = json.loads(verified.output)
    assert report["ok"], report
    assert report["signatures"][0].endswith(f"signed by key {ada.key_id} (reviewer)")
    for result in (unsigned, refused, done, shown, verified):
        assert "PRIVATE" not in result.output


def test_charges_made_outside_the_signed_accountant_are_signed_at_staging(
    signed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged, people = signed
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    svc, _ = create_key("svc", home=tmp_path / "home")
    roles.register_key(
        staged.catalog,
        dataset_id="ds",
        public=svc.public,
        name="svc",
        roles=["operator"],
        signer=people.cara,
    )
    staged.catalog.update_release(RELEASE, status="measuring")
    receipt = staged.catalog.charge(
        "ds", PrivacyCost(measure="pure", epsilon=0.25), release_id=RELEASE, label="period"
    )
    [problem] = signing.step_problems(staged.catalog, RELEASE, "ds")
    assert problem == f"charge {receipt} of rel-1 is not signed by an operator key"
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    assert (
        signing.sign_unsigned(
            staged.catalog, release_id=RELEASE, dataset_id="ds", spec_fingerprint="f" * 64
        )
        == 0
    )
    monkeypatch.setenv(signing.KEY_ENV, "svc")
    assert (
        signing.sign_unsigned(
            staged.catalog, release_id=RELEASE, dataset_id="ds", spec_fingerprint="f" * 64
        )
        == 1
    )
    assert signing.step_problems(staged.catalog, RELEASE, "ds") == []
