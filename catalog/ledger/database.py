"""Where the catalog lives and how it is opened: its URL, the SQLAlchemy engine, redaction."""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dprelease.catalog import keys
from dprelease.catalog.errors import CatalogError
from dprelease.catalog.home import default_home

SQLITE_HEADER = b"SQLite format 3\x00"
PG_CONNECT_TIMEOUT = 10
"""Seconds a PostgreSQL connection may take to open (libpq's ``connect_timeout``) unless the URL
sets ``?connect_timeout=``: an unreachable catalog host fails with a CatalogError in seconds, not
after the operating system's TCP time-out (minutes)."""
PERMISSION_DENIED = "42501"  # PostgreSQL's SQLSTATE: the role lacks a privilege (ledger.pg_roles)


def default_url() -> str:
    url = os.environ.get("DPRELEASE_CATALOG_URL")
    if url:
        return url
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'catalog.db'}"


def make_engine(url: str) -> Engine:
    """The engine of the catalog database at ``url`` (also used for the tables other modules keep
    in it).  SQLite takes its write lock at the start of every transaction."""
    if not url.startswith("sqlite"):
        connect_args: dict[str, Any] = {}
        if url.startswith("postgresql") and "connect_timeout" not in sa.engine.make_url(url).query:
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT
        try:
            return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        except (ModuleNotFoundError, sa.exc.NoSuchModuleError) as exc:
            raise CatalogError(
                f"catalog URL {redacted(url)} needs a database driver that is not installed "
                f"({exc}); for PostgreSQL write postgresql+psycopg://… (psycopg is installed with "
                "dprelease)"
            ) from None
    if keys.key_path(url) is None:  # in memory: one connection shared by all users
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False}, poolclass=sa.pool.StaticPool
        )
    else:
        engine = sa.create_engine(url, connect_args={"timeout": 120})

    @sa.event.listens_for(engine, "connect")
    def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy's "begin" event issue BEGIN

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(conn: Connection) -> None:
        # Take SQLite's write lock at the start of every transaction: the budget check and the
        # ledger insert of two processes can then never interleave.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def dispose_with(owner: object, engine: Engine) -> None:
    """Close a client-server engine's pooled connections when ``owner`` is garbage-collected (an
    engine lives on in reference cycles, and psycopg warns about connections left open)."""
    if engine.dialect.name != "sqlite":
        weakref.finalize(owner, engine.dispose)


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``: what messages may show of a catalog URL."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url.split("@")[-1] if "@" in url else url


def refuse_foreign_file(url: str) -> None:
    """An SQLite catalog path must be an SQLite database (or not exist yet); never overwritten."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return
    path = Path(parsed.database)
    if parsed.database == ":memory:" or not path.exists():
        return
    if not path.is_file():
        raise CatalogError(f"catalog path {path} is not a file; point the catalog at a file")
    with open(path, "rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if header and header != SQLITE_HEADER:  # an empty file is an empty SQLite database
        raise CatalogError(
            f"catalog file {path} is not an SQLite database; it was left unchanged. Point "
            "DPRELEASE_HOME or DPRELEASE_CATALOG_URL at a dprelease catalog, or move the file away"
        )
