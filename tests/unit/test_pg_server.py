"""The PostgreSQL test server (tests/pg_server.py): missing binaries fail loudly with the install
command, and a server started for a session is gone, with its directory, when the session ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.pg_server import PostgresUnavailable, find_bin_dir, running_server


def test_missing_binaries_fail_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPRELEASE_PG_BIN", str(tmp_path))  # no initdb, no postgres here
    with pytest.raises(
        PostgresUnavailable, match=r"not found in \[.*\]: install .*apt-get install"
    ):
        find_bin_dir()


def test_a_server_is_stopped_by_pid_and_its_directory_removed() -> None:
    import psycopg

    with running_server() as server:
        assert server.process is not None
        pid, base = server.process.pid, server.base
        url = server.create_database("probe")
        with psycopg.connect(server.dsn(url.rsplit("/", 1)[1])) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not base.exists()
