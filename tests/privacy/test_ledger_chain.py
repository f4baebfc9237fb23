"""The ledger is tamper-evident: every kind of edit is detected and refuses new charges and releases.

Privacy: the ledger is what keeps a dataset's lifetime budget; a deleted or edited charge, or a
catalog deleted or replaced by an empty one, would silently hand out budget that was already spent.
Each test edits the database the way an adversary (or an accident) would, outside dprelease, and
checks that ``verify_chain`` names the problem, that ``charge``, ``create_release`` and
``ensure_dataset`` refuse with a clear ``CatalogError``, and that the refusal wrote nothing.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dprelease.catalog import keys
from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.chain import GENESIS, entry_digest
from dprelease.catalog.ledger.schema import SCHEMA_VERSION
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.privacy.test_ledger_concurrency import CHARGER, python, wait_for

CHARGES = 4


def pure(epsilon: float) -> PrivacyCost:
    return PrivacyCost(measure="pure", epsilon=epsilon)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A catalog with one dataset (cap 10) and four charges of 0.5."""
    path = tmp_path / "catalog.db"
    catalog = Catalog(f"sqlite:///{path}")
    catalog.ensure_dataset("ds", cap=pure(10.0))
    for k in range(CHARGES):
        catalog.charge("ds", pure(0.5), release_id=f"r{k}", label=f"step {k}")
    return path


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def sql(path: Path, *statements: str) -> None:
    connection = sqlite3.connect(path)
    try:
        for statement in statements:
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()


def raw_rows(path: Path) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute("SELECT * FROM ledger ORDER BY seq").fetchall()
    finally:
        connection.close()


def assert_refused(path: Path, match: str) -> None:
    """The problem is reported, and every write that needs an intact ledger is refused."""
    catalog = Catalog(url(path))
    problems = catalog.verify_chain()
    assert any(re.search(match, p) for p in problems), problems
    before = raw_rows(path)
    refusal = r"failed its integrity check; new charges and releases are refused:\n  - "
    with pytest.raises(CatalogError, match=refusal) as caught:
        catalog.charge("ds", pure(0.1), release_id="late", label="after tampering")
    assert re.search(match, str(caught.value))
    assert "dprelease recover --adopt-ledger" in str(caught.value)
    with pytest.raises(CatalogError, match=refusal):
        catalog.create_release(
            release_id="new", name="n", dataset_id="ds", spec_fingerprint="f" * 64, mechanism="x"
        )
    with pytest.raises(CatalogError, match=refusal):
        catalog.ensure_dataset("other", cap=pure(1.0))
    assert raw_rows(path) == before
    assert "new" not in [r.id for r in catalog.releases()]


def test_intact_ledger_verifies_and_its_head_is_the_last_entry(db: Path) -> None:
    catalog = Catalog(url(db))
    assert catalog.verify_chain() == []
    entries = catalog.ledger_entries()
    assert entries[0].prev_hash == GENESIS
    for before, after in itertools.pairwise(entries):
        assert after.prev_hash == before.entry_hash
    head = catalog.chain_head()
    assert (head.seq, head.entry_hash) == (entries[-1].seq, entries[-1].entry_hash)
    assert catalog.chain_head("ds") == head
    assert catalog.chain_head("unknown").as_dict() == {"seq": 0, "entry_hash": GENESIS}
    anchor = catalog.key.read_anchor()
    assert anchor is not None and (anchor.entries, anchor.head) == (CHARGES, head.entry_hash)


def test_entry_hash_covers_every_field(db: Path) -> None:
    [first, *_] = Catalog(url(db)).ledger_entries()
    fields = {
        "seq": first.seq,
        "receipt_id": first.receipt_id,
        "dataset_id": first.dataset_id,
        "release_id": first.release_id,
        "label": first.label,
        "measure": first.cost.measure,
        "epsilon": first.cost.epsilon,
        "rho": first.cost.rho,
        "delta": first.cost.delta,
        "created_at": first.created_at,
        "prev_hash": GENESIS,
    }
    assert entry_digest(**fields) == first.entry_hash
    changed = {
        "seq": 2,
        "receipt_id": "rcpt-x",
        "dataset_id": "other",
        "release_id": "r9",
        "label": "step 9",
        "measure": "zcdp",
        "epsilon": 0.25,
        "rho": 1e-9,
        "delta": 1e-12,
        "created_at": "2020-01-01T00:00:00+00:00",
        "prev_hash": "1" * 64,
    }
    for name, value in changed.items():
        assert entry_digest(**{**fields, name: value}) != first.entry_hash, name


