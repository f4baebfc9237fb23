"""A PostgreSQL catalog whose server accepts the connection but never answers fails within
``PG_CONNECT_TIMEOUT`` with a CatalogError naming the URL, not after minutes; a
``connect_timeout`` in the URL wins."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.ledger import database
from dprelease.catalog.ledger.store import Catalog


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that completes TCP handshakes (kernel backlog) and never replies."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_default_connect_timeout_bounds_a_silent_server(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "PG_CONNECT_TIMEOUT", 2)
    url = f"postgresql+psycopg://alice:s3cret@127.0.0.1:{silent_port}/catalog"
    started = time.monotonic()
    with pytest.raises(
        CatalogError,
        match=f"catalog postgresql\\+psycopg://alice:\\*\\*\\*@127.0.0.1:{silent_port}/catalog cannot be opened",
    ):
        Catalog(url)
    assert time.monotonic() - started < 20  # 2 s per attempt; libpq may try each address once


def test_url_connect_timeout_wins(silent_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "PG_CONNECT_TIMEOUT", 600)
    url = f"postgresql+psycopg://alice@127.0.0.1:{silent_port}/catalog?connect_timeout=2"
    started = time.monotonic()
    with pytest.raises(CatalogError, match="cannot be opened"):
        Catalog(url)
    assert time.monotonic() - started < 20


def test_sqlite_engines_get_no_libpq_argument(tmp_path) -> None:
    engine = database.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    assert engine.dialect.name == "sqlite"
