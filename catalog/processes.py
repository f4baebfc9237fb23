"""Is a recorded process still the same running process: pid, state and start time from procfs.

Records of running work (the shared Prefect server, a release's lease owner, a stage's run
record, the validation service's start marker) name a process by pid and, where one is needed,
its start time (clock ticks since boot, ``/proc/PID/stat`` field 22): with the pid it names one
process, so a recycled pid never passes for the recorded one.  A zombie or dead process is not
alive.  Without procfs (not Linux) only ``kill(pid, 0)`` can be checked and is trusted.  Each call
costs one ``kill(pid, 0)`` and one or two small procfs reads; :func:`live_processes` reads every
``/proc/PID/stat`` (O(processes)).

The local services (the validation service, the run starter) log with :func:`service_log` and
answer a request with one JSON line (:func:`send_line`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PROC = Path("/proc")
_GONE_STATES = ("Z", "X")  # zombie or dead: it will never run again
_START_FIELD = 19  # starttime, field 22 of /proc/PID/stat, counted after "pid (command) "


def procfs_available() -> bool:
    """True where ``/proc`` describes processes (Linux)."""
    return (PROC / "self" / "stat").exists()


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: [state, ppid, pgrp, session, ...]; None if it
    cannot be read (no such process, or no procfs)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()  # the command may hold spaces and ")"


def _start_of(fields: list[str]) -> str | None:
    return fields[_START_FIELD] if len(fields) > _START_FIELD else None


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart); None where
    procfs does not show it.  A string, as run records, leases and deploy files store it."""
    fields = stat_fields(pid)
    return None if fields is None else _start_of(fields)


def command_line(pid: int) -> str | None:
    """The process's arguments joined by spaces; None if they cannot be read.  Empty for a zombie
    or a kernel thread.  Undecodable bytes round-trip as :func:`os.fsdecode` gives them, so a path
    compares equal to ``str(path)``."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return os.fsdecode(raw.replace(b"\0", b" "))


def is_alive(pid: int, *, started_at: str | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when ``started_at`` is given, started then: the
    same pid and the same start time are the same process.  Another user's process counts.
    Without procfs ``kill(pid, 0)`` is trusted and ``started_at`` cannot be checked."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    fields = stat_fields(pid)
    if fields is None:
        return not procfs_available()  # with procfs: it ended since kill(0)
    if fields[0] in _GONE_STATES:
        return False
    return started_at is None or _start_of(fields) == started_at


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, :func:`stat_fields`) of every process procfs shows that is not a zombie; nothing
    without procfs.  Reads O(processes) small files."""
    if not procfs_available():
        return
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is not None and fields[0] not in _GONE_STATES:
            yield int(entry.name), fields


def service_log(service: str, message: str) -> None:
    """``<UTC time> dprelease <service> <pid>: <message>`` on stderr (public words only)."""
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    sys.stderr.write(f"{stamp} dprelease {service} {os.getpid()}: {message}\n")
    sys.stderr.flush()


def send_line(connection: socket.socket, message: dict[str, Any]) -> None:
    """One JSON line to a requester; one that went away meanwhile is not an error."""
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps(message).encode() + b"\n")
