"""Database roles for a PostgreSQL catalog: who may write which table, enforced by the server.

Four group roles (``NOLOGIN``; people and services log in as their own roles, members of one):

* **custodian** owns every catalog table (creates, migrates, changes the marker rows);
* **operator** runs, recovers and watches releases: registers datasets (never changes a cap),
  appends ledger entries (never updates or deletes one), registers releases and moves them
  through ``measuring → staged | failed | aborted``, records review policies and notifications,
  arrival claims, paused runs and synthetic files;
* **reviewer** appends review decisions and moves a staged release to approved, rejected and
  published (status, publication target, manifest hash; nothing else of it);
* **auditor** reads every table and writes none (``budget``, ``show``, ``verify``, ``releases``).

Everyone reads every table: nothing in the catalog is confidential (counts never reach it).  The
privileges are derived from :data:`TABLE_ACCESS` and the tables handed in (each module's
``MetaData``), never from SQL written by hand: a table without an entry in
:data:`TABLE_ACCESS` (a module added later) is readable by every role and written by the
custodian only, until it gets one.  ``SELECT … FOR UPDATE`` needs an ``UPDATE`` privilege in
PostgreSQL: the operator's lock on the chain row (``catalog_meta``) is granted ``UPDATE (value)``
and a trigger refuses the update itself to anyone but the custodian.  Operators and reviewers
both update ``releases.status``: a trigger allows each only its own statuses, and a review
status only with its decision in ``reviews`` (:func:`_status_guard`).

Who wrote each entry is recorded by the database, not by the client: an ``AFTER INSERT`` trigger
on every table with a :attr:`TableAccess.recorded_by` column (and on every status change of a
release) appends the login role (``session_user``, which ``SET ROLE`` does not change) and the
client address to ``entry_sessions``.  A side table rather than a ledger column: the ledger's
columns are what its hash chain covers and what SQLite and PostgreSQL share (schema version 3
unchanged), and the trigger runs as the custodian (``SECURITY DEFINER``), so a writer can neither
skip nor forge the row; every role may only read it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger.chain import DECISION_KIND
from dprelease.catalog.ledger.database import redacted
from dprelease.catalog.ledger.schema import AUXILIARY_TABLES, STATUSES, lock_schema, metadata

ROLE_KINDS = ("custodian", "operator", "reviewer", "auditor")
DEFAULT_PREFIX = "dprelease"
_ROLE_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")
SESSION_FUNCTION = "dprelease_record_session"
GUARD_FUNCTION = "dprelease_guard_catalog_meta"
SESSION_TRIGGER = "dprelease_session"
STATUS_TRIGGER = "dprelease_session_status"
GUARD_TRIGGER = "dprelease_guard"
STATUS_GUARD_FUNCTION = "dprelease_guard_release_status"
LEDGER_GUARD_FUNCTION = "dprelease_guard_ledger_entry"
# The statuses a review decides (each needs its review row); the others are the run's.
REVIEW_STATUSES = ("approved", "rejected", "published")
RUN_STATUSES = tuple(status for status in STATUSES if status not in REVIEW_STATUSES)
SCHEMA = "public"  # where dprelease creates its tables (the connection's default schema)

session_metadata = sa.MetaData()

entry_sessions = sa.Table(
    "entry_sessions",
    session_metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=True),
    sa.Column("table_name", sa.String(63), nullable=False),
    sa.Column("operation", sa.String(8), nullable=False),  # INSERT, or UPDATE of a status
    sa.Column("entry_key", sa.Text, nullable=False),  # the row's TableAccess.recorded_by column
    sa.Column("detail", sa.Text),  # e.g. a decision, a release's new status
    sa.Column("login_role", sa.String(63), nullable=False),  # session_user
    sa.Column("client_addr", sa.String(64)),  # None: a Unix-socket connection
    sa.Column(
        "recorded_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("clock_timestamp()"),
    ),
)


@dataclass(frozen=True, kw_only=True)
class Writes:
    """What one role may write in one table (it may always read it)."""

    insert: bool = False
    delete: bool = False
    update: tuple[str, ...] = ()  # columns; PostgreSQL's column-level UPDATE privilege


@dataclass(frozen=True, kw_only=True)
class TableAccess:
    """Who writes one table, and which column names an entry in ``entry_sessions``."""

    operator: Writes = Writes()
    reviewer: Writes = Writes()
    recorded_by: str | None = None
    detail: str | None = None  # a column recorded with each entry (None: nothing)
    status_changes: bool = False  # also record every change of the ``status`` column


READ_ONLY = TableAccess()
_RELEASE_RUN_COLUMNS = (
    "status",
    "input_fingerprint",
    "directory",
    "manifest_sha256",
    "updated_at",
    "heartbeat_at",
    "interrupted_at",
)
_RELEASE_REVIEW_COLUMNS = ("status", "published_directory", "manifest_sha256", "updated_at")

TABLE_ACCESS: dict[str, TableAccess] = {
    # the chain row is locked FOR UPDATE by every ledger write; the guard refuses the update
    "catalog_meta": TableAccess(
        operator=Writes(update=("value",)), reviewer=Writes(update=("value",))
    ),
    # a cap is registered once and never changed; a partitioning may be added once
    "datasets": TableAccess(
        operator=Writes(insert=True, update=("partitioned_by",)), recorded_by="id"
    ),
    # reviewers append only zero-cost decision entries (:func:`_ledger_guard`)
    "ledger": TableAccess(
        operator=Writes(insert=True),
        reviewer=Writes(insert=True),
        recorded_by="receipt_id",
        detail="entry_kind",
    ),
    "releases": TableAccess(
        operator=Writes(insert=True, update=_RELEASE_RUN_COLUMNS),
        reviewer=Writes(update=_RELEASE_REVIEW_COLUMNS),
        recorded_by="id",
        detail="status",
        status_changes=True,
    ),
    "reviews": TableAccess(reviewer=Writes(insert=True), recorded_by="seq", detail="decision"),
    "review_policies": TableAccess(
        operator=Writes(insert=True, update=("notified_at", "notify_error")),
        recorded_by="release_id",
    ),
    "announced_files": TableAccess(operator=Writes(insert=True, delete=True)),
    "review_runs": TableAccess(
        operator=Writes(insert=True, delete=True, update=("status", "updated_at")),
        reviewer=Writes(update=("status", "updated_at")),  # a paused run that expired
    ),
    "synthetic_files": TableAccess(operator=Writes(insert=True), recorded_by="seq"),
    # keys registered with roles: written with their ledger entry by the custodian only
    "identity_entries": TableAccess(recorded_by="receipt_id", detail="action"),
    "signed_steps": TableAccess(operator=Writes(insert=True), recorded_by="id", detail="step"),
    "review_signatures": TableAccess(
        reviewer=Writes(insert=True), recorded_by="id", detail="decision"
    ),
    # a series' plan (with its zero-cost ledger entry) and each released period: its run
    "series_plans": TableAccess(operator=Writes(insert=True), recorded_by="receipt_id"),
    "series_periods": TableAccess(
        operator=Writes(insert=True), recorded_by="release_id", detail="period"
    ),
    # one run per period: the operator's run claims it, a lapsed claim (failed run) is replaced
    "series_claims": TableAccess(
        operator=Writes(insert=True, delete=True), recorded_by="release_id", detail="period"
    ),
    "entry_sessions": READ_ONLY,  # written by the trigger only
}


@dataclass(frozen=True, kw_only=True)
class RoleNames:
    """The four group roles' names (public)."""

    custodian: str
    operator: str
    reviewer: str
    auditor: str

    @classmethod
    def with_prefix(cls, prefix: str = DEFAULT_PREFIX) -> RoleNames:
        """``PREFIX_custodian``, ``PREFIX_operator``, ``PREFIX_reviewer``, ``PREFIX_auditor``."""
        if not isinstance(prefix, str) or not _ROLE_PREFIX.fullmatch(prefix):
            raise CatalogError(
                f"role prefix {prefix!r} must be 1 to 41 lowercase letters, digits or '_', "
                "starting with a letter or '_' (a PostgreSQL role name without quoting)"
            )
        return cls(**{kind: f"{prefix}_{kind}" for kind in ROLE_KINDS})

    def readers(self) -> tuple[str, str, str]:
        return (self.operator, self.reviewer, self.auditor)


