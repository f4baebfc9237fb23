"""No stuck state: a release whose process died leaves ``measuring`` through ``recover``, charges kept.

Privacy: recovery never refunds; a failed or aborted release keeps every charge it made (the noise
may have been drawn).  Kill tests run a real process that registers a release, charges the ledger
and is killed with SIGKILL (no cleanup runs); recovery then finds its pid gone on this host.
Every test runs on SQLite and on a real PostgreSQL server (the ``catalog_url`` fixture).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.leases import ReleaseRecord
from dprelease.catalog.ledger.store import Catalog
from dprelease.flows.cli import app
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.privacy.test_ledger_concurrency import python

LEASE = 60.0

MEASURING_THEN_HANG = """
import sys, time
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost

catalog = Catalog(sys.argv[1])
catalog.create_release(
    release_id=sys.argv[2], name="n", dataset_id="ds", spec_fingerprint="f" * 64, mechanism="identity"
)
catalog.charge("ds", PrivacyCost(measure="pure", epsilon=0.5), release_id=sys.argv[2], label="measure")
if sys.argv[3] == "interrupted":
    catalog.mark_interrupted(sys.argv[2])
print("measuring", flush=True)
time.sleep(600)
"""


def pure(epsilon: float) -> PrivacyCost:
    return PrivacyCost(measure="pure", epsilon=epsilon)


@pytest.fixture
def catalog(catalog_url: str) -> Catalog:
    catalog = Catalog(catalog_url)
    catalog.ensure_dataset("ds", cap=pure(5.0))
    return catalog


def measuring(catalog: Catalog, release_id: str = "rel-1") -> ReleaseRecord:
    catalog.create_release(
        release_id=release_id,
        name="n",
        dataset_id="ds",
        spec_fingerprint="f" * 64,
        mechanism="identity",
    )
    catalog.charge("ds", pure(0.5), release_id=release_id, label="measure")
    return catalog.release(release_id)


def later(record: ReleaseRecord, seconds: float) -> datetime:
    last = max(datetime.fromisoformat(s) for s in (record.updated_at, str(record.heartbeat_at)))
    return last + timedelta(seconds=seconds)


def start_measuring(
    catalog: Catalog, release_id: str, mode: str = "plain"
) -> subprocess.Popen[str]:
    process = python("-c", MEASURING_THEN_HANG, catalog.url, release_id, mode)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "measuring", process.stderr.read() if process.stderr else ""
    return process


# --- leases with a fake clock ------------------------------------------------------------------------


def test_release_records_its_owner_and_a_heartbeat(catalog: Catalog) -> None:
    record = measuring(catalog)
    assert record.owner_pid == os.getpid()
    assert record.owner_host == socket.gethostname()
    assert record.heartbeat_at is not None


def test_expired_lease_moves_the_release_to_failed_and_keeps_its_charges(catalog: Catalog) -> None:
    record = measuring(catalog)
    ledger_before = catalog.ledger_entries()
    assert catalog.recover(now=later(record, LEASE - 1), lease_seconds=LEASE) == []
    assert catalog.release("rel-1").status == "measuring"
    [moved] = catalog.recover(now=later(record, LEASE + 1), lease_seconds=LEASE)
    assert (moved.release_id, moved.previous_status, moved.status) == (
        "rel-1",
        "measuring",
        "failed",
    )
    assert moved.reason == "no sign of life for 61 s (lease 60 s)"
    assert moved.charges == 1
    assert catalog.release("rel-1").status == "failed"
    assert catalog.ledger_entries() == ledger_before
    assert catalog.spent("ds") == pure(0.5)
    assert catalog.recover(now=later(record, 10 * LEASE), lease_seconds=LEASE) == []  # once


def test_each_charge_is_a_sign_of_life_of_the_release_it_charges(catalog: Catalog) -> None:
    record = measuring(catalog)
    catalog.charge("ds", pure(0.1), release_id="rel-1", label="measure")
    charged = catalog.release("rel-1")
    assert str(charged.heartbeat_at) > str(record.heartbeat_at)
    catalog.charge_each("ds", {None: pure(0.1)}, release_id="rel-1", label="measure")
    assert str(catalog.release("rel-1").heartbeat_at) > str(charged.heartbeat_at)


def test_heartbeat_renews_the_lease(catalog: Catalog) -> None:
    record = measuring(catalog)
    catalog.heartbeat("rel-1")
    renewed = catalog.release("rel-1")
    assert str(renewed.heartbeat_at) > str(record.heartbeat_at)
    assert catalog.recover(now=later(renewed, LEASE - 1), lease_seconds=LEASE) == []
    assert len(catalog.recover(now=later(renewed, LEASE + 1), lease_seconds=LEASE)) == 1


def test_a_recovered_run_is_told_to_stop_at_its_next_heartbeat(catalog: Catalog) -> None:
    record = measuring(catalog)
    catalog.recover(now=later(record, LEASE + 1), lease_seconds=LEASE)
    with pytest.raises(
        CatalogError, match=r"release 'rel-1' is failed, not measuring: its lease ended"
    ):
        catalog.heartbeat("rel-1")
    with pytest.raises(CatalogError, match=r"release 'ghost' is not in the catalog"):
        catalog.heartbeat("ghost")


def test_interrupted_release_is_recovered_as_aborted(catalog: Catalog) -> None:
    measuring(catalog)
    catalog.mark_interrupted("rel-1")
    record = catalog.release("rel-1")
    [moved] = catalog.recover(now=later(record, LEASE + 1), lease_seconds=LEASE)
    assert moved.status == "aborted"
    assert catalog.release("rel-1").status == "aborted"
    assert catalog.spent("ds") == pure(0.5)


def test_only_measuring_releases_are_recovered(catalog: Catalog) -> None:
    record = measuring(catalog)
    for status in ("staged", "approved", "failed"):
        catalog.update_release("rel-1", status=status)
        assert catalog.recover(now=later(record, 100 * LEASE), lease_seconds=LEASE) == []
        assert catalog.release("rel-1").status == status


def test_release_of_another_host_waits_for_its_lease(catalog: Catalog) -> None:
    measuring(catalog)
    catalog.update_release("rel-1", owner_host="another-host", owner_pid=2**22 + 7)
    record = catalog.release("rel-1")
    assert catalog.recover(now=later(record, LEASE - 1), lease_seconds=LEASE) == []
    assert len(catalog.recover(now=later(record, LEASE + 1), lease_seconds=LEASE)) == 1


def test_reused_pid_counts_as_gone(catalog: Catalog) -> None:
    measuring(catalog)
    catalog.update_release("rel-1", owner_start="1")  # this pid, but another process's start time
    [moved] = catalog.recover(lease_seconds=LEASE)
    assert moved.reason == f"its process {os.getpid()} on {socket.gethostname()} is gone"


def test_live_owner_within_its_lease_is_left_alone(catalog: Catalog) -> None:
    measuring(catalog)
    assert catalog.recover(lease_seconds=LEASE) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease_seconds": 0}, r"lease_seconds \(0\) must be > 0"),
        ({"lease_seconds": float("nan")}, r"lease_seconds \(nan\) must be > 0"),
        ({"now": datetime(2026, 1, 1)}, r"now \(2026-01-01T00:00:00\) must carry a time zone"),
    ],
    ids=["zero-lease", "nan-lease", "naive-clock"],
)
def test_recover_arguments_are_checked(catalog: Catalog, kwargs: dict, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        catalog.recover(**kwargs)


# --- kill tests: a real process killed with SIGKILL ----------------------------------------------------


def test_killed_process_release_moves_to_failed_with_its_charges(catalog: Catalog) -> None:
    process = start_measuring(catalog, "killed-1")
    try:
        assert catalog.recover(lease_seconds=3600) == []  # alive: left alone
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert catalog.release("killed-1").status == "measuring"  # nothing ran on the way out
    [moved] = catalog.recover(lease_seconds=3600)  # the lease has not expired: the pid is gone
    assert moved.release_id == "killed-1" and moved.status == "failed"
    assert moved.reason == f"its process {process.pid} on {socket.gethostname()} is gone"
    assert moved.charges == 1
    assert catalog.release("killed-1").status == "failed"
    assert catalog.spent("ds") == pure(0.5)
    assert catalog.verify_chain() == []


def test_killed_unreaped_process_counts_as_gone(catalog: Catalog) -> None:
    """A killed child its parent has not waited for yet is a zombie: it still has a pid."""
    process = start_measuring(catalog, "zombie-1", "interrupted")
    try:
        process.send_signal(signal.SIGKILL)
        deadline = datetime.now(UTC) + timedelta(seconds=30)
        while Path(f"/proc/{process.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert datetime.now(UTC) < deadline, "the child did not die"
            time.sleep(0.01)
        [moved] = catalog.recover(lease_seconds=3600)
        assert (moved.release_id, moved.status) == ("zombie-1", "aborted")  # it recorded Ctrl-C
    finally:
        process.kill()
        process.communicate()
    assert catalog.spent("ds") == pure(0.5)


def test_recover_command_reports_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, catalog_url: str
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    if catalog_url.startswith("sqlite"):
        monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
        expected = f"sqlite:///{home}/catalog.db"  # the default catalog, in $DPRELEASE_HOME
    else:
        monkeypatch.setenv("DPRELEASE_CATALOG_URL", catalog_url)
        expected = catalog_url
    catalog = Catalog()
    assert catalog.url == expected
    catalog.ensure_dataset("ds", cap=pure(5.0))
    process = start_measuring(catalog, "killed-cli")
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    measuring(catalog, "approved-1")
    catalog.update_release("approved-1", status="approved")
    result = CliRunner().invoke(app, ["recover", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["release_id"] for r in report["recovered"]] == ["killed-cli"]
    assert report["recovered"][0]["status"] == "failed"
    assert report["recovered"][0]["charges"] == 1
    assert report["unfinished_publications"] == ["approved-1"]
    assert report["ledger_problems"] == []
    again = CliRunner().invoke(app, ["recover"])
    assert again.exit_code == 0 and "approved-1: approved, publication unfinished" in again.stdout
