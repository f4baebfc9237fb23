"""``verify`` treats a manifest as untrusted input and checks the catalog's side of the story.

A crafted manifest must never make ``verify`` read outside the release directory; a rejected or
unreviewed release copied into a published location fails; the ledger's hash chain, the receipts'
content and the recorded chain head are checked; the keyed input fingerprint is re-checked when
the input is given (and its key id otherwise).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.errors import VerificationError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.artifacts import verify
from dprelease.catalog.review import decisions as review_module
from dprelease.catalog.review.decisions import review
from tests.unit.catalog.test_review import RELEASE, Staged, build_staged, fake_report


@pytest.fixture
def staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Staged:
    monkeypatch.setattr(review_module, "write_report", fake_report)
    return build_staged(tmp_path)


def edit_manifest(staged: Staged, change: Any) -> None:
    """Edit the manifest and record its new sha256 in the catalog (a forger with catalog access),
    so only the check under test can fail."""
    path = staged.directory / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    staged.catalog.update_release(RELEASE, manifest_sha256=artifacts.sha256_file(path))


def problems(staged: Staged, directory: Path | None = None, **kwargs: Any) -> str:
    with pytest.raises(VerificationError) as caught:
        verify(directory or staged.directory, staged.catalog, **kwargs)
    return str(caught.value)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file ``verify`` hashes."""
    seen: list[Path] = []
    real = artifacts.sha256_file

    def recording(path: Path) -> str:
        seen.append(Path(path).resolve())
        return real(path)

    monkeypatch.setattr(artifacts, "sha256_file", recording)
    return seen


# --- paths from the manifest ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "../secret.txt",
        "tables/../../secret.txt",
        "/etc/hostname",
        "C:\\secret.txt",
        "tables\\..\\x",
    ],
    ids=["parent", "nested-parent", "absolute", "windows-absolute", "backslashes"],
)
def test_artifact_path_outside_the_release_is_reported_and_not_read(
    staged: Staged, reads: list[Path], name: str
) -> None:
    secret = staged.directory.parent / "secret.txt"
    secret.write_text("confidential")
    digest = hashlib.sha256(b"confidential").hexdigest()
    edit_manifest(staged, lambda m: m["artifacts"].__setitem__(name, digest))
    message = problems(staged)
    assert f"manifest lists artifact {name!r} outside the release directory" in message
    assert "it was not read" in message
    inside = staged.directory.resolve()
    assert all(path.is_relative_to(inside) for path in reads), reads