def require_postgresql(url: str) -> None:
    """Refuse a catalog that is not PostgreSQL: roles and GRANTs are the server's."""
    backend = sa.engine.make_url(url).get_backend_name()
    if backend != "postgresql":
        raise CatalogError(
            f"catalog {redacted(url)} is {backend}, not PostgreSQL: database roles need the "
            "PostgreSQL catalog (SQLite has no roles or GRANTs; its file's permissions are all "
            "it has). Set DPRELEASE_CATALOG_URL=postgresql+psycopg://HOST/DATABASE "
            "(deploy/postgres.md)"
        )


def role_statements(
    tables: Sequence[sa.Table],
    *,
    roles: RoleNames,
    auxiliary: Iterable[str] = AUXILIARY_TABLES,
) -> list[str]:
    """The SQL that sets up the roles on a PostgreSQL catalog, one statement per item, to run in
    one transaction by a superuser or a role with CREATEROLE that owns the catalog's tables.
    Idempotent: running it again (after an upgrade added tables) resets every grant.

    ``tables``: every table dprelease keeps in the catalog database (the core ``metadata``'s and
    each module's own); those outside the core are created when missing.  ``auxiliary``: names of
    tables other modules may keep there; one not among ``tables`` is granted read-only, when it
    exists.  O(tables + columns)."""
    quote = postgresql.dialect().identifier_preparer.quote
    by_name = {table.name: table for table in (*tables, entry_sessions)}
    custodian, operator, reviewer, auditor = (
        quote(name) for name in (roles.custodian, roles.operator, roles.reviewer, roles.auditor)
    )
    readers = ", ".join((operator, reviewer, auditor))
    every = ", ".join((custodian, readers))
    space = quote(SCHEMA)
    statements = [_require_catalog(space)]
    statements += [
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN "
        f"CREATE ROLE {quote(name)} NOLOGIN; END IF; END $$"
        for name in (roles.custodian, roles.operator, roles.reviewer, roles.auditor)
    ]
    statements += [
        # the role running this becomes a custodian: ALTER … OWNER needs the membership
        f"GRANT {custodian} TO CURRENT_USER",
        "DO $$ BEGIN EXECUTE 'REVOKE ALL ON DATABASE ' || quote_ident(current_database()) || "
        f"' FROM PUBLIC'; EXECUTE 'GRANT CONNECT ON DATABASE ' || "
        f"quote_ident(current_database()) || ' TO {every}'; END $$",
        f"REVOKE CREATE ON SCHEMA {space} FROM PUBLIC",
        f"GRANT USAGE, CREATE ON SCHEMA {space} TO {custodian}",
        f"GRANT USAGE ON SCHEMA {space} TO {readers}",
    ]
    dialect = postgresql.dialect()
    for name, table in sorted(by_name.items()):  # what the module would create at first use
        if name in metadata.tables:
            continue
        created = [sa.schema.CreateTable(table, if_not_exists=True)]
        created += [
            sa.schema.CreateIndex(index, if_not_exists=True)
            for index in sorted(table.indexes, key=lambda index: str(index.name))
        ]
        statements += [str(ddl.compile(dialect=dialect)).strip() for ddl in created]
        # a nullable column a later version added to a table created earlier
        statements += [
            f"ALTER TABLE {quote(name)} ADD COLUMN IF NOT EXISTS {quote(column.name)} "
            f"{column.type.compile(dialect=dialect)}"
            for column in table.columns
            if column.nullable and not column.primary_key and column.server_default is None
        ]
    for name, table in sorted(by_name.items()):
        statements += _table_grants(name, roles=roles, table=table)
    for name in sorted(set(auxiliary) - set(by_name)):  # kept by a module not handed in
        guarded = " ".join(f"EXECUTE '{line}';" for line in _table_grants(name, roles=roles))
        statements.append(
            f"DO $$ BEGIN IF to_regclass('{SCHEMA}.{name}') IS NOT NULL THEN {guarded} "
            "END IF; END $$"
        )
    statements += _session_triggers(by_name, roles=roles)
    statements += _meta_guard(roles=roles)
    statements += _status_guard(roles=roles)
    statements += _ledger_guard(roles=roles)
    statements.append(
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {custodian} IN SCHEMA {space} "
        f"GRANT SELECT ON TABLES TO {readers}"
    )
    return statements


