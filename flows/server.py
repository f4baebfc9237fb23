"""One local Prefect server shared by every ``dprelease`` command.

The first command that needs Prefect starts ``prefect server start`` on 127.0.0.1 under a
supervisor (``python -m dprelease.flows.server supervise``) that leads its own session, so Ctrl-C
never reaches it; later commands find it through ``$DPRELEASE_HOME/server.json`` and
``/api/health``.  Commands touch ``server.last-used``; the supervisor stops the server after
``DPRELEASE_SERVER_IDLE_SECONDS`` (default 1800) untouched.  Start-up and clean-up hold an
``fcntl`` lock on ``server.lock``; an orphan (alive but unhealthy past its start-up window, or of
another Prefect version or home) is stopped by process group, a stale record removed.

* A user's ``PREFECT_API_URL`` (or an active Prefect settings context) is used; nothing starts.
* One server per database: ``deploy/start-server.sh``'s server on the same ``PREFECT_HOME``
  (``deploy-server.json``) is used instead, and that script refuses to start beside this one.
* The supervisor also runs ``python -m dprelease.catalog.validation.service`` (GX imported once
  per home, on :func:`validation_socket`); a command without it validates in its own process.
* No block types are registered at start (that imports every Prefect collection).
* A migrated, empty Prefect database is cached once per Prefect version (``DPRELEASE_CACHE_DIR``,
  default ``$XDG_CACHE_HOME/dprelease``) and copied into new homes: migrations take tens of seconds.

Standard library only (plus ``catalog.home`` and ``catalog.processes``): the supervisor stays small.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from dprelease.catalog.home import default_home
from dprelease.catalog.processes import (
    command_line,
    is_alive,
    live_processes,
    process_start,
    procfs_available,
)

SERVER_FILE = "server.json"
LOCK_FILE = "server.lock"
LAST_USED_FILE = "server.last-used"
DEPLOY_SERVER_FILE = "deploy-server.json"  # in PREFECT_HOME, written by deploy/start-server.sh
DEFAULT_IDLE_SECONDS = 1800.0
DEFAULT_START_TIMEOUT = 180.0  # a fresh Prefect database migrates for tens of seconds
STOP_GRACE_SECONDS = 10.0
HEALTH_REQUEST_SECONDS = 2.0
# A recorded server past its start-up window gets this long to answer before it counts as an
# orphan: a busy but working server (SQLite under load) must not be killed under another command.
ORPHAN_PATIENCE_SECONDS = 10.0
SUPERVISOR_MARKER = "dprelease.flows.server"
VALIDATION_MARKER = "dprelease.catalog.validation.service"  # the GX service beside the server
VALIDATION_SOCKET_FILE = "validation.sock"
VALIDATION_SOCKET_ENV = "DPRELEASE_VALIDATION_SOCKET"  # read by catalog.validation.service
VALIDATION_SERVICE_ENV = "DPRELEASE_VALIDATION_SERVICE"  # "off": no service beside the server
MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes on Linux
MAX_LOG_BYTES = 5_000_000
UNRECORDED_GRACE_SECONDS = 30.0  # a supervisor missing from server.json this long stops
# Either names a database server: no Prefect database file of ours to migrate or seed.
DATABASE_URL_SETTINGS = (
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",
)


class ServerError(RuntimeError):
    """The shared Prefect server could not be started or reached (an environment problem)."""


@dataclass(frozen=True, kw_only=True)
class ServerRecord:
    """What ``server.json`` holds about the running server."""

    pid: int  # the supervisor: leader of the server's process group
    port: int
    url: str  # the API URL, ``http://127.0.0.1:PORT/api``
    started_at: str  # ISO 8601, UTC
    version: str  # Prefect's version
    prefect_home: str
    log: str
    idle_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class ServerStatus:
    """``dprelease server status``: ``state`` is running, starting, unhealthy, stale, stopped,
    external (a user-configured ``PREFECT_API_URL``) or deploy (``deploy/start-server.sh``'s server
    on this Prefect home, used instead of starting one)."""

    state: str
    url: str | None
    record: ServerRecord | None = None
    processes: tuple[int, ...] = ()
    last_used_at: str | None = None
    stops_after_idle_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "url": self.url,
            **({} if self.record is None else self.record.as_dict()),
            "processes": list(self.processes),
            "last_used_at": self.last_used_at,
            "stops_after_idle_at": self.stops_after_idle_at,
        }


def state_home() -> Path:
    """``$DPRELEASE_HOME`` (default ``./.dprelease``), created."""
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    return home


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or state_home() / "prefect").resolve()


def idle_seconds() -> float:
    return _positive_env("DPRELEASE_SERVER_IDLE_SECONDS", DEFAULT_IDLE_SECONDS)


def start_timeout() -> float:
    return _positive_env("DPRELEASE_SERVER_START_TIMEOUT", DEFAULT_START_TIMEOUT)


def _positive_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ServerError(f"{name} ({raw!r}) must be a finite number of seconds > 0")
    return value


def prefect_version() -> str:
    return metadata.version("prefect")


def configured_api_url() -> str | None:
    """The Prefect API the user configured: ``PREFECT_API_URL`` in the environment, or the active
    settings context when prefect is already imported (a test harness).  None: use ours."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    if "prefect.settings" in sys.modules:
        from prefect.settings import get_current_settings

        configured = get_current_settings().api.url
        return str(configured) if configured else None
    return None


