"""A long-lived process that keeps Great Expectations imported for the commands of one state home.

Importing GX costs seconds per command, so the shared server's supervisor (``flows.server``)
starts this service in its process group: it imports GX once, listens on
``$DPRELEASE_HOME/validation.sock`` (mode 0600, created once GX is loaded) and runs
:func:`catalog.validation.gx.run_suites_here` per request.  While it imports, ``<socket>.starting``
holds its pid and a command waits for it (at most :data:`STARTUP_WAIT_SECONDS`) rather than import
GX beside it.  It stops with the supervisor, when its parent changes, or on SIGTERM.

Privacy: exactly what ``run_suites_here`` may see crosses the socket, released (noisy) tables and public
expectations (``catalog.validation.checks`` builds both); the socket is a file only its owner may open.

Protocol, one request per connection: the client sends one JSON line ``{"docs_dir": str | null,
"jobs": [{"name", "expectations": [[type, kwargs], ...], "frame_bytes": n}, ...]}`` and then each
job's frame as an Arrow IPC stream of exactly ``frame_bytes`` bytes; the service answers one JSON
line, ``{"ok": true, "summaries": {...}}`` or ``{"ok": false, "error": "<exception type>"}``.
Any failure on the client's side means: validate in this process instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dprelease.catalog.processes import command_line, is_alive, send_line, service_log
from dprelease.catalog.validation.gx import Jobs

if TYPE_CHECKING:
    import pandas as pd

SOCKET_ENV = "DPRELEASE_VALIDATION_SOCKET"
"""Set by ``flows.server.connect`` for a command that uses the shared server: the socket to try
(``flows.server`` keeps its own copy of the name: the supervisor imports only the standard-library
``catalog.processes`` of the catalog)."""
CONNECT_SECONDS = 2.0
REQUEST_SECONDS = 600.0  # an answer later than this means a hung service: validate here instead
ACCEPT_POLL_SECONDS = 1.0
STARTUP_WAIT_SECONDS = 30.0
"""How long a command waits for a service still importing GX before it validates itself."""
NICENESS = 10


class ServiceUnavailable(RuntimeError):
    """The validation service could not validate this request (the caller validates itself)."""


def run_suites(jobs: Jobs, *, docs_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """:func:`catalog.validation.gx.run_suites_here`, in the shared validation service when this command has
    one (GX already imported there, or being imported: then it waits for it, bounded), else in
    this process."""
    service = wait_for_socket()
    if service is not None:
        try:
            return validate_remotely(service, jobs, docs_dir=docs_dir)
        except ServiceUnavailable as exc:  # public: names no value
            logging.getLogger(__name__).warning("validating in this process: %s", exc)
    from dprelease.catalog.validation import gx

    return gx.run_suites_here(jobs, docs_dir=docs_dir)


def expected() -> bool:
    """True when this command's service listens or is still importing GX (a live start marker):
    importing GX here as well would only compete with it for the CPU."""
    path = _configured_path()
    return path is not None and (path.is_socket() or _starting(path))


def wait_for_socket(*, timeout: float = STARTUP_WAIT_SECONDS) -> Path | None:
    """The service socket this command may use (``DPRELEASE_VALIDATION_SOCKET``), after waiting (at
    most ``timeout`` s) while the service is still importing GX; None when there is no service, it
    died, or it is not listening in time."""
    path = _configured_path()
    if path is None:
        return None
    deadline = time.monotonic() + timeout
    while not path.is_socket():
        if not _starting(path) or time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return path


def _configured_path() -> Path | None:
    value = os.environ.get(SOCKET_ENV)
    return Path(value) if value else None


def start_marker(path: Path) -> Path:
    return path.with_name(path.name + ".starting")


def write_start_marker(marker: Path, *, pid: int | None = None) -> None:
    """Name the service (this process, or ``pid`` for its launcher) in ``marker``: written whole,
    then renamed into place, so a command never reads a marker that exists but does not name the
    service yet (it would validate itself)."""
    named = os.getpid() if pid is None else pid
    partial = marker.with_name(f"{marker.name}.{os.getpid()}")
    partial.write_text(f"{named}\n")
    os.replace(partial, marker)


def _starting(path: Path) -> bool:
    """The service of ``path`` is alive and importing GX: its start marker names a live process
    that is this socket's validation service (a marker left by a killed one is ignored)."""
    try:
        pid = int(start_marker(path).read_text().strip())
    except (OSError, ValueError):
        return False
    if not is_alive(pid):
        return False
    command = command_line(pid)
    if command is None:
        return True  # no /proc: a live pid is all that can be checked
    return "dprelease.catalog.validation.service" in command and str(path) in command