# --- one test per kind of edit -------------------------------------------------------------------------


def test_deleted_middle_entry(db: Path) -> None:
    sql(db, "DELETE FROM ledger WHERE seq = 2")
    assert_refused(
        db, r"ledger entry #3 \(receipt rcpt-\w+\) does not follow entry #1: an entry was deleted"
    )


def test_deleted_first_entry(db: Path) -> None:
    sql(db, "DELETE FROM ledger WHERE seq = 1")
    assert_refused(db, r"ledger entry #2 .* does not follow the start of the ledger")


def test_deleted_last_entry(db: Path) -> None:
    sql(db, f"DELETE FROM ledger WHERE seq = {CHARGES}")
    assert_refused(db, rf"the ledger has {CHARGES - 1} entries but its anchor records {CHARGES}")


def test_deleted_every_entry(db: Path) -> None:
    sql(db, "DELETE FROM ledger")
    assert_refused(db, rf"the ledger has 0 entries but its anchor records {CHARGES}")
    assert Catalog(url(db)).spent("ds") == pure(0.0)  # the reset the refusal protects against


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger SET epsilon = 0.0 WHERE seq = 2",
        "UPDATE ledger SET label = 'harmless' WHERE seq = 3",
        "UPDATE ledger SET dataset_id = 'elsewhere' WHERE seq = 1",
        f"UPDATE ledger SET created_at = '2001-01-01' WHERE seq = {CHARGES}",
    ],
    ids=["cost", "label", "dataset", "last-entry-time"],
)
def test_edited_entry(db: Path, statement: str) -> None:
    sql(db, statement)
    assert_refused(
        db, r"ledger entry #\d \(receipt rcpt-\w+\) was edited: its content no longer matches"
    )


def test_edited_entry_with_a_recomputed_hash(db: Path) -> None:
    """The hash function is public: an editor can re-hash the entry, but then the next entry's
    link (or, for the last entry, the keyed anchor) no longer matches."""
    catalog = Catalog(url(db))
    for seq in (2, CHARGES):
        entry = catalog.ledger_entries()[seq - 1]
        forged = entry_digest(
            seq=entry.seq,
            receipt_id=entry.receipt_id,
            dataset_id=entry.dataset_id,
            release_id=entry.release_id,
            label=entry.label,
            measure="pure",
            epsilon=0.0,
            rho=0.0,
            delta=0.0,
            created_at=entry.created_at,
            prev_hash=str(entry.prev_hash),
        )
        sql(db, f"UPDATE ledger SET epsilon = 0.0, entry_hash = '{forged}' WHERE seq = {seq}")
    problems = Catalog(url(db)).verify_chain()
    assert any("ledger entry #3" in p and "does not follow entry #2" in p for p in problems)
    assert any(
        f"ledger entry {CHARGES} of {CHARGES} does not have the hash its anchor" in p
        for p in problems
    )
    assert_refused(db, r"does not follow entry #2")


def test_reordered_entries(db: Path) -> None:
    sql(
        db,
        "UPDATE ledger SET seq = -1 WHERE seq = 2",
        "UPDATE ledger SET seq = 2 WHERE seq = 3",
        "UPDATE ledger SET seq = 3 WHERE seq = -1",
    )
    assert_refused(db, r"ledger entry #[23] .* was edited")


def test_entries_swapped_with_their_hashes(db: Path) -> None:
    columns = "receipt_id, dataset_id, release_id, label, measure, epsilon, rho, delta, created_at, prev_hash, entry_hash"
    sql(
        db,
        f"CREATE TABLE swap AS SELECT seq, {columns} FROM ledger WHERE seq IN (2, 3)",
        "DELETE FROM ledger WHERE seq IN (2, 3)",
        f"INSERT INTO ledger (seq, {columns}) SELECT 5 - seq, {columns} FROM swap",
        "DROP TABLE swap",
    )
    assert_refused(db, r"ledger entry #[23] .* was edited")


def test_inserted_entry_without_a_hash(db: Path) -> None:
    sql(
        db,
        "INSERT INTO ledger (seq, receipt_id, dataset_id, release_id, label, measure, epsilon, rho,"
        " delta, created_at) VALUES (99, 'rcpt-forged', 'ds', 'x', 'x', 'pure', 0.1, 0, 0, 'now')",
    )
    assert_refused(db, r"ledger entry #99 \(receipt rcpt-forged\) carries no chain hash")


