"""Signing keys, DSSE envelopes and review attestations (``catalog.identity``), and interop:
securesystemslib (the DSSE reference library, via in-toto 3.1.0) verifies our envelopes and we
verify its."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from pathlib import Path

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError as SslibVerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.identity import attestations, dsse, keys
from dprelease.catalog.identity.keys import IdentityError, PublicKey, SigningKey
from dprelease.catalog.publishing.artifacts import write_manifest, write_table

PAYLOAD = b'{"hello": "world"}'
KIND = "application/vnd.example+json"


def trusted(*signers: SigningKey) -> dict[str, PublicKey]:
    return {key.key_id: key.public for key in signers}


@pytest.fixture
def release(tmp_path: Path) -> Path:
    directory = tmp_path / "release-1"
    directory.mkdir()
    write_table(directory, "sex", pa.table({"sex": ["F", "M"], "count": [10.5, 12.0]}))
    write_table(directory, "age", pa.table({"age": [1, 2], "count": [3.0, 4.0]}))
    write_manifest(directory, {"release_id": "release-1"})
    return directory


# keys


def test_key_pair_round_trip_with_0600_and_refuses_overwrite(tmp_path: Path) -> None:
    key, info = keys.create_key("ada", home=tmp_path)
    private = tmp_path / "keys" / "ada.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    loaded = keys.load_signing_key("ada", home=tmp_path)
    assert loaded.key_id == key.key_id == info.key_id
    assert loaded.public.verify(loaded.sign(b"x"), b"x") and key.public.verify(
        loaded.sign(b"x"), b"x"
    )
    assert [(k.name, k.key_id) for k in keys.list_keys(home=tmp_path)] == [("ada", key.key_id)]
    assert keys.show_key("ada", home=tmp_path).public == key.public
    with pytest.raises(IdentityError, match="never overwritten"):
        keys.create_key("ada", home=tmp_path)
    assert keys.load_signing_key("ada", home=tmp_path).key_id == key.key_id  # untouched


def test_key_id_is_the_sha256_of_the_raw_public_key() -> None:
    key = SigningKey.generate()
    assert key.key_id == hashlib.sha256(key.public.raw).hexdigest()
    assert PublicKey.from_base64(key.public.base64) == key.public


def test_a_private_key_readable_by_others_is_refused_naming_the_path_and_rule(
    tmp_path: Path,
) -> None:
    keys.create_key("ada", home=tmp_path)
    path = tmp_path / "keys" / "ada.key"
    for mode in (0o644, 0o640, 0o602):
        os.chmod(path, mode)
        with pytest.raises(
            IdentityError, match=f"{re.escape(str(path))} has mode {mode:04o}.*group or others"
        ):
            keys.load_signing_key("ada", home=tmp_path)


def test_a_symlinked_or_foreign_private_key_is_refused(tmp_path: Path) -> None:
    keys.create_key("ada", home=tmp_path)
    link = tmp_path / "keys" / "link.key"
    link.symlink_to(tmp_path / "keys" / "ada.key")
    with pytest.raises(IdentityError, match="cannot be opened"):
        keys.load_signing_key("link", home=tmp_path)
    garbage = tmp_path / "keys" / "junk.key"
    garbage.write_text("not a key")
    garbage.chmod(0o600)
    with pytest.raises(IdentityError, match="not an unencrypted PEM key"):
        keys.load_signing_key("junk", home=tmp_path)


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x" * 65])
def test_bad_key_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(IdentityError, match="key name"):
        keys.create_key(name, home=tmp_path)


def test_a_public_key_file_whose_keyid_lies_is_refused(tmp_path: Path) -> None:
    _, info = keys.create_key("ada", home=tmp_path)
    document = json.loads(info.public_path.read_text())
    document["keyid"] = "0" * 64
    info.public_path.write_text(json.dumps(document))
    with pytest.raises(IdentityError, match=r"keyid '0+' is not the SHA-256"):
        keys.show_key("ada", home=tmp_path)
    with pytest.raises(IdentityError, match="public key"):
        PublicKey(b"short")


def test_repr_never_shows_private_material() -> None:
    private = Ed25519PrivateKey.generate()
    key = SigningKey(private)
    raw = private.private_bytes_raw()
    shown = repr(key) + str(key) + f"{key}" + repr([key])
    assert key.key_id in shown
    for secret in (raw.hex(), base64.b64encode(raw).decode(), "PRIVATE"):
        assert secret not in shown


# DSSE


def test_pae_matches_the_dsse_spec_vector() -> None:
    # protocol.md: PAE("http://example.com/HelloWorld", "hello world")
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_envelope_round_trip_and_multiple_signers() -> None:
    ada, grace, eve = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    envelope = dsse.sign_envelope(PAYLOAD, payload_type=KIND, keys=[ada, grace])
    again = dsse.Envelope.from_dict(json.loads(json.dumps(envelope.as_dict())))
    assert again == envelope
    assert dsse.verify_envelope(again, trusted(ada, grace, eve)) == [ada.key_id, grace.key_id]
    assert dsse.verify_envelope(again, trusted(grace)) == [grace.key_id]
    assert dsse.verify_envelope(again, trusted(eve)) == []


def test_tampered_payload_wrong_key_and_wrong_type_fail() -> None:
    ada, eve = SigningKey.generate(), SigningKey.generate()
    envelope = dsse.sign_envelope(PAYLOAD, payload_type=KIND, keys=ada)
    tampered = dsse.Envelope(KIND, b'{"hello": "mallory"}', envelope.signatures)
    assert dsse.verify_envelope(tampered, trusted(ada)) == []
    retyped = dsse.Envelope("text/plain", PAYLOAD, envelope.signatures)  # PAE binds the type
    assert dsse.verify_envelope(retyped, trusted(ada)) == []
    # eve's key claiming ada's key id: a keyid is never trusted on its own
    forged = dsse.Envelope(
        KIND, PAYLOAD, (dsse.Signature(ada.key_id, eve.sign(dsse.pae(KIND, PAYLOAD))),)
    )
    assert dsse.verify_envelope(forged, trusted(ada)) == []
    with pytest.raises(IdentityError, match=r"payloadType 'application/vnd\.example\+json' is not"):
        dsse.verify_envelope(envelope, trusted(ada), payload_type="text/plain")
    with pytest.raises(IdentityError, match="trusted"):
        dsse.verify_envelope(envelope, {eve.key_id: ada.public})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "not a JSON object"),
        ({"payload": "", "signatures": []}, "missing field.*payloadType"),
        ({"payloadType": "", "payload": "", "signatures": [{}]}, "payloadType"),
        ({"payloadType": KIND, "payload": "", "signatures": []}, "signatures"),
        ({"payloadType": KIND, "payload": "", "signatures": [{"sig": "AA=="}]}, "keyid"),
        ({"payloadType": KIND, "payload": "", "signatures": [{"keyid": "k", "sig": "@@"}]}, "sig"),
        ({"payloadType": KIND, "payload": 5, "signatures": [{"keyid": "k", "sig": ""}]}, "payload"),
    ],
)
def test_malformed_envelopes_are_refused(data: object, message: str) -> None:
    with pytest.raises(IdentityError, match=message):
        dsse.Envelope.from_dict(data)


def test_sign_envelope_refuses_bad_arguments() -> None:
    with pytest.raises(IdentityError, match="payload"):
        dsse.sign_envelope("text", payload_type=KIND, keys=SigningKey.generate())  # type: ignore[arg-type]
    with pytest.raises(IdentityError, match="at least one signing key"):
        dsse.sign_envelope(PAYLOAD, payload_type=KIND, keys=[])


# attestations


def test_attestation_round_trip(release: Path) -> None:
    ada = SigningKey.generate()
    envelope = attestations.attest_release(release, key=ada, decision="approve", note="ok")
    statement = json.loads(envelope.payload)
    names = [s["name"] for s in statement["subject"]]
    assert names == sorted(
        [
            "manifest.json#content",
            "tables/age.parquet",
            "tables/age.csv",
            "tables/sex.parquet",
            "tables/sex.csv",
        ]
    )
    assert statement["predicateType"] == attestations.PREDICATE_TYPE
    manifest = json.loads((release / "manifest.json").read_text())
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert {k: v for k, v in subjects.items() if "#" not in k} == manifest["artifacts"]
    assert subjects["manifest.json#content"] == attestations.manifest_content_digest(manifest)
    loaded = dsse.Envelope.from_dict(json.loads(json.dumps(envelope.as_dict())))
    result = attestations.verify_release_attestation(release, loaded, trusted(ada))
    assert (result.release_id, result.decision, result.role, result.note) == (
        "release-1",
        "approve",
        "reviewer",
        "ok",
    )
    assert result.signers == (ada.key_id,)
    (release / "attestations").mkdir()  # where decisions are kept: not a subject
    (release / "attestations" / "ada.json").write_text(json.dumps(envelope.as_dict()))
    assert attestations.verify_release_attestation(release, loaded, trusted(ada)) == result


def test_a_table_changed_after_the_attestation_fails_naming_the_file(release: Path) -> None:
    ada = SigningKey.generate()
    envelope = attestations.attest_release(release, key=ada, decision="approve")
    write_table(release, "sex", pa.table({"sex": ["F", "M"], "count": [99.0, 12.0]}))
    with pytest.raises(VerificationError, match=r"tables/sex\.parquet: changed since") as caught:
        attestations.verify_release_attestation(release, envelope, trusted(ada))
    assert "tables/age.parquet" not in str(caught.value)


def test_a_decision_rewriting_the_review_trail_keeps_the_attestation_valid(release: Path) -> None:
    ada = SigningKey.generate()
    envelope = attestations.attest_release(release, key=ada, decision="approve")
    manifest = json.loads((release / "manifest.json").read_text())
    (release / "report.html").write_text("<html>approved by ada</html>")
    (release / "report").mkdir()
    (release / "report" / "sex.html").write_text("<html></html>")
    write_manifest(release, {**manifest, "review": {"status": "published", "trail": ["ada"]}})
    assert attestations.verify_release_attestation(release, envelope, trusted(ada)).signers
    write_manifest(release, {**manifest, "cost": {"epsilon": 9.0}})  # the content changed
    with pytest.raises(VerificationError, match=r"manifest\.json#content: changed since"):
        attestations.verify_release_attestation(release, envelope, trusted(ada))


def test_added_and_removed_files_fail(release: Path) -> None:
    ada = SigningKey.generate()
    envelope = attestations.attest_release(release, key=ada, decision="reject")
    (release / "tables" / "age.csv").unlink()
    (release / "tables" / "extra.parquet").write_bytes(b"x")
    with pytest.raises(VerificationError) as caught:
        attestations.verify_release_attestation(release, envelope, trusted(ada))
    assert set(caught.value.problems) == {
        "tables/age.csv: attested but missing",
        "tables/extra.parquet: not attested",
    }


def test_an_untrusted_signer_or_another_release_fails(release: Path, tmp_path: Path) -> None:
    ada, eve = SigningKey.generate(), SigningKey.generate()
    envelope = attestations.attest_release(release, key=eve, decision="approve")
    with pytest.raises(VerificationError, match="no valid signature by a trusted key"):
        attestations.verify_release_attestation(release, envelope, trusted(ada))
    other = tmp_path / "other"
    other.mkdir()
    write_manifest(other, {"release_id": "release-2"})
    with pytest.raises(VerificationError, match="release_id 'release-1' is not this release's"):
        attestations.verify_release_attestation(
            other, attestations.attest_release(release, key=ada, decision="approve"), trusted(ada)
        )


def test_attest_refuses_bad_decisions_and_roles(release: Path) -> None:
    key = SigningKey.generate()
    with pytest.raises(IdentityError, match="decision 'maybe' must be one of approve, reject"):
        attestations.attest_release(release, key=key, decision="maybe")
    with pytest.raises(IdentityError, match="role 'boss' must be one of"):
        attestations.attest_release(release, key=key, decision="approve", role="boss")
    with pytest.raises(IdentityError, match="note"):
        attestations.attest_release(release, key=key, decision="approve", note=3)  # type: ignore[arg-type]


def test_a_signed_statement_that_is_not_a_review_decision_fails(release: Path) -> None:
    ada = SigningKey.generate()
    for statement, message in [
        (b"[1]", "_type"),
        ({"_type": attestations.STATEMENT_TYPE, "predicateType": "x"}, "predicateType"),
        (
            {
                "_type": attestations.STATEMENT_TYPE,
                "predicateType": attestations.PREDICATE_TYPE,
                "subject": [{"name": "manifest.json"}],
            },
            "subject",
        ),
        (
            {
                "_type": attestations.STATEMENT_TYPE,
                "predicateType": attestations.PREDICATE_TYPE,
                "subject": [],
                "predicate": {"decision": "approve"},
            },
            "predicate",
        ),
    ]:
        payload = statement if isinstance(statement, bytes) else json.dumps(statement).encode()
        envelope = dsse.sign_envelope(payload, payload_type=attestations.PAYLOAD_TYPE, keys=ada)
        with pytest.raises(VerificationError, match=message):
            attestations.verify_release_attestation(release, envelope, trusted(ada))


# interop with securesystemslib's DSSE implementation


def _sslib_key(public: PublicKey) -> SSlibKey:
    return SSlibKey(public.key_id, "ed25519", "ed25519", {"public": public.raw.hex()})


def test_securesystemslib_verifies_our_release_attestation(release: Path, tmp_path: Path) -> None:
    keys.create_key("ada", home=tmp_path)
    ada = keys.load_signing_key("ada", home=tmp_path)
    public = keys.show_key("ada", home=tmp_path).public  # what a verifier is given
    envelope = attestations.attest_release(release, key=ada, decision="approve")
    theirs = SslibEnvelope.from_dict(json.loads(json.dumps(envelope.as_dict())))
    assert set(theirs.verify([_sslib_key(public)], 1)) == {ada.key_id}
    assert json.loads(theirs.payload)["_type"] == "https://in-toto.io/Statement/v1"
    tampered = SslibEnvelope(b"{}", theirs.payload_type, theirs.signatures)
    with pytest.raises(SslibVerificationError):
        tampered.verify([_sslib_key(public)], 1)


def test_we_verify_an_envelope_securesystemslib_signed(release: Path) -> None:
    private = Ed25519PrivateKey.generate()
    public = SigningKey(private).public
    signer = CryptoSigner(private, SSlibKey.from_crypto(private.public_key(), keyid=public.key_id))
    ours = attestations.attest_release(release, key=SigningKey.generate(), decision="approve")
    theirs = SslibEnvelope(ours.payload, attestations.PAYLOAD_TYPE, {})
    theirs.sign(signer)
    envelope = dsse.Envelope.from_dict(theirs.to_dict())
    assert dsse.verify_envelope(envelope, {public.key_id: public}) == [public.key_id]
    result = attestations.verify_release_attestation(release, envelope, {public.key_id: public})
    assert result.signers == (public.key_id,)


def test_other_unusable_key_files_are_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = tmp_path / "keys"
    (folder / "dir.key").mkdir(parents=True)
    with pytest.raises(IdentityError, match="not a regular file"):
        keys.load_signing_key("dir", home=tmp_path)
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (folder / "ec.key").write_bytes(pem)
    (folder / "ec.key").chmod(0o600)
    with pytest.raises(IdentityError, match="is a ECPrivateKey; dprelease keys are Ed25519"):
        keys.load_signing_key("ec", home=tmp_path)
    (folder / "odd.pub").write_text('{"format": "something-else/1"}')
    with pytest.raises(IdentityError, match="format must be 'dprelease-public-key/1'"):
        keys.show_key("odd", home=tmp_path)
    with pytest.raises(IdentityError, match="does not exist"):
        keys.load_signing_key("nobody", home=tmp_path)