def validate_remotely(
    path: Path, jobs: Jobs, *, docs_dir: Path | None, timeout: float = REQUEST_SECONDS
) -> dict[str, dict[str, Any]]:
    """Run ``jobs`` in the service behind ``path``; raises :class:`ServiceUnavailable`."""
    frames = [_arrow_bytes(frame) for _, frame, _ in jobs]
    header = {
        "docs_dir": None if docs_dir is None else str(docs_dir.resolve()),  # its cwd is not ours
        "jobs": [
            {"name": name, "expectations": expectations, "frame_bytes": len(data)}
            for (name, _, expectations), data in zip(jobs, frames, strict=True)
        ],
    }
    try:
        line = json.dumps(header, allow_nan=False).encode() + b"\n"
    except (TypeError, ValueError) as exc:  # an expectation argument JSON cannot carry
        raise ServiceUnavailable(f"request not serialisable: {type(exc).__name__}") from None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(CONNECT_SECONDS)
            connection.connect(str(path))
            connection.settimeout(timeout)
            connection.sendall(line)
            for data in frames:
                connection.sendall(data)
            connection.shutdown(socket.SHUT_WR)
            answer = _read_line(connection.makefile("rb"))
    except OSError as exc:
        raise ServiceUnavailable(f"{type(exc).__name__}: {exc.strerror or exc}") from None
    if answer is None:
        raise ServiceUnavailable("the service closed the connection without an answer")
    try:
        reply = json.loads(answer)
    except ValueError:
        raise ServiceUnavailable("the service's answer is not JSON") from None
    if not isinstance(reply, dict) or not reply.get("ok") or "summaries" not in reply:
        error = reply.get("error") if isinstance(reply, dict) else None
        raise ServiceUnavailable(f"the service failed: {error}")
    return reply["summaries"]


def _arrow_bytes(frame: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _read_line(stream: io.BufferedReader) -> bytes | None:
    line = stream.readline()
    return line if line.endswith(b"\n") else None


def serve(path: Path, *, parent_pid: int) -> int:
    """Import GX, listen on ``path`` and validate requests one at a time until stopped."""
    from dprelease.catalog.validation import gx

    with contextlib.suppress(OSError):
        # below the commands and the Prefect server: on a fresh home the import runs while they
        # start, and it must not delay them (a request waits for this process anyway)
        os.nice(NICENESS)
    marker = start_marker(path)
    with contextlib.suppress(OSError):  # best effort: without it commands import GX themselves
        write_start_marker(marker)  # they wait for this import instead
    try:
        gx.load()  # the import this process exists for, before the socket appears
    except BaseException:
        marker.unlink(missing_ok=True)
        raise
    stops: list[int] = []  # the signals received: any one ends the loop
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda received, _frame: stops.append(received))
    path.unlink(missing_ok=True)  # a socket left by a killed service
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)  # the socket file is created 0600
    try:
        listener.bind(str(path))
    finally:
        os.umask(previous)
    listener.listen(8)
    marker.unlink(missing_ok=True)  # after listen: a waiting command sees the socket first
    listener.settimeout(ACCEPT_POLL_SECONDS)
    _log(f"Great Expectations loaded; listening on {path}")
    try:
        while not stops and os.getppid() == parent_pid:
            try:
                connection, _ = listener.accept()
            except (TimeoutError, InterruptedError):
                continue
            with connection:
                connection.settimeout(None)
                _answer(connection)
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
    return 0


def _answer(connection: socket.socket) -> None:
    from dprelease.catalog.validation import gx

    started = time.monotonic()
    stream = connection.makefile("rb")
    try:
        line = _read_line(stream)
        if line is None:
            return
        header = json.loads(line)
        jobs: Jobs = []
        for job in header["jobs"]:
            data = stream.read(int(job["frame_bytes"]))
            frame = pa.ipc.open_stream(data).read_all().to_pandas()
            expectations = [(str(kind), dict(kwargs)) for kind, kwargs in job["expectations"]]
            jobs.append((str(job["name"]), frame, expectations))
        docs = header.get("docs_dir")
        summaries = gx.run_suites_here(jobs, docs_dir=None if docs is None else Path(docs))
        reply: dict[str, Any] = {"ok": True, "summaries": summaries}
        _log(f"validated {len(jobs)} suite(s) in {time.monotonic() - started:.2f} s")
    except Exception as exc:  # the client validates in its own process, which reports the error
        reply = {"ok": False, "error": type(exc).__name__}
        _log(f"request failed with {type(exc).__name__}")  # the type only: no value, no message
    send_line(connection, reply)


def _log(message: str) -> None:
    service_log("validation service", message)


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dprelease.catalog.validation.service")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    return serve(args.socket, parent_pid=args.parent_pid)


if __name__ == "__main__":  # pragma: no cover - the service's entry point
    raise SystemExit(_main(sys.argv[1:]))
