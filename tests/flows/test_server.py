"""The shared local Prefect server (flows/server.py) with real processes on 127.0.0.1.

Every test runs ``flows.server`` in fresh subprocesses against its own state home (so no Prefect
settings context of the test session leaks in), waits with bounds, and stops by PID whatever it
started.  The migrated Prefect database is cached once per session (DPRELEASE_CACHE_DIR), so only
the first server start pays Prefect's migrations.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dprelease.catalog import processes
from dprelease.flows import server
from dprelease.flows.cli import app

pytestmark = pytest.mark.flow
ROOT = Path(__file__).resolve().parents[2]
CONNECT = "import json; from flows import server; c = server.connect(); print(json.dumps({'pid': c.record.pid, 'url': c.url, 'started': c.started}))"
EXIT_WAIT_SECONDS = 10.0  # a stopped server's last process has gone within this (bounded wait)
# for tests about finding, sharing or seeding a server, not about its processes: the validation
# service's import of Great Expectations (seconds of CPU) is left out
NO_SERVICE = {"DPRELEASE_VALIDATION_SERVICE": "off"}


@pytest.fixture(scope="session")
def template_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dprelease-cache")


@pytest.fixture
def home(tmp_path: Path, template_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state home for one test; every server recorded in it is stopped by PID afterwards."""
    state = tmp_path / "home"
    monkeypatch.setenv("DPRELEASE_HOME", str(state))
    monkeypatch.setenv("DPRELEASE_CACHE_DIR", str(template_cache))
    monkeypatch.delenv("PREFECT_HOME", raising=False)  # the server's Prefect home: state/prefect
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    _STARTED.clear()
    try:
        yield state
    finally:
        record = server.read_record(state) if state.exists() else None
        for each in [*_STARTED, *([record] if record else [])]:
            server.stop_processes(each, grace=5)
        for each in _STARTED:
            # a process past SIGTERM whose exit is still being torn down (its command line
            # already gone, so stop_processes no longer counts it) may linger a moment under load
            deadline = time.monotonic() + EXIT_WAIT_SECONDS
            while server.group_members(each.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not server.group_members(each.pid), "a server outlived its test"


_STARTED: list[server.ServerRecord] = []  # every server a test found or started, to stop after


def _connect(**env: str) -> dict[str, object]:
    """``server.connect()`` in a fresh process; the server it finds or starts is remembered."""
    result = subprocess.run(
        [sys.executable, "-c", CONNECT],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    record = server.read_record()
    assert record is not None and record.pid == found["pid"]
    _STARTED.append(record)
    return found


def test_second_command_reuses_the_server_and_stop_ends_it(home: Path) -> None:
    first = _connect()
    assert first["started"] is True
    record = server.read_record()
    assert record is not None
    assert record.url == f"http://127.0.0.1:{record.port}/api" and server.healthy(record.url)
    assert (
        record.prefect_home == str(home / "prefect") and record.version == server.prefect_version()
    )
    members = server.group_members(record.pid)
    # the supervisor, `prefect server start` and the validation service
    assert record.pid in members and len(members) == 3
    assert os.getsid(record.pid) == record.pid  # its own session: a terminal's Ctrl-C misses it

    again = _connect()
    assert again == {**first, "started": False}

    status = CliRunner().invoke(app, ["server", "status", "--json"])
    assert status.exit_code == 0, status.output
    shown = json.loads(status.stdout)
    assert shown["state"] == "running" and shown["pid"] == record.pid
    assert shown["processes"] == members and shown["stops_after_idle_at"] is not None

    stopped = CliRunner().invoke(app, ["server", "stop"])
    assert stopped.exit_code == 0 and f"(pid {record.pid})" in stopped.stdout
    assert server.group_members(record.pid) == []  # stop waits until the group is gone
    assert server.read_record() is None and not server.healthy(record.url)
    assert not server.validation_socket(home).exists()  # the service removed its socket


def test_the_validation_service_can_be_switched_off(home: Path) -> None:
    found = _connect(DPRELEASE_VALIDATION_SERVICE="off")
    pid = int(found["pid"])
    assert len(server.group_members(pid)) == 2  # the supervisor and `prefect server start` only
    assert not server.validation_socket(home).exists()
    log = (home / "logs" / "prefect-server.log").read_text()
    assert f"supervisor {pid}: validation service off (DPRELEASE_VALIDATION_SERVICE)" in log


def test_two_commands_starting_at_once_share_one_server(home: Path) -> None:
    env = {**os.environ, **NO_SERVICE}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", CONNECT],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    record = server.read_record()
    assert record is not None
    _STARTED.append(record)
    assert {r["pid"] for r in results} == {record.pid}
    assert sum(bool(r["started"]) for r in results) == 1


def test_stale_record_of_a_dead_process_is_replaced(home: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    home.mkdir(parents=True)
    stale = _record(pid=dead.pid, port=9, started_at=datetime.now(UTC) - timedelta(hours=2))
    (home / server.SERVER_FILE).write_text(json.dumps(stale.as_dict()))
    found = _connect(**NO_SERVICE)
    assert found["started"] is True and found["pid"] != dead.pid
    assert server.read_record() is not None and server.read_record().pid == found["pid"]


def test_orphan_alive_but_unhealthy_is_stopped_on_the_next_start(home: Path) -> None:
    # A process that looks like our supervisor (its command line names flows.server) but never
    # answers: what a server wedged by an earlier crash looks like.
    orphan = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(600)",
            "dprelease.flows.server",
            "supervise",
        ],
        start_new_session=True,
    )
    try:
        home.mkdir(parents=True)
        # the recorded port stays bound (never listening) while the command connects: no server
        # another test starts can take it and answer the health check in the orphan's place
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            wedged = _record(
                pid=orphan.pid,
                port=int(held.getsockname()[1]),
                started_at=datetime.now(UTC) - timedelta(hours=1),
            )
            (home / server.SERVER_FILE).write_text(json.dumps(wedged.as_dict()))
            found = _connect()
        assert found["started"] is True and found["pid"] != orphan.pid
        assert orphan.wait(timeout=30) == -signal.SIGTERM  # stopped by its process group
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait(timeout=30)


def test_a_live_process_that_is_not_ours_is_never_signalled(home: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        home.mkdir(parents=True)
        reused = _record(
            pid=bystander.pid,
            port=_unused_port(),
            started_at=datetime.now(UTC) - timedelta(hours=1),
        )
        (home / server.SERVER_FILE).write_text(json.dumps(reused.as_dict()))
        found = _connect(**NO_SERVICE)
        assert found["started"] is True
        assert bystander.poll() is None  # a reused pid: the record was dropped, the process kept
    finally:
        bystander.kill()
        bystander.wait(timeout=30)


def test_server_stops_itself_after_the_idle_time(home: Path) -> None:
    found = _connect(DPRELEASE_SERVER_IDLE_SECONDS="3")
    pid = int(found["pid"])
    deadline = time.monotonic() + 60
    while server.group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.group_members(pid) == []
    assert server.read_record() is None
    log = (home / "logs" / "prefect-server.log").read_text()
    assert f"supervisor {pid}: idle for 3 s; exiting" in log


def test_a_server_no_record_points_to_stops_itself(home: Path) -> None:
    # e.g. its starter was killed between launching it and writing server.json
    found = _connect(DPRELEASE_SERVER_IDLE_SECONDS="4")
    pid = int(found["pid"])
    (home / server.SERVER_FILE).unlink()
    deadline = time.monotonic() + 60
    while server.group_members(pid) and time.monotonic() < deadline:
        server.touch(home)  # in use: only the missing record can stop it
        time.sleep(0.2)
    assert server.group_members(pid) == []
    log = (home / "logs" / "prefect-server.log").read_text()
    assert f"supervisor {pid}: not recorded in {home / server.SERVER_FILE}; exiting" in log


def test_killing_the_supervisor_takes_the_server_with_it(home: Path) -> None:
    found = _connect()
    pid = int(found["pid"])
    members = server.group_members(pid)
    os.kill(pid, signal.SIGKILL)  # no clean-up code runs: the server must still not survive
    deadline = time.monotonic() + 30
    while any(processes.is_alive(m) for m in members) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(processes.is_alive(m) for m in members)
    again = _connect()  # the stale record is cleaned and a new server starts
    assert again["started"] is True and again["pid"] != pid


def test_a_configured_api_url_starts_nothing(home: Path) -> None:
    url = "http://127.0.0.1:9/api"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dprelease.flows import server; c = server.connect(); print(c.url, c.record)",
        ],
        env={**os.environ, "PREFECT_API_URL": url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [url, "None"]
    assert not (home / server.SERVER_FILE).exists()


def _record(*, pid: int, port: int, started_at: datetime) -> server.ServerRecord:
    return server.ServerRecord(
        pid=pid,
        port=port,
        url=f"http://127.0.0.1:{port}/api",
        started_at=started_at.isoformat(timespec="seconds"),
        version=server.prefect_version(),
        prefect_home=str(server.prefect_home()),
        log="/dev/null",
        idle_seconds=1800.0,
    )


def _unused_port() -> int:
    return server._free_port()


def test_prepare_migrates_once_and_a_new_home_starts_from_it(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dprelease server prepare`` (run by install.sh) leaves a migrated, empty Prefect database
    in the user cache; a second call keeps it; a new home's server starts from a copy."""
    import sqlite3

    cache = tmp_path / "new-machine-cache"
    monkeypatch.setenv("DPRELEASE_CACHE_DIR", str(cache))
    runner = CliRunner()
    first = runner.invoke(app, ["server", "prepare"])
    assert first.exit_code == 0, first.output
    template = cache / f"prefect-{server.prefect_version()}.db"
    assert f"prepared: {template}" in first.stdout
    with sqlite3.connect(template) as db:
        [(revision,)] = db.execute("SELECT version_num FROM alembic_version").fetchall()
        assert revision
        assert db.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)
    before = template.read_bytes()
    again = runner.invoke(app, ["server", "prepare"])
    assert again.exit_code == 0 and f"already prepared: {template}" in again.stdout
    assert template.read_bytes() == before
    started = _connect(DPRELEASE_CACHE_DIR=str(cache), **NO_SERVICE)
    assert started["started"] is True
    assert server.healthy(str(started["url"]))
    assert (home / "prefect" / "prefect.db").is_file()


NOTIFY_ROUND_TRIP = """
import json, os
from dprelease.flows import server
connection = server.connect()
os.environ["PREFECT_API_URL"] = connection.url  # read when prefect is imported
from prefect.client.orchestration import get_client
from dprelease.flows import notify
with get_client(sync_client=True) as client:
    before = sorted(t.slug for t in client.read_block_types())
reference = notify.save_webhook_block("reviewers", url="http://127.0.0.1:9/hook")
block = notify.load_notification_block(reference)
print(json.dumps({"before": before, "reference": reference, "loaded": type(block).__name__}))
"""


def test_the_shared_server_registers_no_block_types_and_a_saved_block_loads(home: Path) -> None:
    """The server starts without importing every Prefect collection to register block types
    (1.5-1.9 s of its start); the one block type dprelease uses registers itself when saved."""
    result = subprocess.run(
        [sys.executable, "-c", NOTIFY_ROUND_TRIP],
        env={k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")} | NO_SERVICE,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    record = server.read_record()
    if record is not None:
        _STARTED.append(record)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["before"] == []  # nothing registered at start
    assert found["reference"] == "custom-webhook/reviewers"
    assert found["loaded"] == "CustomWebhookNotificationBlock"
