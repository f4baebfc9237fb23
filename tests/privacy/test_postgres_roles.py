"""Roles enforced by the database: on a PostgreSQL catalog set up with ``dprelease catalog roles
--apply``, operators, reviewers and auditors log in as their own roles, and the server itself
refuses what a role may not do ("permission denied"), whatever the client runs.

Privacy and audit obligations: only an operator appends privacy charges and only a reviewer
appends a review decision (an operator cannot approve their own release by writing the decision
row); an auditor changes nothing; no one changes a cap, a ledger entry or the catalog marker; the
database records which login wrote each entry, and no one can forge that record.

Every test logs in as the roles through the same URL (no user name in it: ``PGUSER`` picks the
role, as deploy/postgres.md says), against the real server of ``tests/pg_server.py``.  Each fails
without the GRANTs: a login role without them can neither charge nor review nor read.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger import pg_roles
from dprelease.catalog.ledger.budget import append_entry
from dprelease.catalog.ledger.schema import catalog_meta, datasets, ledger, releases, reviews
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.review import decisions
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.watch_state import ReviewRuns, WatchState
from dprelease.flows.cli import app
from dprelease.flows.cli.catalog import catalog_tables
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.pg_server import SUPERUSER, PostgresServer
from tests.stages import release_stages

runner = CliRunner()
PERMISSION_DENIED = "42501"


def pure(epsilon: float) -> PrivacyCost:
    return PrivacyCost(measure="pure", epsilon=epsilon)


@dataclass
class RoleCatalog:
    """A catalog with the roles applied and one login per group role."""

    url: str  # no user name: PGUSER picks the login, so every role shares the key and anchor
    roles: pg_roles.RoleNames
    logins: dict[str, str]  # kind -> login role
    monkeypatch: pytest.MonkeyPatch

    @contextlib.contextmanager
    def connected(self, kind: str) -> Iterator[Catalog]:
        """The catalog opened by the login of ``kind`` (``superuser`` for the test's own)."""
        login = SUPERUSER if kind == "superuser" else self.logins[kind]
        with self.monkeypatch.context() as patch:
            patch.setenv("PGUSER", login)
            catalog = Catalog(self.url)
            try:
                yield catalog
            finally:
                catalog.engine.dispose()  # pooled connections are this login's


def apply_roles(url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dprelease catalog roles --apply`` as the superuser (the custodian's setup)."""
    with monkeypatch.context() as patch:
        patch.setenv("PGUSER", SUPERUSER)
        patch.setenv("DPRELEASE_CATALOG_URL", url)
        result = runner.invoke(app, ["catalog", "roles", "--apply", "--prefix", prefix])
    assert result.exit_code == 0, result.output
    assert f"group roles {prefix}_custodian" in result.stdout


def create_logins(server: PostgresServer, roles: pg_roles.RoleNames) -> dict[str, str]:
    """One login per group role (names are cluster-wide: unique per test)."""
    logins = {}
    with psycopg.connect(server.dsn("postgres"), autocommit=True, connect_timeout=10) as conn:
        for kind in ("operator", "reviewer", "auditor"):
            login = f"{getattr(roles, kind)}_login"
            conn.execute(f'CREATE ROLE "{login}" LOGIN IN ROLE "{getattr(roles, kind)}"')
            logins[kind] = login
    return logins


@pytest.fixture
def role_catalog(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> RoleCatalog:
    database = sa.engine.make_url(postgres_server.create_database("roles")).database
    url = f"postgresql+psycopg://127.0.0.1:{postgres_server.port}/{database}"
    prefix = f"r{uuid.uuid4().hex[:10]}"
    apply_roles(url, prefix, monkeypatch)
    roles = pg_roles.RoleNames.with_prefix(prefix)
    return RoleCatalog(
        url=url,
        roles=roles,
        logins=create_logins(postgres_server, roles),
        monkeypatch=monkeypatch,
    )


def run_to_staged(catalog: Catalog, release_id: str = "rel-1") -> str:
    """The operator's charge path: dataset, release, lease, charge, staged; the receipt."""
    catalog.ensure_dataset("ds", cap=pure(5.0))
    catalog.create_release(
        release_id=release_id, name="n", dataset_id="ds", spec_fingerprint="f" * 64, mechanism="m"
    )
    catalog.heartbeat(release_id)
    receipt = catalog.charge("ds", pure(1.0), release_id=release_id, label="count")
    catalog.update_release(
        release_id, status="staged", directory=f"/releases/{release_id}", manifest_sha256="a" * 64
    )
    return receipt


def denied(call: Callable[[], object]) -> str:
    """Run ``call``; it must be refused by the server with "permission denied"; the message."""
    with pytest.raises(sa.exc.ProgrammingError) as info:
        call()
    assert info.value.orig.sqlstate == PERMISSION_DENIED, info.value.orig  # type: ignore[union-attr]
    return str(info.value.orig)


def execute(catalog: Catalog, statement: sa.Executable) -> None:
    with catalog.engine.begin() as conn:
        conn.execute(statement)


def test_an_operator_runs_the_charge_path_but_the_server_denies_it_a_review_decision(
    role_catalog: RoleCatalog,
) -> None:
    with role_catalog.connected("operator") as operator:
        receipt = run_to_staged(operator)
        watch = WatchState(role_catalog.url)
        assert watch.claim(dataset_id="ds", fingerprint="0" * 64, path="/in/a", size=1)
        watch.unclaim(dataset_id="ds", fingerprint="0" * 64)
        ReviewRuns(role_catalog.url).record(release_id="rel-1", flow_run_id="run", api_url=None)
        operator.create_release(  # a run whose process died: `dprelease recover` fails it
            release_id="rel-2", name="m", dataset_id="ds", spec_fingerprint="e" * 64, mechanism="m"
        )
        later = datetime.now(UTC) + timedelta(days=2)
        assert [m.release_id for m in operator.recover(now=later)] == ["rel-2"]
        assert operator.release("rel-2").status == "failed"
        message = denied(
            lambda: operator.record_review(
                "rel-1", decision="approved", reviewer="Mallory", note="my own"
            )
        )
        assert "permission denied for table reviews" in message
        assert operator.reviews("rel-1") == []
        assert operator.release("rel-1").status == "staged"
        assert [e.receipt_id for e in operator.ledger_entries()] == [receipt]
        assert operator.verify_chain() == []


@pytest.mark.parametrize(
    ("what", "statement", "table"),
    [
        ("raise a cap", datasets.update().values(cap_epsilon=100.0), "datasets"),
        ("edit a charge", ledger.update().values(epsilon=0.0), "ledger"),
        ("delete a charge", ledger.delete(), "ledger"),
        ("change the marker", catalog_meta.update().values(value="x"), "catalog_meta"),
        (
            "write a decision",
            reviews.insert().values(
                release_id="rel-1", decision="approved", reviewer="M", note="", at="now"
            ),
            "reviews",
        ),
        ("publish its release", releases.update().values(status="published"), "releases"),
        ("approve its release", releases.update().values(status="approved"), "releases"),
        (
            "register a release as approved",
            releases.insert().values(
                id="rel-2",
                name="n",
                dataset_id="ds",
                status="approved",
                spec_fingerprint="f",
                created_at="now",
                updated_at="now",
            ),
            "releases",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and " " in value else "",
)
def test_an_operator_may_not(
    role_catalog: RoleCatalog, what: str, statement: sa.Executable, table: str
) -> None:
    with role_catalog.connected("operator") as operator:
        run_to_staged(operator)
        assert f"for table {table}" in denied(lambda: execute(operator, statement)), what
        assert operator.spent("ds") == pure(1.0) and operator.cap("ds") == pure(5.0)
        assert operator.verify_chain() == []


def test_a_reviewer_records_a_decision_but_cannot_charge(role_catalog: RoleCatalog) -> None:
    with role_catalog.connected("operator") as operator:
        run_to_staged(operator)
    with role_catalog.connected("reviewer") as reviewer:
        reviewer.record_review("rel-1", decision="approved", reviewer="Ada", note="fine")
        reviewer.update_release("rel-1", status="published", published_directory="/pub/rel-1")
        assert [r.decision for r in reviewer.reviews("rel-1")] == ["approved"]
        assert reviewer.release("rel-1").status == "published"
        denied(lambda: reviewer.charge("ds", pure(1.0), release_id="rel-1", label="more"))
        with reviewer.engine.begin() as conn:  # the row itself, without the chain lock
            message = denied(
                lambda: append_entry(
                    conn, dataset_id="ds", release_id="rel-1", label="x", cost=pure(1.0)
                )
            )
        assert "permission denied for table ledger" in message
        assert "append only zero-cost decision entries (not charge)" in message
        for kind, cost in (("decision", pure(0.5)), ("key", pure(0.0)), ("skipped", pure(0.0))):
            with reviewer.engine.begin() as conn:  # a charge disguised, or another kind
                message = denied(
                    lambda conn=conn, kind=kind, cost=cost: append_entry(
                        conn, dataset_id="ds", release_id="rel-1", label="x", cost=cost, kind=kind
                    )
                )
            assert f"(not {kind})" in message, message
        denied(lambda: reviewer.ensure_dataset("other", cap=pure(9.0)))
        assert reviewer.spent("ds") == pure(1.0)
        # the charge, then the decision's zero-cost entry, which the reviewer's login appended
        charge, anchor = reviewer.ledger_entries()
        assert (charge.kind, anchor.kind) == ("charge", "decision")
        assert (anchor.cost, anchor.release_id) == (pure(0.0), "rel-1")
        assert reviewer.verify_chain() == []
    with role_catalog.connected("auditor") as auditor:
        sessions = pg_roles.recorded_sessions(auditor.engine, table="ledger")
    assert [(s["detail"], s["login_role"]) for s in sessions][-1] == (
        "decision",
        role_catalog.logins["reviewer"],
    )


def test_a_decision_row_written_outside_dprelease_fails_the_chain_check(
    role_catalog: RoleCatalog,
) -> None:
    with role_catalog.connected("operator") as operator:
        run_to_staged(operator)
    with role_catalog.connected("reviewer") as reviewer:
        reviewer.record_review("rel-1", decision="rejected", reviewer="Ada", note="noisy")
        assert reviewer.verify_chain() == []
        # the reviewer's INSERT privilege on reviews lets it write a row by hand: no anchor
        execute(
            reviewer,
            reviews.insert().values(
                release_id="rel-1", decision="approved", reviewer="Eve", note="", at="2020-01-01"
            ),
        )
        problems = reviewer.verify_chain()
    assert len(problems) == 1 and "decision approved by Eve on release rel-1" in problems[0]
    assert "has no decision entry in the ledger" in problems[0]


@pytest.mark.parametrize(
    ("status", "why"),
    [
        ("approved", "status approved needs its review decision"),
        ("published", "status published needs its review decision"),
        ("failed", "set a run status (failed)"),
    ],
)
def test_a_reviewer_sets_a_review_status_only_with_its_decision(
    role_catalog: RoleCatalog, status: str, why: str
) -> None:
    with role_catalog.connected("operator") as operator:
        run_to_staged(operator)
    with role_catalog.connected("reviewer") as reviewer:
        message = denied(lambda: reviewer.update_release("rel-1", status=status))
        assert why in message
        reviewer.record_review("rel-1", decision="rejected", reviewer="Ada", note="")
        assert reviewer.release("rel-1").status == "rejected"


def test_an_auditor_reads_budget_releases_and_the_chain_but_writes_nothing(
    role_catalog: RoleCatalog, tmp_path: Path
) -> None:
    with role_catalog.connected("operator") as operator:
        run_to_staged(operator)
    with role_catalog.connected("auditor") as auditor:
        assert auditor.spent("ds") == pure(1.0)
        assert [r.id for r in auditor.releases()] == ["rel-1"]
        assert auditor.verify_chain() == []
        denied(lambda: auditor.charge("ds", pure(1.0), release_id="rel-1", label="x"))
        denied(lambda: auditor.record_review("rel-1", decision="rejected", reviewer="A", note=""))
        denied(lambda: auditor.update_release("rel-1", status="failed"))
        denied(
            lambda: auditor.create_release(
                release_id="rel-2", name="n", dataset_id="ds", spec_fingerprint="f", mechanism="m"
            )
        )
        assert auditor.release("rel-1").status == "staged" and auditor.spent("ds") == pure(1.0)
    with role_catalog.monkeypatch.context() as patch:  # the CLI, as the auditor runs it
        patch.setenv("PGUSER", role_catalog.logins["auditor"])
        patch.setenv("DPRELEASE_CATALOG_URL", role_catalog.url)
        budget = runner.invoke(app, ["budget", "ds", "--json"])
        decision = runner.invoke(
            app, ["review", "rel-1", "--reject", "--reviewer", "Eve", "--note", "no"]
        )
    assert budget.exit_code == 0, budget.output
    assert '"epsilon": 1.0' in budget.stdout
    assert decision.exit_code == 2, decision.output
    assert "the catalog database refused this role" in decision.output
    # the decision's transaction locks the ledger's chain row first
    assert "permission denied for table catalog_meta" in decision.output


def test_the_login_role_is_recorded_with_each_entry_and_cannot_be_forged(
    role_catalog: RoleCatalog,
) -> None:
    with role_catalog.connected("operator") as operator:
        receipt = run_to_staged(operator)
    with role_catalog.connected("reviewer") as reviewer:
        reviewer.record_review("rel-1", decision="approved", reviewer="Ada", note="")
    with role_catalog.connected("auditor") as auditor:
        recorded = pg_roles.recorded_sessions(auditor.engine)
        forged = pg_roles.entry_sessions.insert().values(
            table_name="reviews", operation="INSERT", entry_key="1", login_role="someone-else"
        )
        denied(lambda: execute(auditor, forged))
    with role_catalog.connected("operator") as operator:
        denied(lambda: execute(operator, forged))
    who = {(r["table_name"], r["entry_key"], r["detail"]): r["login_role"] for r in recorded}
    op, rev = role_catalog.logins["operator"], role_catalog.logins["reviewer"]
    (anchor,) = [r["entry_key"] for r in recorded if r["detail"] == "decision"]
    assert who == {
        ("ledger", anchor, "decision"): rev,  # the decision's ledger entry
        ("datasets", "ds", None): op,
        ("releases", "rel-1", "measuring"): op,
        ("ledger", receipt, "charge"): op,
        ("releases", "rel-1", "staged"): op,
        ("reviews", "1", "approved"): rev,
        ("releases", "rel-1", "approved"): rev,
    }
    assert all(r["client_addr"] == "127.0.0.1" for r in recorded)


def test_applying_the_roles_again_keeps_every_grant_and_entry(
    role_catalog: RoleCatalog,
) -> None:
    with role_catalog.connected("operator") as operator:
        run_to_staged(operator)
    prefix = role_catalog.roles.operator.removesuffix("_operator")
    apply_roles(role_catalog.url, prefix, role_catalog.monkeypatch)  # e.g. after an upgrade
    with role_catalog.connected("reviewer") as reviewer:
        reviewer.record_review("rel-1", decision="rejected", reviewer="Ada", note="")
        denied(lambda: reviewer.charge("ds", pure(1.0), release_id="rel-1", label="x"))
    with role_catalog.connected("operator") as operator:
        assert operator.spent("ds") == pure(1.0) and operator.verify_chain() == []
        # the charge and the rejection's zero-cost entry
        assert len(pg_roles.recorded_sessions(operator.engine, table="ledger")) == 2


def test_applying_the_roles_adds_a_column_a_later_version_gave_a_module_table(
    role_catalog: RoleCatalog,
) -> None:
    """Only the custodian alters tables: a column added to ``review_runs`` by an upgrade is
    added by the custodian's ``catalog roles --apply``, then the operator writes it."""
    with role_catalog.connected("superuser") as custodian, custodian.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE review_runs DROP COLUMN publish_dir")  # as before
    prefix = role_catalog.roles.operator.removesuffix("_operator")
    apply_roles(role_catalog.url, prefix, role_catalog.monkeypatch)
    with role_catalog.connected("operator") as operator:
        runs = ReviewRuns(operator.url)
        runs.record(release_id="rel-1", flow_run_id="f1", api_url=None, publish_dir="/pub")
        assert runs.get("rel-1").publish_dir == "/pub"  # type: ignore[union-attr]


def test_a_release_runs_as_operator_is_published_by_a_reviewer_and_audited_read_only(
    role_catalog: RoleCatalog, tmp_path: Path, zero_noise: object
) -> None:
    """The real stages, each under its own login: register, ingest, measure (the charge before
    noise), reconstruct, stage; the review with its publication; verify, show and budget."""
    source = tmp_path / "survey.parquet"
    rng = np.random.default_rng(3)  # public randomness: synthetic test data
    pq.write_table(pa.table({"a": pa.array(rng.integers(0, 4, 60), pa.int16())}), source)
    spec = parse_spec(
        {
            "name": "monthly",
            "dataset": {"id": "survey", "budget": {"epsilon": 1.5}, "source": str(source)},
            "domain": {"a": {"min": 0, "max": 3}},
            "workload": [{"name": "a", "marginal": ["a"]}],
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
        }
    )
    with role_catalog.connected("operator") as operator:
        directory = release_stages(spec, operator, tmp_path / "out")
        release_id = directory.name
        assert operator.release(release_id).status == "staged"
    with role_catalog.connected("reviewer") as reviewer:
        outcome = decisions.review(
            reviewer,
            release_id,
            approve=True,
            reviewer="Ada",
            note="ok",
            publish_dir=tmp_path / "published",
        )
    assert outcome["status"] == "published"
    with role_catalog.monkeypatch.context() as patch:
        patch.setenv("PGUSER", role_catalog.logins["auditor"])
        patch.setenv("DPRELEASE_CATALOG_URL", role_catalog.url)
        verified = runner.invoke(app, ["verify", outcome["published_directory"], "--json"])
        shown = runner.invoke(app, ["show", release_id, "--json"])
        budget = runner.invoke(app, ["budget", "survey", "--json"])
        who = runner.invoke(app, ["catalog", "sessions", "--table", "reviews", "--json"])
    for result in (verified, shown, budget, who):
        assert result.exit_code == 0, result.output
    assert json.loads(verified.stdout)["ok"] is True
    assert json.loads(shown.stdout)["release"]["status"] == "published"
    [decided] = json.loads(who.stdout)
    assert (decided["detail"], decided["login_role"]) == (
        "approved",
        role_catalog.logins["reviewer"],
    )
    with role_catalog.connected("auditor") as auditor:
        recorded = pg_roles.recorded_sessions(auditor.engine, table="releases")
        assert auditor.spent("survey").epsilon == pytest.approx(1.0, abs=1e-9)
        assert auditor.verify_chain() == []
    changes = [(r["detail"], r["login_role"]) for r in recorded]
    op, rev = role_catalog.logins["operator"], role_catalog.logins["reviewer"]
    assert changes == [("measuring", op), ("staged", op), ("approved", rev), ("published", rev)]


def test_apply_creates_every_module_table_as_the_module_would(role_catalog: RoleCatalog) -> None:
    """Tables are created by the custodian (the others may not create): each module's table
    with its indexes, so a module's own create-at-first-use finds it complete."""
    with role_catalog.connected("auditor") as auditor:
        inspector = sa.inspect(auditor.engine)
        for table in catalog_tables():
            assert inspector.has_table(table.name), table.name
            have = {index["name"] for index in inspector.get_indexes(table.name)}
            assert {str(index.name) for index in table.indexes} <= have, table.name


def test_the_database_owner_with_createrole_applies_the_roles(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only a superuser: the role of "Setting up" (it owns the database and created the
    tables) with CREATEROLE, as deploy/postgres.md says."""
    suffix = uuid.uuid4().hex[:10]
    owner, database = f"owner_{suffix}", f"owned_{suffix}"
    with psycopg.connect(postgres_server.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{owner}" LOGIN CREATEROLE')
        conn.execute(f'CREATE DATABASE "{database}" OWNER "{owner}"')
    url = f"postgresql+psycopg://127.0.0.1:{postgres_server.port}/{database}"
    with monkeypatch.context() as patch:
        patch.setenv("PGUSER", owner)
        patch.setenv("DPRELEASE_CATALOG_URL", url)
        result = runner.invoke(app, ["catalog", "roles", "--apply", "--prefix", f"o{suffix}"])
    assert result.exit_code == 0, result.output
    roles = pg_roles.RoleNames.with_prefix(f"o{suffix}")
    shared = RoleCatalog(url, roles, create_logins(postgres_server, roles), monkeypatch)
    with shared.connected("operator") as operator:
        run_to_staged(operator)
        denied(lambda: operator.record_review("rel-1", decision="approved", reviewer="M", note=""))


def test_only_the_custodian_migrates_the_catalog(role_catalog: RoleCatalog) -> None:
    """After an upgrade an operator's first command does not migrate (it may not change the
    tables): it is refused with what to do, until the custodian has opened the catalog."""
    version = catalog_meta.c.key == "version"
    with role_catalog.connected("superuser") as custodian:  # as an older dprelease left it
        execute(custodian, catalog_meta.update().where(version).values(value="2"))
    refused = pytest.raises(CatalogError, match=r"cannot be opened by this database role")
    with refused as info, role_catalog.connected("operator"):
        pass
    assert "only the custodian creates or migrates" in str(info.value)
    with role_catalog.connected("superuser"):
        pass  # migrates
    with role_catalog.connected("operator") as operator:
        run_to_staged(operator)
        assert operator.verify_chain() == []


# --- without a server --------------------------------------------------------------------------


def test_roles_need_the_postgresql_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_CATALOG_URL", f"sqlite:///{tmp_path}/catalog.db")
    for command in (["roles", "--print"], ["roles", "--apply"], ["sessions"]):
        result = runner.invoke(app, ["catalog", *command])
        assert result.exit_code == 2, result.output
        assert "database roles need the PostgreSQL catalog" in result.output
    assert not (tmp_path / "catalog.db").exists()


def test_roles_need_exactly_one_of_print_and_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_CATALOG_URL", "postgresql+psycopg://db.example/dprelease")
    for options in ([], ["--print", "--apply"]):
        result = runner.invoke(app, ["catalog", "roles", *options])
        assert result.exit_code == 2, result.output
        assert "exactly one of --print and --apply" in result.output


@pytest.mark.parametrize("prefix", ["", "Ops", "a-b", "x" * 42, "1st", "a;DROP"])
def test_a_role_prefix_must_be_a_plain_role_name(prefix: str) -> None:
    with pytest.raises(CatalogError, match=r"role prefix .* must be 1 to 41 lowercase"):
        pg_roles.RoleNames.with_prefix(prefix)


def test_print_shows_each_roles_grants_without_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPRELEASE_CATALOG_URL", "postgresql+psycopg://127.0.0.1:1/nowhere")
    result = runner.invoke(app, ["catalog", "roles", "--print", "--prefix", "acme"])
    assert result.exit_code == 0, result.output
    sql = result.stdout
    assert "GRANT INSERT ON reviews TO acme_reviewer;" in sql
    assert "GRANT INSERT ON ledger TO acme_operator;" in sql
    assert "GRANT INSERT, UPDATE (partitioned_by) ON datasets TO acme_operator;" in sql
    assert "GRANT SELECT ON ledger TO acme_operator, acme_reviewer, acme_auditor;" in sql
    assert "acme_auditor;" in sql and "TO acme_auditor" not in sql.replace(
        "acme_reviewer, acme_auditor", ""
    )  # the auditor is granted reading only


def test_every_table_dprelease_keeps_declares_who_writes_it() -> None:
    """A module that adds a table must say which role writes it (else only the custodian may)."""
    tables = catalog_tables()
    assert pg_roles.undeclared_tables(tables) == []
    names = {table.name for table in tables}
    from dprelease.catalog.ledger.schema import AUXILIARY_TABLES, metadata

    assert set(metadata.tables) <= names
    unhanded = AUXILIARY_TABLES - names  # granted read-only, guarded by their existence
    assert "review_policies" in names and "entry_sessions" in names
    assert unhanded <= {"ldp_collections", "review_signatures"}, unhanded
