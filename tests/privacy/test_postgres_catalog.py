"""What PostgreSQL needs beyond SQLite's guarantees: SQLite serialises every write transaction
(``BEGIN IMMEDIATE``), PostgreSQL runs them concurrently under READ COMMITTED.  So on PostgreSQL
the ledger locks its chain row, a review and a heartbeat lock the release row they read, and the
tables are created under an advisory lock.  Each test fails if that lock is taken away.

Privacy: without the chain row nothing would serialise two hosts' charges (overspend); a heartbeat
that does not see a concurrent ``recover`` lets a run that was declared dead go on drawing noise.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.chain import GENESIS
from dprelease.catalog.ledger.schema import catalog_meta, metadata, releases
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.watch_state import WatchState
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.pg_server import PostgresServer
from tests.privacy.test_ledger_concurrency import python, wait_for

BLOCKED = 1.0  # s: a call that waits on a row lock is still waiting after this long


def pure(epsilon: float) -> PrivacyCost:
    return PrivacyCost(measure="pure", epsilon=epsilon)


@pytest.fixture
def catalog(postgres_server: PostgresServer) -> Catalog:
    catalog = Catalog(postgres_server.create_database("catalog"))
    catalog.ensure_dataset("ds", cap=pure(5.0))
    catalog.create_release(
        release_id="rel-1", name="n", dataset_id="ds", spec_fingerprint="f" * 64, mechanism="m"
    )
    return catalog


def run_blocked(call: object) -> tuple[threading.Thread, list[BaseException | None]]:
    """Start ``call`` in a thread; returns the thread and where its outcome lands."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()  # type: ignore[operator]
            outcome.append(None)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BLOCKED)
    return thread, outcome


def test_charges_are_refused_when_the_chain_lock_row_is_missing(catalog: Catalog) -> None:
    with catalog.engine.begin() as conn:
        conn.execute(catalog_meta.delete().where(catalog_meta.c.key == "chain"))
    with pytest.raises(CatalogError, match=r"lacks its catalog_meta 'chain' row"):
        catalog.charge("ds", pure(0.5), release_id="rel-1", label="x")
    assert catalog.ledger_entries() == []


def test_a_heartbeat_waits_for_a_concurrent_recover_and_is_told_to_stop(catalog: Catalog) -> None:
    with catalog.engine.connect() as other:
        transaction = other.begin()  # recover, half-way: the release row is locked and moved
        other.execute(releases.update().where(releases.c.id == "rel-1").values(status="failed"))
        thread, outcome = run_blocked(lambda: catalog.heartbeat("rel-1"))
        assert thread.is_alive() and outcome == []  # waits on the row lock
        transaction.commit()
    thread.join(30)
    [error] = outcome
    assert isinstance(error, CatalogError)
    assert "is failed, not measuring: its lease ended" in str(error)


def test_of_two_concurrent_reviews_only_the_first_is_recorded(catalog: Catalog) -> None:
    catalog.update_release("rel-1", status="staged")
    with catalog.engine.connect() as other:
        transaction = other.begin()  # the first reviewer, half-way
        other.execute(
            sa.select(releases.c.status).where(releases.c.id == "rel-1").with_for_update()
        )
        second = lambda: catalog.record_review(  # noqa: E731
            "rel-1", decision="rejected", reviewer="second", note=""
        )
        thread, outcome = run_blocked(second)
        assert thread.is_alive() and outcome == []
        other.execute(releases.update().where(releases.c.id == "rel-1").values(status="approved"))
        transaction.commit()
    thread.join(30)
    [error] = outcome
    assert isinstance(error, CatalogError)
    assert "is approved; only a staged release can be reviewed" in str(error)
    assert catalog.reviews("rel-1") == []
    assert catalog.release("rel-1").status == "approved"


OPEN_FRESH = """
import sys, time
from pathlib import Path
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.watch_state import ReviewRuns, WatchState

url, ready, go = sys.argv[1:4]
Path(ready).touch()
deadline = time.monotonic() + 60
while not Path(go).exists():
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.0005)
Catalog(url)
WatchState(url)
ReviewRuns(url)
"""


