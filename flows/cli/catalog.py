"""``dprelease catalog``: administration of the catalog database (database roles on PostgreSQL).

``dprelease catalog roles --print`` shows the SQL that gives operators, reviewers and auditors
their own database roles (:mod:`catalog.ledger.pg_roles`); ``--apply`` runs it, as the custodian
(a superuser, or a CREATEROLE role that owns the catalog's tables)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated

import sqlalchemy as sa
import typer

from dprelease.catalog.errors import DprReleaseError
from dprelease.flows.cli.common import JsonOption, command_group, console, print_json, stdout

catalog_app = command_group(
    "catalog",
    "The catalog database: the database roles of a PostgreSQL catalog (custodian, operator, "
    "reviewer, auditor) and who wrote each entry.",
)


def catalog_tables() -> list[sa.Table]:
    """Every table dprelease keeps in the catalog database: the tables of each module-level
    ``MetaData`` of the catalog's modules (the core ``metadata`` and each module's own), found by
    importing every module of ``dprelease.catalog``, so a table added later is granted without
    naming it here.  O(modules)."""
    import dprelease.catalog

    found: dict[str, sa.Table] = {}
    prefix = f"{dprelease.catalog.__name__}."
    for module in pkgutil.walk_packages(dprelease.catalog.__path__, prefix):
        loaded = importlib.import_module(module.name)
        for value in vars(loaded).values():
            if isinstance(value, sa.MetaData):
                found.update(value.tables)
    return [found[name] for name in sorted(found)]


@catalog_app.command()
def roles(
    print_sql: Annotated[
        bool, typer.Option("--print", help="Print the SQL (a psql script); change nothing.")
    ] = False,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Run the SQL on DPRELEASE_CATALOG_URL (as a superuser, or a CREATEROLE role that "
            "owns the catalog's tables); idempotent.",
        ),
    ] = False,
    prefix: Annotated[
        str,
        typer.Option(
            help="Group roles PREFIX_custodian, PREFIX_operator, PREFIX_reviewer, PREFIX_auditor."
        ),
    ] = "dprelease",
) -> None:
    """Database roles for the PostgreSQL catalog: only operators append ledger charges, only
    reviewers append review decisions, auditors read; each entry's login role is recorded."""
    from dprelease.catalog.ledger import pg_roles
    from dprelease.catalog.ledger.database import default_url, redacted

    if print_sql == apply:
        raise DprReleaseError("dprelease catalog roles: give exactly one of --print and --apply")
    names = pg_roles.RoleNames.with_prefix(prefix)
    url = default_url()
    pg_roles.require_postgresql(url)
    tables = catalog_tables()
    statements = pg_roles.role_statements(tables, roles=names)
    if print_sql:
        typer.echo(pg_roles.script(statements, roles=names), nl=False)  # verbatim SQL
    else:
        from dprelease.catalog.ledger.store import Catalog

        catalog = Catalog(url)  # creates or migrates the core tables first
        pg_roles.apply(catalog.engine, statements)
        stdout.print(
            f"applied to {redacted(url)}: group roles "
            + ", ".join(getattr(names, kind) for kind in pg_roles.ROLE_KINDS)
            + f"; {len(tables)} tables granted"
        )
    for name in pg_roles.undeclared_tables(tables):
        console.print(
            f"note: table {name} has no entry in catalog.ledger.pg_roles.TABLE_ACCESS: every role "
            "reads it and only the custodian writes it"
        )


@catalog_app.command()
def sessions(
    table: Annotated[
        str | None, typer.Option(help="Only the entries of this table (e.g. ledger, reviews).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Which database login wrote each catalog entry (PostgreSQL catalog with roles applied):
    table, entry key, detail, login, client address and time, oldest first."""
    from dprelease.catalog.ledger import pg_roles
    from dprelease.catalog.ledger.database import default_url
    from dprelease.catalog.ledger.store import Catalog

    url = default_url()
    pg_roles.require_postgresql(url)
    catalog = Catalog(url)  # disposes its engine's connections when it goes
    rows = pg_roles.recorded_sessions(catalog.engine, table=table)
    if as_json:
        print_json(rows)
        return
    if not rows:
        stdout.print("no entry recorded (run `dprelease catalog roles --apply` first)")
    for row in rows:
        detail = f" ({row['detail']})" if row["detail"] else ""
        stdout.print(
            f"{row['recorded_at']}  {row['table_name']} {row['entry_key']}{detail}  by "
            f"{row['login_role']} from {row['client_addr'] or 'a local socket'}",
            markup=False,
            highlight=False,
        )
