"""Release records and their leases.

A release that is measuring holds a lease (owner pid, host and start time, and a heartbeat):
``Catalog.recover`` moves a release whose process died, or whose heartbeat is older than the
lease, from ``measuring`` to ``failed`` (``aborted`` when the process recorded an interrupt); its
charges stay spent."""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from dprelease.catalog.processes import is_alive, process_start

DEFAULT_LEASE_SECONDS = 3600.0


@dataclass(frozen=True, kw_only=True)
class ReleaseRecord:
    id: str
    name: str
    dataset_id: str
    status: str
    spec_fingerprint: str
    input_fingerprint: str | None
    mechanism: str | None
    directory: str | None
    manifest_sha256: str | None
    published_directory: str | None
    created_at: str
    updated_at: str
    owner_pid: int | None = None
    owner_host: str | None = None
    owner_start: str | None = None
    heartbeat_at: str | None = None
    interrupted_at: str | None = None
    series_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class RecoveredRelease:
    """A release ``Catalog.recover`` moved out of ``measuring`` (its charges stay spent)."""

    release_id: str
    dataset_id: str
    previous_status: str
    status: str
    reason: str
    charges: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def process_owner() -> dict[str, Any]:
    """This process as a release's lease owner: pid, host and start time (to tell a reused pid
    apart); recorded on every release it registers."""
    return {
        "owner_pid": os.getpid(),
        "owner_host": socket.gethostname(),
        "owner_start": process_start(os.getpid()),
    }


def stuck_reason(record: ReleaseRecord, *, clock: datetime, lease_seconds: float) -> str | None:
    """Why the process of a ``measuring`` release is gone, or None: its owner on this host no
    longer exists (or its pid was reused), or its last sign of life is older than the lease."""
    if (
        record.owner_pid is not None
        and record.owner_host == socket.gethostname()
        and not is_alive(record.owner_pid, started_at=record.owner_start)
    ):
        return f"its process {record.owner_pid} on {record.owner_host} is gone"
    stamps = [record.updated_at, record.heartbeat_at or record.created_at]
    last = max(datetime.fromisoformat(s) for s in stamps)
    idle = (clock - last).total_seconds()
    if idle > lease_seconds:
        return f"no sign of life for {idle:.0f} s (lease {lease_seconds:g} s)"
    return None