def test_table_name_with_a_path_is_reported_and_not_read(
    staged: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = staged.directory.parent / "outside.parquet"
    pq.write_table(pa.table({"x": [1]}), outside)
    opened: list[Path] = []
    real = pq.read_metadata
    monkeypatch.setattr(pq, "read_metadata", lambda path: opened.append(Path(path)) or real(path))
    edit_manifest(staged, lambda m: m["tables"].append("../../outside"))
    assert "manifest table name '../../outside' is not a plain name; it was not read" in problems(
        staged
    )
    assert opened == [staged.directory / "tables" / "t.parquet"]


def test_symbolic_link_inside_the_release_is_reported_and_not_followed(
    staged: Staged, reads: list[Path]
) -> None:
    secret = staged.directory.parent / "secret.txt"
    secret.write_text("confidential")
    (staged.directory / "tables" / "extra.parquet").symlink_to(secret)
    (staged.directory / "linked-dir").symlink_to(staged.directory.parent, target_is_directory=True)
    message = problems(staged)
    assert "tables/extra.parquet is a symbolic link; a release holds regular files only" in message
    assert "linked-dir is a symbolic link" in message
    assert secret.resolve() not in reads


def test_artifacts_field_of_the_wrong_type(staged: Staged) -> None:
    edit_manifest(staged, lambda m: m.__setitem__("artifacts", ["report.html"]))
    assert "manifest field 'artifacts' must map relative paths to sha256 digests" in problems(
        staged
    )


# --- catalog status and published locations --------------------------------------------------------------


def copy_into_published(staged: Staged) -> Path:
    target = staged.published
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(staged.directory, target)
    return target


def test_rejected_release_under_published_fails(staged: Staged) -> None:
    review(staged.catalog, RELEASE, approve=False, reviewer="Bob", note="no")
    assert verify(staged.directory, staged.catalog) == []  # where it was staged: fine
    message = problems(staged, copy_into_published(staged))
    assert (
        f"release {RELEASE} is rejected in the catalog, but {staged.published} is a published "
        "location: only an approved and published release may be there"
    ) in message


def test_unreviewed_release_under_published_fails(staged: Staged) -> None:
    assert "is staged in the catalog, but" in problems(staged, copy_into_published(staged))


@pytest.mark.parametrize("status", ["failed", "aborted"])
def test_failed_or_aborted_release_under_published_fails(staged: Staged, status: str) -> None:
    staged.catalog.update_release(RELEASE, status=status)
    assert f"is {status} in the catalog, but" in problems(staged, copy_into_published(staged))


def test_published_release_verifies_in_its_published_location(staged: Staged) -> None:
    review(staged.catalog, RELEASE, approve=True, reviewer="Ada", note="")
    assert verify(staged.published, staged.catalog) == []


# --- the ledger: chain, receipts, chain head ----------------------------------------------------------------


def test_deleted_ledger_entry_is_reported(staged: Staged) -> None:
    db = Path(str(staged.catalog.engine.url.database))
    connection = sqlite3.connect(db)
    connection.execute("DELETE FROM ledger")
    connection.commit()
    connection.close()
    message = problems(staged)
    assert "ledger: the ledger has 0 entries but its anchor records 1" in message
    assert "is not in the ledger" in message
    assert (
        "the ledger chain head the manifest records (entry #1) is not on the catalog's chain"
        in message
    )


def test_receipt_with_another_label_or_hash(staged: Staged) -> None:
    def change(manifest: dict[str, Any]) -> None:
        manifest["ledger_receipts"][0]["label"] = "something else"
        manifest["ledger_receipts"][0]["entry_hash"] = "0" * 64

    edit_manifest(staged, change)
    message = problems(staged)
    assert "has label 'measure' in the ledger, the manifest says 'something else'" in message
    assert "has entry_hash" in message and f"the manifest says '{'0' * 64}'" in message


def test_chain_head_not_on_the_chain(staged: Staged) -> None:
    edit_manifest(
        staged,
        lambda m: m.__setitem__(artifacts.MANIFEST_CHAIN_HEAD, {"seq": 1, "entry_hash": "ab" * 32}),
    )
    assert (
        "the ledger chain head the manifest records (entry #1) is not on the catalog's chain"
        in (problems(staged))
    )


def test_malformed_chain_head(staged: Staged) -> None:
    edit_manifest(staged, lambda m: m.__setitem__(artifacts.MANIFEST_CHAIN_HEAD, {"seq": "1"}))
    assert "must hold seq and entry_hash" in problems(staged)


def test_release_checked_against_another_catalog(staged: Staged, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = Catalog(f"sqlite:///{tmp_path}/other/catalog.db")
    with pytest.raises(VerificationError) as caught:
        verify(staged.directory, other)
    message = str(caught.value)
    assert f"release '{RELEASE}' is not in the catalog" in message
    assert "the input fingerprint was keyed with key" in message


# --- the keyed input fingerprint ------------------------------------------------------------------------


def test_input_fingerprint_is_rechecked_with_the_input(staged: Staged) -> None:
    assert verify(staged.directory, staged.catalog, input_path=staged.input_path) == []
    pq.write_table(pa.table({"age": [1, 2, 4]}), staged.input_path)
    message = problems(staged, input_path=staged.input_path)
    assert f"input {staged.input_path} does not match the release's input fingerprint" in message
    assert staged.catalog.fingerprint_key_id() in message


def test_missing_input_is_reported(staged: Staged, tmp_path: Path) -> None:
    message = problems(staged, input_path=tmp_path / "nowhere.parquet")
    assert "cannot be fingerprinted" in message and "matches no file" in message


def test_key_id_mismatch_is_reported(staged: Staged) -> None:
    edit_manifest(staged, lambda m: m.__setitem__(artifacts.MANIFEST_KEY_ID, "0123456789abcdef"))
    message = problems(staged)
    assert (
        "the input fingerprint was keyed with key 0123456789abcdef, the catalog's key is "
        f"{staged.catalog.fingerprint_key_id()}"
    ) in message