def undeclared_tables(tables: Iterable[sa.Table]) -> list[str]:
    """Tables without an entry in :data:`TABLE_ACCESS`: read-only for every role but the
    custodian until one is added (what ``dprelease catalog roles`` warns about)."""
    return sorted({table.name for table in tables} - set(TABLE_ACCESS))


def script(statements: Sequence[str], *, roles: RoleNames) -> str:
    """``statements`` as one psql script (what ``dprelease catalog roles --print`` shows)."""
    head = [
        "-- dprelease catalog roles: run once as a superuser (or a CREATEROLE role owning the",
        "-- catalog's tables) in the catalog database, after the catalog exists; again after",
        "-- an upgrade. Group roles: "
        + ", ".join(getattr(roles, kind) for kind in ROLE_KINDS)
        + ".",
        "BEGIN;",
    ]
    return "\n".join([*head, *(f"{s};" for s in statements), "COMMIT;", ""])


def _require_catalog(space: str) -> str:
    return (
        f"DO $$ BEGIN IF to_regclass('{space}.catalog_meta') IS NULL THEN RAISE EXCEPTION "
        "'the dprelease catalog does not exist in this database yet: run any dprelease command "
        "against it as the custodian first'; END IF; END $$"
    )


def _table_grants(name: str, *, roles: RoleNames, table: sa.Table | None = None) -> list[str]:
    """Ownership, reading for every role and each role's writes on table ``name`` (its columns
    checked and its SERIAL key's sequence granted when its ``table`` is known)."""
    quote = postgresql.dialect().identifier_preparer.quote
    quoted = quote(name)
    access = TABLE_ACCESS.get(name, READ_ONLY)
    readers = ", ".join(quote(r) for r in roles.readers())
    statements = [
        f"ALTER TABLE {quoted} OWNER TO {quote(roles.custodian)}",
        f"REVOKE ALL ON {quoted} FROM PUBLIC, {readers}",
        f"GRANT SELECT ON {quoted} TO {readers}",
    ]
    serial = None if table is None else table.autoincrement_column
    for role, writes in ((roles.operator, access.operator), (roles.reviewer, access.reviewer)):
        privileges = [
            kind for kind, on in (("INSERT", writes.insert), ("DELETE", writes.delete)) if on
        ]
        if writes.update:
            missing = [c for c in writes.update if table is not None and c not in table.c]
            if missing:
                raise CatalogError(
                    f"TABLE_ACCESS[{name!r}] grants UPDATE of columns {missing} the table lacks"
                )
            privileges.append(f"UPDATE ({', '.join(quote(c) for c in writes.update)})")
        if privileges:
            statements.append(f"GRANT {', '.join(privileges)} ON {quoted} TO {quote(role)}")
        if writes.insert and serial is not None:  # nextval() of the SERIAL key
            sequence = quote(f"{name}_{serial.name}_seq")
            statements.append(f"GRANT USAGE ON SEQUENCE {sequence} TO {quote(role)}")
    return statements


