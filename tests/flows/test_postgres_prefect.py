"""deploy/postgres.md, for real: a Prefect server keeping its state on PostgreSQL (asyncpg, the
driver prefect ships) and a flow that charges a dprelease catalog in a second database of the same
PostgreSQL server; dprelease refuses to put its catalog into Prefect's database.

The server runs as a child process on a free loopback port, with bounded waits, stopped by PID.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.store import Catalog
from tests.flows.test_operations import _stop
from tests.pg_server import PostgresServer, free_port

pytestmark = pytest.mark.flow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SERVER_START_TIMEOUT = 300.0  # s: migrations of a fresh database on a loaded 2-core machine

FLOW = """
from prefect import flow
from prefect.runtime import flow_run
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost


@flow(name="charge-on-postgres")
def charge() -> str:
    catalog = Catalog()  # DPRELEASE_CATALOG_URL
    catalog.ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=2.0))
    catalog.charge("ds", PrivacyCost(measure="pure", epsilon=0.5), release_id="r", label="flow")
    return flow_run.get_id()


print("flow run", charge(), flush=True)
"""


def wait_healthy(api: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(
                f"the Prefect server exited ({server.returncode}):\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=2) as response:
                if response.read().strip() == b"true":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(
        f"no healthy Prefect server within {SERVER_START_TIMEOUT:g} s:\n{log.read_text()[-3000:]}"
    )


def test_prefect_server_and_catalog_share_one_postgresql_server(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    prefect_url = postgres_server.create_database("prefect")
    catalog_url = postgres_server.create_database("dprelease")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_API_DATABASE_CONNECTION_URL": prefect_url.replace("+psycopg", "+asyncpg"),
        "PREFECT_API_URL": api,
        "DPRELEASE_CATALOG_URL": catalog_url,
    }
    log = tmp_path / "server.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(api, server, log)
        run = subprocess.run(
            [sys.executable, "-c", FLOW],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        [flow_run_id] = [
            line.split()[-1] for line in run.stdout.splitlines() if line.startswith("flow run")
        ]
    finally:
        _stop(server, grace=(20.0, 10.0))  # type: ignore[arg-type]

    # Prefect's state is in its database on the PostgreSQL server ...
    with psycopg.connect(postgres_server.dsn(prefect_url.rsplit("/", 1)[1])) as conn:
        row = conn.execute(
            "SELECT state_type FROM flow_run WHERE id = %s", (flow_run_id,)
        ).fetchone()
    assert row is not None and row[0] == "COMPLETED"
    # ... and the charge is in the catalog's, beside it
    catalog = Catalog(catalog_url)
    [entry] = catalog.ledger_entries("ds")
    assert (entry.release_id, entry.label, entry.cost.epsilon) == ("r", "flow", 0.5)
    assert catalog.verify_chain() == []
    with pytest.raises(CatalogError, match=r"is not a dprelease catalog \(it holds other tables"):
        Catalog(prefect_url)
