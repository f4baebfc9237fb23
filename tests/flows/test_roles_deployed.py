"""The deployed path under PostgreSQL database roles, for real: a Prefect server and a process
worker logged in as an operator (``PGUSER``) run a release on a catalog set up with ``dprelease
catalog roles --apply``, and it pauses for review; the worker may not record a decision (only a
reviewer may write ``reviews`` and the decision's ledger entry), so ``dprelease review`` under a
reviewer's login records and anchors the decision, publishes where the deployment publishes
(``review_runs.publish_dir``), then resumes the paused run, which reads the outcome and ends.
The database says which login wrote what (``entry_sessions``); the chain and ``dprelease verify``
check."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from dprelease.catalog.ledger import pg_roles
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.watch_state import ReviewRuns
from tests.flows.test_operations import (
    _deployment,
    _spec,
    _wait_final,
    _wait_paused,
    _write_tiny_parquet,
    serve,
)
from tests.pg_server import SUPERUSER, PostgresServer
from tests.privacy.test_postgres_roles import apply_roles, create_logins

pytestmark = [pytest.mark.flow]


def test_a_reviewer_login_records_publishes_and_ends_the_paused_run_of_an_operator_worker(
    postgres_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = sa.engine.make_url(postgres_server.create_database("deployed_roles")).database
    url = f"postgresql+psycopg://127.0.0.1:{postgres_server.port}/{database}"  # PGUSER: who
    prefix = f"d{uuid.uuid4().hex[:10]}"
    roles = pg_roles.RoleNames.with_prefix(prefix)
    home = tmp_path / "dprelease"  # the catalog key and anchor every login shares
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    apply_roles(url, prefix, monkeypatch)  # as the custodian: creates the catalog, then roles
    logins = create_logins(postgres_server, roles)
    data = tmp_path / "data" / "tiny.parquet"
    _write_tiny_parquet(data, seed=13)
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = specs / "ops-roles.yaml"
    spec.write_text(yaml.safe_dump(_spec("ops-roles", "ops-roles", data, cap=5.0)))
    publish_dir = tmp_path / "public"
    as_operator = {"PGUSER": logins["operator"], "DPRELEASE_CATALOG_URL": url}
    with serve(
        tmp_path, specs={"roles": spec}, landing=tmp_path / "landing", deploy=[str(specs)],
        worker_env=as_operator,
    ) as ops:  # fmt: skip
        reviewer = dataclasses.replace(
            ops,
            catalog_url=url,
            env={**ops.env, "PGUSER": logins["reviewer"], "DPRELEASE_CATALOG_URL": url},
        )
        with ops.api() as client:
            created = client.create_flow_run_from_deployment(
                _deployment(ops, "ops-roles").id,
                parameters={"catalog_url": url, "publish_dir": str(publish_dir)},
            )
        _wait_paused(ops, created.id)
        monkeypatch.setenv("PGUSER", logins["auditor"])
        auditor = Catalog(url)
        [record] = auditor.releases(dataset_id="ops-roles")
        assert record.status == "staged"
        assert ReviewRuns(url).get(record.id).publish_dir == str(publish_dir)

        decided = reviewer.cli("review", record.id, "--approve", "--reviewer", "Ada")
        assert decided.returncode == 0, decided.stdout + decided.stderr + ops.diagnostics()
        assert f"{record.id}: published (decided through flow run {created.id})" in decided.stdout
        final = _wait_final(ops, created.id)
        assert final.state.is_completed(), ops.diagnostics()
        verified = reviewer.cli("verify", str(publish_dir / record.id), "--json")
    published = auditor.release(record.id)
    assert (published.status, published.published_directory) == (
        "published",
        str(publish_dir / record.id),
    )
    assert json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr
    assert ReviewRuns(url).get(record.id).status == "decided"
    assert auditor.verify_chain() == []
    kinds = [entry.kind for entry in auditor.ledger_entries("ops-roles")]
    assert kinds[-1] == "decision" and "charge" in kinds
    who = {
        (row["table_name"], row["detail"]): row["login_role"]
        for row in pg_roles.recorded_sessions(auditor.engine)
    }
    assert who[("ledger", "charge")] == who[("releases", "staged")] == logins["operator"]
    assert who[("reviews", "approved")] == who[("ledger", "decision")] == logins["reviewer"]
    assert who[("releases", "published")] == logins["reviewer"]
    assert SUPERUSER not in set(who.values())