def _session_triggers(tables: dict[str, sa.Table], *, roles: RoleNames) -> list[str]:
    quote = postgresql.dialect().identifier_preparer.quote
    space = quote(SCHEMA)
    function = f"{space}.{SESSION_FUNCTION}"
    statements = [
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        "SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$ BEGIN "
        f"INSERT INTO {space}.entry_sessions "
        "(table_name, operation, entry_key, detail, login_role, client_addr) VALUES "
        "(TG_TABLE_NAME, TG_OP, to_jsonb(NEW) ->> TG_ARGV[0], "
        "CASE WHEN TG_NARGS > 1 THEN to_jsonb(NEW) ->> TG_ARGV[1] END, "
        "session_user, host(inet_client_addr())); RETURN NULL; END $fn$",
        f"ALTER FUNCTION {function}() OWNER TO {quote(roles.custodian)}",
        f"REVOKE ALL ON FUNCTION {function}() FROM PUBLIC",
    ]
    for name, table in sorted(tables.items()):
        access = TABLE_ACCESS.get(name, READ_ONLY)
        if access.recorded_by is None:
            continue
        arguments = ", ".join(f"'{c}'" for c in (access.recorded_by, access.detail) if c)
        for column in (access.recorded_by, access.detail):
            if column is not None and column not in table.c:
                raise CatalogError(
                    f"TABLE_ACCESS[{name!r}] records column {column!r} the table lacks"
                )
        statements += [
            f"DROP TRIGGER IF EXISTS {SESSION_TRIGGER} ON {quote(name)}",
            f"CREATE TRIGGER {SESSION_TRIGGER} AFTER INSERT ON {quote(name)} FOR EACH ROW "
            f"EXECUTE FUNCTION {function}({arguments})",
        ]
        if access.status_changes:
            statements += [
                f"DROP TRIGGER IF EXISTS {STATUS_TRIGGER} ON {quote(name)}",
                f"CREATE TRIGGER {STATUS_TRIGGER} AFTER UPDATE OF status ON {quote(name)} "
                "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) "
                f"EXECUTE FUNCTION {function}({arguments})",
            ]
    return statements