# --- the whole database deleted or replaced ----------------------------------------------------------------


def test_catalog_replaced_by_an_empty_one(db: Path, tmp_path: Path) -> None:
    empty = tmp_path / "elsewhere" / "catalog.db"
    empty.parent.mkdir()
    Catalog(url(empty))
    shutil.copyfile(empty, db)
    assert_refused(
        db,
        rf"the ledger has 0 entries but its anchor records {CHARGES}: entries were deleted, or "
        r"the catalog database was deleted or replaced",
    )


def test_catalog_replaced_by_another_one(db: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "catalog.db"
    other.parent.mkdir()
    catalog = Catalog(url(other))
    catalog.ensure_dataset("ds", cap=pure(10.0))
    for k in range(CHARGES):
        catalog.charge("ds", pure(0.01), release_id=f"o{k}", label="cheap")
    shutil.copyfile(other, db)
    assert_refused(
        db, rf"ledger entry {CHARGES} of {CHARGES} does not have the hash its anchor records"
    )


def test_catalog_file_deleted(db: Path) -> None:
    db.unlink()
    catalog = Catalog(url(db))  # opens (and creates) an empty database beside the anchor
    assert catalog.dataset_ids() == []
    assert_refused(db, rf"the ledger has 0 entries but its anchor records {CHARGES}")


def test_catalog_replaced_by_a_previous_version_catalog(db: Path, tmp_path: Path) -> None:
    """Migration of an old-schema database must not overwrite the anchor of the one it replaced."""
    old = tmp_path / "old.db"
    make_v1_catalog(old, charges=[0.01])
    shutil.copyfile(old, db)
    assert_refused(db, rf"the ledger has 1 entries but its anchor records {CHARGES}")


def test_edited_anchor(db: Path) -> None:
    anchor = db.with_suffix(".anchor")
    data = json.loads(anchor.read_text())
    data["entries"] = 0
    anchor.write_text(json.dumps(data))
    db.unlink()
    assert_refused(db, r"ledger anchor .* does not verify under catalog key")


def test_deleted_key(db: Path) -> None:
    db.with_suffix(".key").unlink()
    catalog = Catalog(url(db))
    assert any("is missing but its ledger anchor" in p for p in catalog.verify_chain())
    with pytest.raises(CatalogError, match=r"catalog key .* is missing but its ledger anchor"):
        catalog.charge("ds", pure(0.1), release_id="late", label="x")
    assert len(raw_rows(db)) == CHARGES


# --- what is accepted ------------------------------------------------------------------------------------


def test_crash_between_commit_and_anchor_is_accepted_and_repaired(db: Path) -> None:
    anchor = db.with_suffix(".anchor")
    one_behind = anchor.read_bytes()
    catalog = Catalog(url(db))
    catalog.charge("ds", pure(0.5), release_id="crashed", label="committed, anchor not written")
    anchor.write_bytes(one_behind)  # as if the process died right after the commit
    assert catalog.verify_chain() == []
    catalog.charge("ds", pure(0.5), release_id="next", label="after the crash")
    written = catalog.key.read_anchor()
    assert written is not None and written.entries == CHARGES + 2
    assert written.head == catalog.chain_head().entry_hash
    anchor.write_bytes(one_behind)  # now two behind: not a crash any more
    problems = catalog.verify_chain()
    assert problems == [
        f"the ledger has {CHARGES + 2} entries but its anchor records only {CHARGES}: entries were "
        "added outside dprelease, or another host charges this catalog without sharing its key "
        "directory"
    ]


def test_adopting_a_restored_ledger(db: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup.db"
    shutil.copyfile(db, backup)
    catalog = Catalog(url(db))
    catalog.charge("ds", pure(0.5), release_id="after-backup", label="lost by the restore")
    shutil.copyfile(backup, db)  # restored on purpose
    with pytest.raises(CatalogError, match=r"failed its integrity check"):
        catalog.charge("ds", pure(0.1), release_id="x", label="x")
    with pytest.raises(CatalogError, match=r"reason must say why"):
        catalog.adopt_ledger(reason="  ")
    head = catalog.adopt_ledger(reason="restored the 1 March backup after a disk failure")
    assert head.seq == CHARGES
    assert catalog.verify_chain() == []
    anchor = catalog.key.read_anchor()
    assert anchor is not None
    [adopted] = anchor.adopted
    assert adopted["reason"] == "restored the 1 March backup after a disk failure"
    assert adopted["previous"]["entries"] == CHARGES + 1
    catalog.charge("ds", pure(0.1), release_id="x", label="after adoption")
    assert catalog.key.read_anchor().adopted == anchor.adopted  # type: ignore[union-attr]


def test_an_edited_ledger_cannot_be_adopted(db: Path) -> None:
    sql(db, "UPDATE ledger SET epsilon = 0.0 WHERE seq = 2")
    with pytest.raises(CatalogError, match=r"hash chain does not verify, so it cannot be adopted"):
        Catalog(url(db)).adopt_ledger(reason="please")


def test_concurrent_chargers_keep_the_chain_and_anchor_intact(
    tmp_path: Path, catalog_url: str
) -> None:
    Catalog(catalog_url).ensure_dataset("ds", cap=pure(100.0))  # on SQLite and on PostgreSQL
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{name}" for name in "abc"]
    chargers = [
        python("-c", CHARGER, catalog_url, name, str(flag), str(go), "8", "0.5")
        for name, flag in zip("abc", ready, strict=True)
    ]
    try:
        wait_for(ready, chargers)
        go.touch()
        outputs = [process.communicate(timeout=120) for process in chargers]
    finally:
        for process in chargers:
            if process.poll() is None:
                process.kill()
    assert all(p.returncode == 0 for p in chargers), [o[1] for o in outputs]
    catalog = Catalog(catalog_url)
    assert len(catalog.ledger_entries()) == 24
    assert catalog.verify_chain() == []
    anchor = catalog.key.read_anchor()
    assert anchor is not None and anchor.entries == 24
    assert anchor.head == catalog.chain_head().entry_hash


# --- migration of a catalog of the previous schema ---------------------------------------------------------

V1_SCHEMA = [
    "CREATE TABLE datasets (id VARCHAR(64) NOT NULL PRIMARY KEY, measure VARCHAR(16) NOT NULL,"
    " cap_epsilon FLOAT NOT NULL, cap_rho FLOAT NOT NULL, cap_delta FLOAT NOT NULL,"
    " created_at VARCHAR(40) NOT NULL)",
    "CREATE TABLE ledger (seq INTEGER NOT NULL PRIMARY KEY, receipt_id VARCHAR(64) NOT NULL UNIQUE,"
    " dataset_id VARCHAR(64) NOT NULL REFERENCES datasets (id), release_id VARCHAR(128) NOT NULL,"
    " label VARCHAR(256) NOT NULL, measure VARCHAR(16) NOT NULL, epsilon FLOAT NOT NULL,"
    " rho FLOAT NOT NULL, delta FLOAT NOT NULL, created_at VARCHAR(40) NOT NULL)",
    "CREATE TABLE releases (id VARCHAR(128) NOT NULL PRIMARY KEY, name VARCHAR(128) NOT NULL,"
    " dataset_id VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL,"
    " spec_fingerprint VARCHAR(64) NOT NULL, input_fingerprint VARCHAR(64), mechanism VARCHAR(32),"
    " directory TEXT, manifest_sha256 VARCHAR(64), published_directory TEXT,"
    " created_at VARCHAR(40) NOT NULL, updated_at VARCHAR(40) NOT NULL)",
    "CREATE TABLE reviews (seq INTEGER NOT NULL PRIMARY KEY, release_id VARCHAR(128) NOT NULL"
    " REFERENCES releases (id), decision VARCHAR(16) NOT NULL, reviewer VARCHAR(128) NOT NULL,"
    " note TEXT NOT NULL, at VARCHAR(40) NOT NULL)",
]


def make_v1_catalog(path: Path, *, charges: list[float]) -> None:
    """A catalog as the previous version wrote it (no chain columns, no schema marker)."""
    stamp = "2026-01-01T00:00:00.000000+00:00"
    sql(
        path,
        *V1_SCHEMA,
        f"INSERT INTO datasets VALUES ('ds', 'pure', 10.0, 0.0, 0.0, '{stamp}')",
        *(
            f"INSERT INTO ledger VALUES ({k + 1}, 'rcpt-old{k}', 'ds', 'old-{k}', 'old step {k}',"
            f" 'pure', {eps!r}, 0.0, 0.0, '{stamp}')"
            for k, eps in enumerate(charges)
        ),
        "INSERT INTO releases VALUES ('old-0', 'old', 'ds', 'staged', 'ffff', NULL, 'identity',"
        f" NULL, NULL, NULL, '{stamp}', '{stamp}')",
    )


def test_previous_version_catalog_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    make_v1_catalog(path, charges=[0.5, 1.25, 0.25])
    catalog = Catalog(url(path))
    assert catalog.spent("ds") == pure(2.0)
    entries = catalog.ledger_entries()
    assert [e.receipt_id for e in entries] == ["rcpt-old0", "rcpt-old1", "rcpt-old2"]
    assert [e.label for e in entries] == ["old step 0", "old step 1", "old step 2"]
    assert entries[0].prev_hash == GENESIS and all(e.entry_hash for e in entries)
    assert catalog.verify_chain() == []
    anchor = catalog.key.read_anchor()
    assert anchor is not None and (anchor.entries, anchor.head) == (3, entries[-1].entry_hash)
    record = catalog.release("old-0")
    assert record.status == "staged" and record.owner_pid is None and record.heartbeat_at is None
    receipt = catalog.charge("ds", pure(1.0), release_id="new", label="after migration")
    assert catalog.ledger_entries()[-1].receipt_id == receipt
    assert catalog.verify_chain() == []
    assert Catalog(url(path)).verify_chain() == []  # opening again does not migrate again
    connection = sqlite3.connect(path)
    marker = dict(connection.execute("SELECT key, value FROM catalog_meta").fetchall())
    connection.close()
    assert marker["schema"] == "dprelease-catalog" and marker["version"] == str(SCHEMA_VERSION)


def test_migrated_catalog_detects_later_tampering(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    make_v1_catalog(path, charges=[0.5, 0.5, 0.5])
    Catalog(url(path))
    sql(path, "DELETE FROM ledger WHERE seq = 2")
    assert_refused(path, r"ledger entry #3 .* does not follow entry #1")


# --- files that are not a catalog -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"name,age\nAda,36\n",
            r"catalog file .*catalog\.db is not an SQLite database; it was left unchanged",
        ),
        (b"\x00" * 4096, r"is not an SQLite database; it was left unchanged"),
        (
            b"SQLite format 3\x00" + b"\xff" * 4000,
            r"catalog sqlite:///.* is damaged and cannot be read .*; it was left unchanged",
        ),
    ],
    ids=["csv", "zeros", "sqlite-header-then-garbage"],
)
def test_corrupt_catalog_file_is_reported_and_left_unchanged(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "catalog.db"
    path.write_bytes(content)
    with pytest.raises(CatalogError, match=message):
        Catalog(url(path))
    assert path.read_bytes() == content
    assert not path.with_suffix(".key").exists()


def test_foreign_sqlite_database_is_reported_and_left_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    sql(
        path,
        "CREATE TABLE customers (id INTEGER, name TEXT)",
        "INSERT INTO customers VALUES (1, 'x')",
    )
    content = path.read_bytes()
    with pytest.raises(
        CatalogError,
        match=r"is not a dprelease catalog \(it holds other tables \(customers\)\); it was left unchanged",
    ):
        Catalog(url(path))
    assert path.read_bytes() == content


def test_database_with_a_table_named_like_ours_is_foreign(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    sql(path, *V1_SCHEMA[:1], "CREATE TABLE ledger (id INTEGER)", *V1_SCHEMA[2:])
    content = path.read_bytes()
    with pytest.raises(
        CatalogError, match=r"is not a dprelease catalog \(table ledger lacks columns"
    ):
        Catalog(url(path))
    assert path.read_bytes() == content


def test_catalog_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    Catalog(url(path))
    newer = SCHEMA_VERSION + 1
    sql(path, f"UPDATE catalog_meta SET value = '{newer}' WHERE key = 'version'")
    with pytest.raises(CatalogError, match=rf"has schema version {newer}, written by a newer"):
        Catalog(url(path))


def test_empty_file_and_auxiliary_tables_are_a_fresh_catalog(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    assert Catalog(url(empty)).dataset_ids() == []
    watched = tmp_path / "watched.db"
    sql(watched, "CREATE TABLE announced_files (fingerprint VARCHAR(64))")
    assert Catalog(url(watched)).verify_chain() == []


def test_catalog_key_id_is_what_the_anchor_names(db: Path) -> None:
    data = json.loads(db.with_suffix(".anchor").read_text())
    assert data["key_id"] == keys.catalog_key(url(db)).key_id