def test_processes_opening_a_fresh_database_at_once_create_it_once(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = postgres_server.create_database("fresh")
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(4)]
    openers = [python("-c", OPEN_FRESH, url, str(flag), str(go)) for flag in ready]
    try:
        wait_for(ready, openers)
        time.sleep(0.2)  # every opener has imported and polls for the signal
        go.touch()
        outputs = [process.communicate(timeout=120) for process in openers]
    finally:
        for process in openers:
            if process.poll() is None:
                process.kill()
    assert [p.returncode for p in openers] == [0] * 4, [o[1][-2000:] for o in outputs]
    catalog = Catalog(url)
    assert catalog.verify_chain() == []
    names = set(sa.inspect(catalog.engine).get_table_names())
    assert {"catalog_meta", "ledger", "announced_files", "review_runs"} <= names
    assert WatchState(url).announcements() == []


# Columns a version-1 catalog lacks (added by schema versions 2 and 3).
NEWER_COLUMNS = {
    "datasets": ("partitioned_by",),
    "ledger": ("prev_hash", "entry_hash", "entry_kind", "partition_key"),
    "releases": (
        "owner_pid",
        "owner_host",
        "owner_start",
        "heartbeat_at",
        "interrupted_at",
        "series_key",
    ),
}


def test_a_version_1_catalog_on_postgresql_is_migrated_on_open(
    postgres_server: PostgresServer,
) -> None:
    """Version 1 as SQLAlchemy created it on PostgreSQL (SERIAL keys, no marker, no chain)."""
    url = postgres_server.create_database("v1")
    stamp = "2026-01-01T00:00:00.000000+00:00"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        metadata.create_all(conn)
        conn.exec_driver_sql("DROP TABLE catalog_meta")
        for table, columns in NEWER_COLUMNS.items():
            for column in columns:
                conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.exec_driver_sql(
            f"INSERT INTO datasets VALUES ('ds', 'pure', 10.0, 0.0, 0.0, '{stamp}')"
        )
        for k, eps in enumerate([0.5, 1.25, 0.25]):
            conn.exec_driver_sql(
                f"INSERT INTO ledger VALUES ({k + 1}, 'rcpt-old{k}', 'ds', 'old-{k}', 'old {k}',"
                f" 'pure', {eps!r}, 0.0, 0.0, '{stamp}')"
            )
        conn.exec_driver_sql(
            "INSERT INTO releases VALUES ('old-0', 'old', 'ds', 'staged', 'ffff', NULL,"
            f" 'identity', NULL, NULL, NULL, '{stamp}', '{stamp}')"
        )
    engine.dispose()

    catalog = Catalog(url)
    assert catalog.spent("ds") == pure(2.0)
    entries = catalog.ledger_entries()
    assert [e.receipt_id for e in entries] == ["rcpt-old0", "rcpt-old1", "rcpt-old2"]
    assert entries[0].prev_hash == GENESIS and all(e.entry_hash for e in entries)
    assert catalog.verify_chain() == []
    catalog.charge("ds", pure(1.0), release_id="new", label="after migration")
    catalog.record_review("old-0", decision="approved", reviewer="Ada", note="")  # SERIAL seq
    assert catalog.release("old-0").status == "approved"
    assert Catalog(url).verify_chain() == []  # opening again does not migrate again
    assert Catalog(url).spent("ds") == pure(3.0)


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://dprelease:secret@127.0.0.1:1/x", "psycopg2"),
        ("nosuch://dprelease:secret@127.0.0.1:1/x", "nosuch"),
    ],
    ids=["default-postgresql-driver", "unknown-dialect"],
)
def test_a_url_without_an_installed_driver_is_refused_without_its_password(
    url: str, driver: str
) -> None:
    with pytest.raises(
        CatalogError, match=r"needs a database driver that is not installed"
    ) as info:
        Catalog(url)
    message = str(info.value)
    assert driver in message and "postgresql+psycopg://" in message
    assert "secret" not in message and "***" in message