def _meta_guard(*, roles: RoleNames) -> list[str]:
    """The operator's UPDATE privilege on ``catalog_meta`` only serves its row lock: the
    update itself is refused to anyone who is not a custodian (superusers are)."""
    quote = postgresql.dialect().identifier_preparer.quote
    function = f"{quote(SCHEMA)}.{GUARD_FUNCTION}"
    return [
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        "SET search_path = pg_catalog, pg_temp AS $fn$ BEGIN "
        f"IF NOT pg_has_role(current_user, '{roles.custodian}', 'USAGE') THEN "
        "RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = "
        f"'permission denied for table catalog_meta: only members of {roles.custodian} change "
        "it'; END IF; RETURN NEW; END $fn$",
        f"ALTER FUNCTION {function}() OWNER TO {quote(roles.custodian)}",
        f"DROP TRIGGER IF EXISTS {GUARD_TRIGGER} ON catalog_meta",
        f"CREATE TRIGGER {GUARD_TRIGGER} BEFORE UPDATE ON catalog_meta FOR EACH ROW "
        f"EXECUTE FUNCTION {function}()",
    ]


def apply(engine: Engine, statements: Sequence[str]) -> None:
    """Run ``statements`` in one transaction, under the schema lock (a concurrent first use that
    creates a table waits).  PostgreSQL only: :func:`require_postgresql` first."""
    with engine.begin() as conn:
        lock_schema(conn)
        for statement in statements:
            conn.exec_driver_sql(statement)


def recorded_sessions(engine: Engine, *, table: str | None = None) -> list[dict[str, object]]:
    """The rows of ``entry_sessions`` (of one catalog table), oldest first; empty when the roles
    were never applied.  O(rows)."""
    if not sa.inspect(engine).has_table(entry_sessions.name):
        return []
    query = sa.select(entry_sessions).order_by(entry_sessions.c.seq)
    if table is not None:
        query = query.where(entry_sessions.c.table_name == table)
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query)]


