"""The migrated, empty Prefect database that test servers start from instead of migrating.

flows/server.py keeps one per Prefect version in ``DPRELEASE_CACHE_DIR`` (``dprelease server
prepare``, run by install.sh, makes it; ``dprelease server`` and deploy/start-server.sh copy it into
a new PREFECT_HOME).  tests/conftest.py points ``DPRELEASE_CACHE_DIR`` at one folder shared by the
xdist workers and by later runs, so the suite migrates at most once; the Prefect servers the tests
start themselves (``prefect server start``, the session's ``prefect_test_harness``) start from a
copy of it, as a deployment whose install.sh ran does.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

# The test servers register a block type when a block is saved, as dprelease's own server does
# (flows/server.py): registering every type at start costs 1.5 of a server's 4.5 CPU-s.
# deploy/start-server.sh registers them, for the UI's block catalogue.
NO_BLOCK_REGISTRATION = {
    "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
    "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
}


def migrated_prefect_db() -> Path:
    """The template (made now if missing: one process migrates, the others wait on a lock)."""
    from dprelease.flows import server

    cache = Path(os.environ["DPRELEASE_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        template, _ = server.prepare_template()
    return template


def seed_prefect_db(database: Path) -> None:
    """Copy the template to ``database`` (a new server's SQLite file), unless it exists."""
    if database.exists():
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    scratch = database.with_name(f".{database.name}.{os.getpid()}.tmp")
    shutil.copyfile(migrated_prefect_db(), scratch)
    os.replace(scratch, database)