def _template_db() -> Path:
    cache: str | Path | None = os.environ.get("DPRELEASE_CACHE_DIR")
    if not cache:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dprelease"
    return Path(cache) / f"prefect-{prefect_version()}.db"


def read_record(home: Path | None = None) -> ServerRecord | None:
    path = (home or state_home()) / SERVER_FILE
    try:
        data = json.loads(path.read_text())
        return ServerRecord(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):  # half-written or foreign: says nothing usable
        path.unlink(missing_ok=True)
        return None


def _write_record(home: Path, record: ServerRecord) -> None:
    path = home / SERVER_FILE
    tmp = path.with_name(f".{SERVER_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.as_dict(), indent=2) + "\n")
    os.replace(tmp, path)


def _remove_record(home: Path, pid: int) -> None:
    """Remove ``server.json`` if it still describes the server led by ``pid``."""
    current = read_record(home)
    if current is not None and current.pid == pid:
        (home / SERVER_FILE).unlink(missing_ok=True)


def touch(home: Path | None = None) -> None:
    """Record a use of the server (the idle clock restarts)."""
    ((home or state_home()) / LAST_USED_FILE).touch()


def _last_used(home: Path) -> float | None:
    try:
        return (home / LAST_USED_FILE).stat().st_mtime
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _locked(home: Path, *, timeout: float, blocking: bool = True) -> Iterator[bool]:
    """Hold the exclusive server lock (True), or yield False if ``blocking`` is off and it is busy."""
    with open(home / LOCK_FILE, "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not blocking:
                    yield False
                    return
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"another dprelease command held {home / LOCK_FILE} for {timeout:.0f} s "
                        "while starting the Prefect server; run `dprelease server status`"
                    ) from None
                time.sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (Linux ``/proc``; elsewhere the leader if alive)."""
    if not procfs_available():  # pragma: no cover - no procfs
        return [pgid] if is_alive(pgid) else []
    return sorted(pid for pid, fields in live_processes() if fields[2] == str(pgid))


def _is_ours(pid: int, port: int) -> bool:
    """The process is our supervisor or the Prefect server it started on ``port`` (pid reuse)."""
    line = command_line(pid)
    if not line:
        return not procfs_available()  # no procfs: trust the record
    return (
        SUPERVISOR_MARKER in line
        or VALIDATION_MARKER in line
        or ("prefect" in line and f"--port {port}" in line)
    )


def _our_members(record: ServerRecord) -> list[int]:
    return [pid for pid in group_members(record.pid) if _is_ours(pid, record.port)]


def terminate(
    alive: Callable[[], list[int]],
    *,
    grace: float,
    send: Callable[[list[int], int], None] | None = None,
) -> bool:
    """SIGTERM the processes ``alive()`` lists, then SIGKILL those left after ``grace`` seconds;
    True once none is left.  ``send(pids, signum)`` signals them (default: each pid)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        pids = alive()
        if not pids:
            return True
        (send or _signal_each)(pids, signum)
        deadline = time.monotonic() + grace
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    return not alive()


def _signal_each(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def stop_processes(record: ServerRecord, *, grace: float = STOP_GRACE_SECONDS) -> bool:
    """Stop the server's process group (SIGTERM, then SIGKILL after ``grace``); True if it ran."""
    if not _our_members(record):
        return False

    def signal_group(members: list[int], signum: int) -> None:
        try:
            os.killpg(record.pid, signum)
        except (ProcessLookupError, PermissionError):
            _signal_each(members, signum)  # the group is gone or not ours as a whole

    terminate(lambda: _our_members(record), grace=grace, send=signal_group)
    return True


def healthy(url: str, *, timeout: float = HEALTH_REQUEST_SECONDS) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return response.status == 200 and response.read().strip() == b"true"
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _wait_healthy(url: str, pid: int, seconds: float) -> bool:
    """Poll ``url`` until healthy (True), ``pid`` died or ``seconds`` passed (False)."""
    until = time.monotonic() + seconds
    while True:
        if healthy(url):
            return True
        if not is_alive(pid) or time.monotonic() >= until:
            return False
        time.sleep(0.1)


def _iso(timestamp: float | None = None) -> str:
    """``timestamp`` (epoch seconds; default now) in ISO 8601, UTC, to the second."""
    moment = datetime.now(UTC) if timestamp is None else datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="seconds")


def _started_seconds_ago(record: ServerRecord) -> float:
    try:
        started = datetime.fromisoformat(record.started_at)
    except ValueError:
        return float("inf")
    return (datetime.now(UTC) - started).total_seconds()


@dataclass
class Connection:
    """A started or found server; ``wait()`` blocks until it is healthy (bounded)."""

    record: ServerRecord | None  # None: a user-configured API (``url``)
    url: str
    started: bool = False  # this command started it
    _home: Path | None = None
    _pending: bool = False  # started and not yet seen healthy
    _fresh_db: bool = False

    def wait(self) -> Connection:
        if not self._pending or self.record is None or self._home is None:
            return self
        if not _wait_healthy(self.record.url, self.record.pid, start_timeout()):
            with _locked(self._home, timeout=STOP_GRACE_SECONDS * 3):
                stop_processes(self.record)
                _remove_record(self._home, self.record.pid)
            raise ServerError(
                f"the local Prefect server did not become healthy within {start_timeout():.0f} s "
                f"(DPRELEASE_SERVER_START_TIMEOUT); its log: {self.record.log}"
            )
        self._pending = False
        if self._fresh_db:
            _save_template(Path(self.record.prefect_home) / "prefect.db")
        touch(self._home)
        return self


def deploy_server(phome: Path | None = None) -> tuple[int, str] | None:
    """(pid, API URL) of the server ``deploy/start-server.sh`` runs on this Prefect home's
    database, if its recorded process still runs; None otherwise.  Not waited for: a caller that
    needs it healthy polls :func:`healthy`."""
    where = phome or prefect_home()
    try:
        data = json.loads((where / DEPLOY_SERVER_FILE).read_text())
        pid, start, url = int(data["pid"]), str(data["start"]), str(data["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not is_alive(pid) or process_start(pid) != start:  # no procfs: no start, never ours
        return None
    if "server start" not in (command_line(pid) or ""):
        return None
    return pid, url


def connect(*, wait: bool = True) -> Connection:
    """The Prefect API for this command: the user's, or the shared local server (started if needed).

    With ``wait=False`` a server this call starts is not waited for: call ``Connection.wait()``
    before the first Prefect call.  The lock covers finding, cleaning and launching only: a
    command that comes meanwhile finds the recorded server and waits for it in its start-up window.
    """
    configured = configured_api_url()
    if configured:
        return Connection(record=None, url=configured)
    home = state_home()
    os.environ[VALIDATION_SOCKET_ENV] = str(validation_socket(home))
    with _locked(home, timeout=start_timeout() + STOP_GRACE_SECONDS * 3):
        found = _reuse(home)
        if found is not None:
            return Connection(record=found, url=found.url, _home=home)
        deployed = deploy_server(phome := prefect_home())
        if deployed is not None:
            pid, url = deployed  # it may still be migrating a fresh database
            if not _wait_healthy(url, pid, start_timeout()):
                raise ServerError(
                    f"the Prefect server of deploy/start-server.sh (pid {pid}) on this database "
                    f"({phome}) does not answer at {url}; see its log in $DPRELEASE_HOME/run"
                )
            return Connection(record=None, url=url)
        connection = _start(home)
    return connection.wait() if wait else connection


def _reuse(home: Path) -> ServerRecord | None:
    """The recorded server if it is (or becomes, while still in its start-up window) healthy;
    otherwise clean up after it (orphan, stale file, other Prefect version or home) and None."""
    record = read_record(home)
    if record is None:
        return None
    compatible = record.version == prefect_version() and record.prefect_home == str(prefect_home())
    if compatible and is_alive(record.pid) and _is_ours(record.pid, record.port):
        remaining = start_timeout() - _started_seconds_ago(record)
        if _wait_healthy(record.url, record.pid, max(remaining, ORPHAN_PATIENCE_SECONDS)):
            touch(home)
            return record
    stop_processes(record)
    _remove_record(home, record.pid)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(home: Path) -> Connection:
    phome = prefect_home()
    phome.mkdir(parents=True, exist_ok=True)
    database = phome / "prefect.db"
    own_database = not any(map(os.environ.get, DATABASE_URL_SETTINGS))
    fresh_db = own_database and not database.exists() and not _restore_template(database)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "prefect-server.log"
    if log.exists() and log.stat().st_size > MAX_LOG_BYTES:
        os.replace(log, log.with_suffix(".log.old"))
    port = _free_port()
    idle = idle_seconds()
    command = [sys.executable, "-m", "dprelease.flows.server", "supervise", "--port", str(port)]
    command += ["--home", str(home), "--idle-seconds", repr(idle)]
    env = {
        **os.environ,
        "PREFECT_HOME": str(phome),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_UI_ENABLED": "false",
        # no block-type registration at start (module docstring); a saved block registers its type
        "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
        "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
        "PREFECT_SERVER_LOGGING_LEVEL": os.environ.get("PREFECT_SERVER_LOGGING_LEVEL", "WARNING"),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p
        ),
    }
    env.pop("PREFECT_API_URL", None)
    with open(log, "ab") as log_file:
        launcher = subprocess.run(
            command,
            env=env,
            cwd=home,  # not the user's folder: its .env / prefect.toml must not shape a shared server
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
            timeout=60,
            check=False,
        )
    try:
        pid = int(launcher.stdout.decode().strip())
    except ValueError:
        raise ServerError(
            f"could not start the local Prefect server (exit {launcher.returncode}); its log: {log}"
        ) from None
    record = ServerRecord(
        pid=pid,
        port=port,
        url=f"http://127.0.0.1:{port}/api",
        started_at=_iso(),
        version=prefect_version(),
        prefect_home=str(phome),
        log=str(log),
        idle_seconds=idle,
    )
    _write_record(home, record)
    touch(home)
    return Connection(
        record=record, url=record.url, started=True, _home=home, _pending=True, _fresh_db=fresh_db
    )


def _restore_template(target: Path) -> bool:
    template = _template_db()
    if not template.is_file():
        return False
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(template, tmp)
    os.replace(tmp, target)
    return True


def _save_template(source: Path) -> None:
    """Keep the freshly migrated (still empty) Prefect database for the next new home."""
    template = _template_db()
    if template.exists() or not source.is_file():
        return
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        tmp = template.with_name(f".{template.name}.{os.getpid()}.tmp")
        with (
            contextlib.closing(sqlite3.connect(source)) as src,
            contextlib.closing(sqlite3.connect(tmp)) as dst,
        ):
            src.backup(dst)  # a consistent copy of a live WAL database
        os.replace(tmp, template)
    except (OSError, sqlite3.Error):
        return  # a cache: the next fresh home migrates instead


PREPARE_TIMEOUT = 300.0  # seconds: far above Prefect's migrations (tens of seconds)


def prepare_template() -> tuple[Path, bool]:
    """Migrate an empty Prefect database into the user cache now (``dprelease server prepare``,
    run by ``install.sh``), so the first command on a new machine copies it instead of migrating.
    Returns (template path, whether it was created now); an existing template is kept.
    Raises :class:`ServerError` naming the log when Prefect's migration fails."""
    template = _template_db()
    if template.is_file():
        return template, False
    template.parent.mkdir(parents=True, exist_ok=True)
    scratch = template.parent / f".prepare-{os.getpid()}"
    scratch.mkdir(exist_ok=True)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_"))
    }
    env.update(
        PREFECT_HOME=str(scratch), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
            env=env,
            cwd=scratch,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PREPARE_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            log = template.parent / "prepare.log"
            log.write_bytes(done.stdout + done.stderr)
            raise ServerError(
                f"Prefect's database migration failed (exit {done.returncode}); its output: {log}"
            )
        _save_template(scratch / "prefect.db")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not template.is_file():
        raise ServerError(f"could not write the migrated Prefect database to {template}")
    return template, True


def status() -> ServerStatus:
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        return ServerStatus(state="external", url=configured)
    home = state_home()
    record = read_record(home)
    if record is None:
        deployed = deploy_server()
        if deployed is not None:
            return ServerStatus(state="deploy", url=deployed[1], processes=(deployed[0],))
        return ServerStatus(state="stopped", url=None)
    members = tuple(_our_members(record))
    last = _last_used(home)
    if not members:
        state = "stale"
    elif healthy(record.url):
        state = "running"
    elif _started_seconds_ago(record) < start_timeout():
        state = "starting"
    else:
        state = "unhealthy"
    return ServerStatus(
        state=state,
        url=record.url,
        record=record,
        processes=members,
        last_used_at=None if last is None else _iso(last),
        stops_after_idle_at=None if last is None else _iso(last + record.idle_seconds),
    )


def stop() -> ServerRecord | None:
    """Stop the shared server (by its recorded process group); None if none was recorded."""
    home = state_home()
    with _locked(home, timeout=start_timeout() + STOP_GRACE_SECONDS * 3):
        record = read_record(home)
        if record is None:
            return None
        stop_processes(record)
        _remove_record(home, record.pid)
        return record


@contextlib.contextmanager
def keep_alive(home: Path | None = None, *, every: float | None = None) -> Iterator[None]:
    """Touch the last-used file while the block runs, so a long command outlives the idle timer."""
    where = home or state_home()
    period = every or max(0.5, min(60.0, idle_seconds() / 3))
    stopped = threading.Event()

    def beat() -> None:
        while not stopped.wait(period):
            with contextlib.suppress(OSError):
                touch(where)

    thread = threading.Thread(target=beat, name="dprelease-server-keepalive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join(timeout=1.0)
        with contextlib.suppress(OSError):
            touch(where)


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child before exec
    """Linux: the Prefect server gets SIGTERM when its supervisor dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn_child(command: list[str]) -> subprocess.Popen[bytes]:
    """A child that ends with this process (called from a single-threaded one: the supervisor,
    ``flows.worker_host``)."""
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)


def supervise(*, port: int, home: Path, idle: float) -> int:
    """Run ``prefect server start`` until it exits, is stopped, or stays unused for ``idle`` s."""
    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        stop_requested.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, request_stop)
    prefect = f"prefect server start --host 127.0.0.1 --port {port} --no-ui --analytics-off"
    child = spawn_child([sys.executable, "-m", *prefect.split()])
    _log(f"supervisor {os.getpid()}: prefect server pid {child.pid} on port {port}")
    validator = _start_validation_service(home)
    interval = max(0.2, min(5.0, idle / 4))
    reason = "stopped"
    unrecorded_since: float | None = None
    url = f"http://127.0.0.1:{port}/api"
    serving = False  # the idle clock starts once the server answered (start-up can outlast it)
    try:
        while True:
            if stop_requested.wait(timeout=interval):
                break
            if child.poll() is not None:
                reason = f"the prefect server exited with {child.returncode}"
                break
            # A server no server.json points to (its starter was killed before writing it, or
            # another server replaced it) could never be found or stopped: it stops itself.
            record = read_record(home)
            if record is not None and record.pid == os.getpid():
                unrecorded_since = None
            elif unrecorded_since is None:
                unrecorded_since = time.monotonic()
            elif time.monotonic() - unrecorded_since > min(UNRECORDED_GRACE_SECONDS, idle):
                reason = f"not recorded in {home / SERVER_FILE}"
                break
            if not serving:
                serving = healthy(url, timeout=1.0)
                continue
            last = _last_used(home)
            if last is None or time.time() - last < idle:
                continue
            with _locked(home, timeout=0, blocking=False) as held:
                last = _last_used(home)
                if held and (last is None or time.time() - last >= idle):
                    reason = f"idle for {idle:g} s"
                    _terminate(child)
                    _remove_record(home, os.getpid())
                    break
    finally:
        _terminate(child)
        if validator is not None:
            _terminate(validator)
        # A busy lock means `stop` or a starting command holds it: that holder cleans up.
        with contextlib.suppress(OSError), _locked(home, timeout=0, blocking=False) as held:
            if held:
                _remove_record(home, os.getpid())
        _log(f"supervisor {os.getpid()}: {reason}; exiting")
    return 0


def validation_socket(home: Path, *, name: str = VALIDATION_SOCKET_FILE) -> Path:
    """``home/<name>``; when that path is too long for AF_UNIX, a name derived from it in
    ``$TMPDIR/dprelease-<uid>/`` (the socket itself is created mode 0600)."""
    path = home / name
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"dprelease-{os.getuid()}" / f"{digest}.sock"


def service_enabled() -> bool:
    """False when ``DPRELEASE_VALIDATION_SERVICE`` is off (``0``, ``off``, ``false``, ``no``)."""
    value = os.environ.get(VALIDATION_SERVICE_ENV, "on").strip().lower()
    return value not in ("0", "off", "false", "no")


def _start_validation_service(home: Path) -> subprocess.Popen[bytes] | None:
    """``python -m dprelease.catalog.validation.service`` (module docstring); None when it cannot start or
    ``DPRELEASE_VALIDATION_SERVICE=off`` (a host short of the memory it keeps)."""
    if not service_enabled():
        _log(f"supervisor {os.getpid()}: validation service off ({VALIDATION_SERVICE_ENV})")
        return None
    path = validation_socket(home)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        _log(f"supervisor {os.getpid()}: no validation service ({exc})")
        return None
    service = spawn_validation_service(path)
    _log(f"supervisor {os.getpid()}: validation service pid {service.pid} on {path}")
    return service


def spawn_validation_service(path: Path) -> subprocess.Popen[bytes]:
    """``python -m dprelease.catalog.validation.service`` on ``path``, a child that ends with this
    process (and checks that this process stays its parent)."""
    return spawn_child(
        [sys.executable, "-m", VALIDATION_MARKER, "--socket", str(path), "--parent-pid",
         str(os.getpid())]
    )  # fmt: skip


def _terminate(child: subprocess.Popen[bytes]) -> None:
    terminate(lambda: [] if child.poll() is not None else [child.pid], grace=STOP_GRACE_SECONDS)


def _log(message: str) -> None:
    sys.stderr.write(f"{_iso()} dprelease {message}\n")
    sys.stderr.flush()


def _daemonize() -> None:
    """Leave the launcher: fork, print the daemon's pid for the launcher, start a new session."""
    pid = os.fork()
    if pid > 0:
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
        os._exit(0)
    os.setsid()  # the daemon leads its own session and process group (pgid == pid)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # stdout to the log as well: the launcher stops reading after the pid
    os.close(devnull)


def _print_shared_server(*, home: Path, phome: Path) -> int:
    """Exit 0 printing ``PID URL`` when the shared server of ``home`` runs on ``phome``'s database."""
    record = read_record(home.resolve()) if home.is_dir() else None
    if record is None or Path(record.prefect_home) != phome.resolve() or not _our_members(record):
        return 1
    sys.stdout.write(f"{record.pid} {record.url}\n")
    return 0


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dprelease.flows.server")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("supervise", help="(internal) run the shared Prefect server")
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--home", type=Path, required=True)
    run.add_argument("--idle-seconds", type=float, required=True)
    shared = sub.add_parser(
        "shared-server",
        help="print 'PID URL' and exit 0 if the shared server of --home runs on --prefect-home",
    )
    shared.add_argument("--home", type=Path, required=True)
    shared.add_argument("--prefect-home", type=Path, required=True)
    seed = sub.add_parser(
        "seed-database", help="copy the migrated empty Prefect database into a new PREFECT_HOME"
    )
    seed.add_argument("--prefect-home", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "shared-server":
        return _print_shared_server(home=args.home, phome=args.prefect_home)
    if args.command == "seed-database":
        target = args.prefect_home / "prefect.db"
        return 0 if target.exists() or _restore_template(target) else 1
    _daemonize()
    return supervise(port=args.port, home=args.home, idle=args.idle_seconds)


if __name__ == "__main__":  # pragma: no cover - the supervisor's entry point
    raise SystemExit(_main(sys.argv[1:]))