def _status_guard(*, roles: RoleNames) -> list[str]:
    """Both operators and reviewers update ``releases.status``; a column privilege cannot say to
    which values.  This trigger does: a release is registered ``measuring``; only an operator
    moves it to a run status (:data:`RUN_STATUSES`), only a reviewer to approved or rejected
    (with that decision's review row) or published (with an approval).  A custodian may do
    anything.  O(reviews of the release) per status change."""
    quote = postgresql.dialect().identifier_preparer.quote
    space = quote(SCHEMA)
    function = f"{space}.{STATUS_GUARD_FUNCTION}"
    run = ", ".join(f"'{status}'" for status in RUN_STATUSES)
    denied = "RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = "
    return [
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        "SET search_path = pg_catalog, pg_temp AS $fn$ BEGIN "
        f"IF pg_has_role(current_user, '{roles.custodian}', 'USAGE') THEN RETURN NEW; END IF; "
        "IF TG_OP = 'INSERT' THEN IF NEW.status <> 'measuring' THEN "
        f"{denied}'permission denied for table releases: a release is registered measuring'; "
        "END IF; RETURN NEW; END IF; "
        "IF NEW.status IS NOT DISTINCT FROM OLD.status THEN RETURN NEW; END IF; "
        f"IF NEW.status IN ({run}) THEN "
        f"IF NOT pg_has_role(current_user, '{roles.operator}', 'USAGE') THEN "
        f"{denied}'permission denied for table releases: only members of {roles.operator} "
        "set a run status (' || NEW.status || ')'; END IF; RETURN NEW; END IF; "
        f"IF NOT pg_has_role(current_user, '{roles.reviewer}', 'USAGE') THEN "
        f"{denied}'permission denied for table releases: only members of {roles.reviewer} "
        "set a review status (' || NEW.status || ')'; END IF; "
        f"IF NOT EXISTS (SELECT FROM {space}.reviews r WHERE r.release_id = NEW.id AND "
        "r.decision = CASE WHEN NEW.status = 'published' THEN 'approved' ELSE NEW.status END) "
        f"THEN {denied}'permission denied for table releases: status ' || NEW.status || "
        "' needs its review decision in table reviews'; END IF; RETURN NEW; END $fn$",
        f"ALTER FUNCTION {function}() OWNER TO {quote(roles.custodian)}",
        f"DROP TRIGGER IF EXISTS {GUARD_TRIGGER} ON releases",
        f"CREATE TRIGGER {GUARD_TRIGGER} BEFORE INSERT OR UPDATE OF status ON releases "
        f"FOR EACH ROW EXECUTE FUNCTION {function}()",
    ]


def _ledger_guard(*, roles: RoleNames) -> list[str]:
    """Reviewers append a review decision's ledger entry in the decision's transaction: the
    INSERT privilege cannot say which entries, this trigger does.  A login that is not an
    operator (nor a custodian) may append only a zero-cost whole-dataset entry of kind
    ``decision``: never a charge, a key or any other kind.  O(1) per entry."""
    quote = postgresql.dialect().identifier_preparer.quote
    function = f"{quote(SCHEMA)}.{LEDGER_GUARD_FUNCTION}"
    denied = "RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = "
    return [
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        "SET search_path = pg_catalog, pg_temp AS $fn$ BEGIN "
        f"IF pg_has_role(current_user, '{roles.custodian}', 'USAGE') "
        f"OR pg_has_role(current_user, '{roles.operator}', 'USAGE') THEN RETURN NEW; END IF; "
        f"IF NEW.entry_kind = '{DECISION_KIND}' AND NEW.epsilon = 0 AND NEW.rho = 0 "
        "AND NEW.delta = 0 AND NEW.partition_key IS NULL THEN RETURN NEW; END IF; "
        f"{denied}'permission denied for table ledger: members of {roles.reviewer} append "
        f"only zero-cost {DECISION_KIND} entries (not ' || NEW.entry_kind || ')'; "
        "END $fn$",
        f"ALTER FUNCTION {function}() OWNER TO {quote(roles.custodian)}",
        f"DROP TRIGGER IF EXISTS {GUARD_TRIGGER} ON ledger",
        f"CREATE TRIGGER {GUARD_TRIGGER} BEFORE INSERT ON ledger FOR EACH ROW "
        f"EXECUTE FUNCTION {function}()",
    ]
