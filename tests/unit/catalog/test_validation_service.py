"""The validation service (catalog/validation/service.py) as a real process on a Unix socket.

It must give exactly the summaries in-process validation gives, write the Data Docs where the
client asks, refuse nobody's release (every failure falls back to validating in the caller's
process), keep its socket private, and stop on SIGTERM or when its parent goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from dprelease.catalog.validation import gx
from dprelease.catalog.validation import service as validation_service
from dprelease.catalog.validation.checks import table_expectations

ROOT = Path(__file__).resolve().parents[3]
READY_SECONDS = 120.0  # GX's import on a busy 2-core machine


def _start(path: Path, *, parent_pid: int | None = None) -> subprocess.Popen[bytes]:
    """The service on ``path``, its log beside the socket (``<path>.log``)."""
    with open(f"{path}.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dprelease.catalog.validation.service",
                "--socket",
                str(path),
                "--parent-pid",
                str(os.getpid() if parent_pid is None else parent_pid),
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=log,
        )


def _wait_ready(path: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while not path.is_socket():
        assert process.poll() is None, Path(f"{path}.log").read_text()
        assert time.monotonic() < deadline, "the validation service never listened"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("vs") / "s.sock"
    process = _start(path)
    try:
        _wait_ready(path, process)
        yield path
    finally:
        process.terminate()
        try:
            process.wait(timeout=READY_SECONDS)  # it may still be answering on a loaded machine
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def _jobs() -> gx.Jobs:
    table = pa.table(
        {
            "v": [0, 1, 2],
            "estimate": [1.0, 2.0, 3.0],
            "std_error": [1.0, 1.0, 0.0],  # one failing row: a failure must travel back too
            "ci_low": [0.0, None, 2.0],
            "ci_high": [2.0, None, 4.0],
            "uncertainty": ["noise+bias", "noise-only", "noise+bias"],
        }
    )
    return [("released table", table.to_pandas(), table_expectations(table, expected_rows=3))]


def test_remote_summaries_and_docs_equal_in_process_validation(
    service: Path, tmp_path: Path
) -> None:
    remote = validation_service.validate_remotely(service, _jobs(), docs_dir=tmp_path / "r")
    local = gx.run_suites_here(_jobs(), docs_dir=tmp_path / "l")
    assert remote == local
    assert not remote["released table"]["success"]  # std_error 0 fails: the verdict came back
    assert (tmp_path / "r" / "index.html").is_file()  # the service wrote the client's docs
    assert stat.S_IMODE(service.stat().st_mode) == 0o600  # only its owner may connect
    log = Path(f"{service}.log").read_text()
    assert "Great Expectations loaded" in log
    # what a request leaves in the log: a count and a time, no value of any table
    assert re.search(r"validation service \d+: validated 1 suite\(s\) in \d+\.\d\d s\n", log)


def test_run_suites_uses_the_configured_service(
    service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(validation_service.SOCKET_ENV, str(service))
    assert validation_service.wait_for_socket(timeout=0) == service
    assert validation_service.run_suites(_jobs()) == gx.run_suites_here(_jobs())
    monkeypatch.setenv(validation_service.SOCKET_ENV, str(tmp_path / "absent.sock"))
    assert validation_service.wait_for_socket(timeout=0) is None  # no socket there: validate here


def test_every_service_failure_falls_back_to_this_process(
    service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dead = tmp_path / "dead.sock"  # a socket file nobody listens on (a killed service's)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(dead))
    with pytest.raises(validation_service.ServiceUnavailable, match="ConnectionRefusedError"):
        validation_service.validate_remotely(dead, _jobs(), docs_dir=None)
    monkeypatch.setenv(validation_service.SOCKET_ENV, str(dead))
    with caplog.at_level(logging.WARNING, logger="dprelease.catalog.validation.gx"):
        assert validation_service.run_suites(_jobs()) == gx.run_suites_here(_jobs())
    assert "validating in this process" in caplog.text

    # an error inside the service comes back as its type only; the caller then raises the real one
    broken = [("t", _jobs()[0][1], [("expect_no_such_thing", {"column": "estimate"})])]
    with pytest.raises(validation_service.ServiceUnavailable, match="AttributeError"):
        validation_service.validate_remotely(service, broken, docs_dir=None)
    monkeypatch.setenv(validation_service.SOCKET_ENV, str(service))
    with pytest.raises(AttributeError):
        validation_service.run_suites(broken)

    odd = [("t", _jobs()[0][1], [("expect_column_to_exist", {"column": object()})])]
    with pytest.raises(validation_service.ServiceUnavailable, match="not serialisable"):
        validation_service.validate_remotely(service, odd, docs_dir=None)


@contextlib.contextmanager
def _service_process(
    path: Path, *, parent_pid: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A service started for one test and killed afterwards if it is still running."""
    process = _start(path, parent_pid=parent_pid)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigterm_stops_the_service_and_removes_its_socket(tmp_path: Path) -> None:
    path = tmp_path / "t.sock"
    with _service_process(path) as process:
        _wait_ready(path, process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert not path.exists()


def test_a_service_whose_parent_is_gone_exits(tmp_path: Path) -> None:
    """Started with a parent pid that is not its parent (its supervisor died): it stops."""
    path = tmp_path / "o.sock"
    with _service_process(path, parent_pid=os.getpid() + 1_000_000) as process:
        assert process.wait(timeout=READY_SECONDS) == 0
        assert not path.exists()


def test_a_garbled_answer_is_a_service_failure(tmp_path: Path) -> None:
    """A peer that answers something other than the protocol's JSON line: validate here."""
    path = tmp_path / "g.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)

        def answer_garbage() -> None:
            connection, _ = listener.accept()
            with connection:
                while connection.recv(1 << 16):  # the whole request, up to the client's shutdown
                    pass
                connection.sendall(b"not json\n")

        thread = threading.Thread(target=answer_garbage)
        thread.start()
        with pytest.raises(validation_service.ServiceUnavailable, match="not JSON"):
            validation_service.validate_remotely(path, _jobs(), docs_dir=None)
        thread.join(timeout=10)


def test_a_command_waits_for_a_service_that_is_still_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While GX imports, the start marker names the service: commands do not give up (they wait,
    bounded) and validate there; after listen the marker is gone."""
    path = tmp_path / "w.sock"
    marker = Path(f"{path}.starting")
    monkeypatch.setenv(validation_service.SOCKET_ENV, str(path))
    # the command's bound (STARTUP_WAIT_SECONDS) is for one import on an idle machine; the suite's
    # parallel workers can make this import slower, so the test waits as long as _wait_ready does
    wait = validation_service.wait_for_socket
    monkeypatch.setattr(validation_service, "wait_for_socket", lambda: wait(timeout=READY_SECONDS))
    with _service_process(path) as process:
        deadline = time.monotonic() + READY_SECONDS
        while not marker.exists() and not path.is_socket():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert validation_service.expected()
        assert validation_service.run_suites(_jobs()) == gx.run_suites_here(_jobs())
        assert "validated 1 suite(s)" in Path(f"{path}.log").read_text()  # it went there
        assert not marker.exists()


def test_the_start_marker_appears_only_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that finds the marker reads this process's pid from it, never an empty file (the
    CI failure of a marker seen between its creation and its write)."""
    marker = tmp_path / "m.sock.starting"
    seen: list[tuple[bool, str]] = []
    replace = os.replace

    def observed(source: Path, target: Path) -> None:
        seen.append((Path(target).exists(), Path(source).read_text()))
        replace(source, target)

    monkeypatch.setattr(validation_service.os, "replace", observed)
    validation_service.write_start_marker(marker)
    assert seen == [(False, f"{os.getpid()}\n")]  # absent until it is renamed in whole
    assert marker.read_text() == f"{os.getpid()}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [marker.name]  # no partial file left


def test_a_stale_start_marker_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A marker left by a killed service, or naming a process that is not this socket's service,
    neither delays a command nor stops it from validating itself."""
    path = tmp_path / "k.sock"
    monkeypatch.setenv(validation_service.SOCKET_ENV, str(path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (dead.pid, os.getpid(), "not a pid"):
        Path(f"{path}.starting").write_text(f"{pid}\n")
        assert not validation_service.expected()
        started = time.monotonic()
        assert validation_service.wait_for_socket(timeout=60) is None
        assert time.monotonic() - started < 5  # no waiting for a service that is not there
    assert validation_service.run_suites(_jobs()) == gx.run_suites_here(_jobs())
