"""The catalog key (``catalog.keys``) and keyed input fingerprints (``source.content_fingerprint``).

Privacy: a published input fingerprint must not let whoever holds a candidate file confirm it, so it
is an HMAC under a per-catalog secret that only the catalog's owner can read (mode 0600); it stays
deterministic for one key so re-runs and the DAWA partition cache still hit.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

import pytest

from dprelease.catalog import keys
from dprelease.catalog.confidential.source import content_fingerprint, list_source_files
from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.store import Catalog


def url_in(directory: Path, name: str = "catalog.db") -> str:
    return f"sqlite:///{directory / name}"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "people.parquet"
    path.parent.mkdir()
    path.write_bytes(b"PAR1 confidential rows PAR1")
    return path


def test_key_is_created_beside_the_catalog_with_mode_0600(tmp_path: Path) -> None:
    key = keys.catalog_key(url_in(tmp_path))
    assert key.path == tmp_path / "catalog.key"
    assert stat.S_IMODE(key.path.stat().st_mode) == 0o600
    assert len(key.secret) == keys.KEY_BYTES
    assert key.key_id == hashlib.sha256(key.secret).hexdigest()[:16]
    assert key.secret.hex() not in repr(key)  # never printed


def test_key_is_created_once_and_then_reused(tmp_path: Path) -> None:
    first = keys.catalog_key(url_in(tmp_path))
    content = first.path.read_bytes() if first.path else b""
    again = keys.catalog_key(url_in(tmp_path))
    assert again.secret == first.secret and again.key_id == first.key_id
    assert first.path is not None and first.path.read_bytes() == content


def test_catalog_exposes_its_key_id(tmp_path: Path) -> None:
    catalog = Catalog(url_in(tmp_path))
    assert catalog.fingerprint_key_id() == keys.catalog_key(url_in(tmp_path)).key_id


def test_two_catalogs_in_one_folder_have_their_own_keys(tmp_path: Path) -> None:
    one = keys.catalog_key(url_in(tmp_path, "one.db"))
    two = keys.catalog_key(url_in(tmp_path, "two.db"))
    assert (one.path, two.path) == (tmp_path / "one.key", tmp_path / "two.key")
    assert one.key_id != two.key_id


def test_non_sqlite_catalog_keeps_its_key_in_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    path = keys.key_path("postgresql://alice:secret@db.example/catalog")
    assert path is not None and path.parent == tmp_path / "home"
    assert path.name.startswith("catalog-") and path.suffix == ".key"
    assert "secret" not in path.name
    # the password does not change where the key is
    assert keys.key_path("postgresql://alice:other@db.example/catalog") == path


def test_in_memory_catalog_has_a_process_key_and_no_file(tmp_path: Path) -> None:
    assert keys.key_path("sqlite://") is None
    assert keys.catalog_key("sqlite://").secret == keys.catalog_key("sqlite://").secret


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_key_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    key = keys.catalog_key(url_in(tmp_path))
    assert key.path is not None
    key.path.chmod(mode)
    with pytest.raises(
        CatalogError,
        match=rf"has mode 0{mode:o}; it must be readable by its owner only \(run: chmod 600 ",
    ):
        keys.catalog_key(url_in(tmp_path))


def test_damaged_key_is_refused_not_replaced(tmp_path: Path) -> None:
    key = keys.catalog_key(url_in(tmp_path))
    assert key.path is not None
    key.path.write_text("not hex\n")
    with pytest.raises(CatalogError, match=r"is damaged: it must hold 32 bytes as hex"):
        keys.catalog_key(url_in(tmp_path))
    assert key.path.read_text() == "not hex\n"


def test_missing_key_is_not_recreated_while_its_anchor_exists(tmp_path: Path) -> None:
    Catalog(url_in(tmp_path))  # creates the key and anchors the empty ledger
    (tmp_path / "catalog.key").unlink()
    assert (tmp_path / "catalog.anchor").exists()
    with pytest.raises(CatalogError, match=r"catalog key .* is missing but its ledger anchor"):
        keys.catalog_key(url_in(tmp_path))
    assert not (tmp_path / "catalog.key").exists()


# --- keyed fingerprints ------------------------------------------------------------------------------


def test_fingerprint_is_an_hmac_under_the_catalog_key(tmp_path: Path, data: Path) -> None:
    key = keys.catalog_key(url_in(tmp_path))
    files, partitioned = list_source_files(str(data))
    fingerprint = content_fingerprint(files, partitioned, key=key)
    content = data.name.encode() + b"\0" + data.read_bytes() + b"\0"
    assert fingerprint == hmac.new(key.secret, content, hashlib.sha256).hexdigest()
    assert fingerprint != hashlib.sha256(content).hexdigest()  # not a plain hash
    assert fingerprint != hashlib.sha256(data.read_bytes()).hexdigest()


def test_fingerprint_is_stable_for_one_key(tmp_path: Path, data: Path) -> None:
    files, partitioned = list_source_files(str(data))
    first = content_fingerprint(files, partitioned, key=keys.catalog_key(url_in(tmp_path)))
    again = content_fingerprint(files, partitioned, key=keys.catalog_key(url_in(tmp_path)))
    assert again == first


def test_fingerprints_differ_across_keys(tmp_path: Path, data: Path) -> None:
    files, partitioned = list_source_files(str(data))
    one = content_fingerprint(files, partitioned, key=keys.catalog_key(url_in(tmp_path, "a.db")))
    two = content_fingerprint(files, partitioned, key=keys.catalog_key(url_in(tmp_path, "b.db")))
    assert one != two


def test_fingerprint_follows_content_and_name(tmp_path: Path, data: Path) -> None:
    key = keys.catalog_key(url_in(tmp_path))
    files, partitioned = list_source_files(str(data))
    first = content_fingerprint(files, partitioned, key=key)
    data.write_bytes(data.read_bytes() + b"x")
    assert content_fingerprint(files, partitioned, key=key) != first
    renamed = data.with_name("other.parquet")
    os.rename(data, renamed)
    files, partitioned = list_source_files(str(renamed))
    assert content_fingerprint(files, partitioned, key=key) != first


def test_default_key_is_the_default_catalogs(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
    files, partitioned = list_source_files(str(data))
    default = content_fingerprint(files, partitioned)
    key = keys.catalog_key(url_in(tmp_path / "home"))
    assert default == content_fingerprint(files, partitioned, key=key)
    assert stat.S_IMODE((tmp_path / "home" / "catalog.key").stat().st_mode) == 0o600


# --- the anchor ---------------------------------------------------------------------------------------


def test_anchor_round_trips_and_a_forged_one_is_refused(tmp_path: Path) -> None:
    key = keys.catalog_key(url_in(tmp_path))
    key.write_anchor(entries=3, head="ab" * 32, written_at="2026-01-01T00:00:00+00:00")
    anchor = key.read_anchor()
    assert anchor is not None and (anchor.entries, anchor.head) == (3, "ab" * 32)
    assert key.anchor_path is not None
    assert stat.S_IMODE(key.anchor_path.stat().st_mode) == 0o600
    key.anchor_path.write_text(key.anchor_path.read_text().replace('"entries": 3', '"entries": 2'))
    with pytest.raises(CatalogError, match=r"does not verify under catalog key"):
        key.read_anchor()


def test_anchor_written_with_another_key_is_refused(tmp_path: Path) -> None:
    mine = keys.catalog_key(url_in(tmp_path, "mine.db"))
    theirs = keys.catalog_key(url_in(tmp_path, "theirs.db"))
    theirs.write_anchor(entries=1, head="cd" * 32, written_at="2026-01-01T00:00:00+00:00")
    assert mine.anchor_path is not None and theirs.anchor_path is not None
    mine.anchor_path.write_bytes(theirs.anchor_path.read_bytes())
    with pytest.raises(CatalogError, match=rf"does not verify under catalog key {mine.key_id}"):
        mine.read_anchor()
