"""A real PostgreSQL server for the test session (and the benchmark): 127.0.0.1, a free port, a
temporary data directory, stopped by PID.

Debian's ``postgresql`` package provides the binaries (``/usr/lib/postgresql/<version>/bin``;
``.ci/run`` installs it when missing, or set ``DPRELEASE_PG_BIN``).  Missing binaries make the
tests that need the server FAIL with a message saying how to install them: they are never skipped.

``initdb`` and ``postgres`` refuse to run as root: as root both run as the ``postgres`` user (or
``nobody``), which owns the temporary directory.  Every wait is bounded; the server log is kept
and quoted in every failure message.  Authentication is ``trust`` on loopback only.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

START_TIMEOUT = 90.0  # s: initdb + first start on a loaded 2-core machine
STOP_TIMEOUT = 30.0
SUPERUSER = "dprelease"
# enough for a test session's short-lived engines plus the concurrency tests' processes
MAX_CONNECTIONS = 300
INSTALL_HINT = (
    "install PostgreSQL's server binaries (Debian: `apt-get install -y postgresql`, as .ci/run "
    "does) or point DPRELEASE_PG_BIN at the directory holding initdb and postgres"
)


class PostgresUnavailable(RuntimeError):
    """The server binaries are missing or the server did not start (the message says why)."""


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres`` (newest Debian version first)."""
    configured = os.environ.get("DPRELEASE_PG_BIN")
    if configured:  # what the user named, and nothing else
        candidates = [configured]
    else:
        candidates = sorted(
            glob.glob("/usr/lib/postgresql/*/bin"),
            key=lambda p: int(Path(p).parent.name),
            reverse=True,
        )
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        directory = Path(candidate)
        if (directory / "initdb").is_file() and (directory / "postgres").is_file():
            return directory
    raise PostgresUnavailable(
        f"PostgreSQL server binaries (initdb, postgres) not found in {candidates or 'any place'}: "
        + INSTALL_HINT
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _unprivileged_user() -> pwd.struct_passwd | None:
    """Who runs the server when we are root (PostgreSQL refuses root); None when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailable("running as root, and neither user 'postgres' nor 'nobody' exists")


@dataclass
class PostgresServer:
    """One running server; :meth:`create_database` gives each test its own database."""

    bin_dir: Path
    base: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    user: pwd.struct_passwd | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def log_path(self) -> Path:
        return self.base / "server.log"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no server log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def url(self, database: str, *, driver: str = "psycopg") -> str:
        return f"postgresql+{driver}://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    # --- lifecycle -------------------------------------------------------------------------------
    def _run_as(self) -> dict[str, object]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def initdb(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        with open(self.log_path, "ab") as log:
            if self.user is not None:
                os.fchown(log.fileno(), self.user.pw_uid, self.user.pw_gid)
            initdb = subprocess.run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                cwd=self.base,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT,
                check=False,
                **self._run_as(),  # type: ignore[arg-type]
            )
            if initdb.returncode != 0:
                raise PostgresUnavailable(
                    f"initdb failed (exit code {initdb.returncode}):\n{self.log_tail()}"
                )

    def start(self) -> None:
        """Start the server on ``port`` and wait until it accepts connections."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.bin_dir / "postgres"),
                    "-D",
                    str(self.data_dir),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.base),
                    "-c",
                    f"max_connections={MAX_CONNECTIONS}",
                    "-c",
                    "shared_buffers=32MB",
                ],
                cwd=self.base,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of pytest does not hit the server first
                **self._run_as(),  # type: ignore[arg-type]
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise PostgresUnavailable(
                    f"postgres exited with code {self.process.returncode} while starting on port "
                    f"{self.port}:\n{self.log_tail()}"
                )
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=5):
                    return
            except psycopg.OperationalError as exc:
                last_error = exc
                time.sleep(0.1)
        self.stop()
        raise PostgresUnavailable(
            f"postgres did not accept connections on 127.0.0.1:{self.port} within "
            f"{START_TIMEOUT:g} s ({last_error}):\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then immediate (SIGQUIT), then SIGKILL; bounded waits."""
        process = self.process
        if process is None:
            return
        for sig, wait in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 10.0)):
            if process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=wait)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the postmaster and its backends
            process.wait(timeout=10)
        self.process = None

    # --- databases -------------------------------------------------------------------------------
    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database}"

    def create_database(self, prefix: str = "db") -> str:
        """A new empty database; returns its SQLAlchemy URL (``postgresql+psycopg://``)."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextlib.contextmanager
def running_server(base: Path | None = None) -> Iterator[PostgresServer]:
    """Start a server in ``base`` (a new temporary directory by default), stop it on exit."""
    bin_dir = find_bin_dir()
    user = _unprivileged_user()
    owned = base is None
    if base is None:
        # as root the server's user must reach the directory: not under root's private $TMPDIR
        parent = "/tmp" if user is not None and os.path.isdir("/tmp") else None
        base = Path(tempfile.mkdtemp(prefix="dprelease-pg-", dir=parent))
    server = PostgresServer(bin_dir=bin_dir, base=base, port=free_port(), user=user)
    try:
        server.initdb()
        try:
            server.start()
        except PostgresUnavailable:
            if "could not bind" not in server.log_tail():
                raise
            server.stop()
            server.port = free_port()  # another process took the port between probe and bind
            server.start()
        yield server
    finally:
        server.stop()
        if owned:
            shutil.rmtree(base, ignore_errors=True)


# --- pytest fixtures (imported into tests/conftest.py) ----------------------------------------------
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session; a failure to start fails the test."""
    try:
        with running_server() as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.fail(f"the PostgreSQL test server is unavailable: {exc}", pytrace=False)


@pytest.fixture(params=BACKENDS)
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty catalog URL on each backend: SQLite in ``tmp_path``, a new PostgreSQL
    database on the session's server (started on first use)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/catalog.db"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database("catalog")
