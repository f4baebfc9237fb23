"""A catalog URL's password never appears in a message (the rest of the URL is public)."""

from __future__ import annotations

import pytest

from dprelease.catalog.errors import DprReleaseError
from dprelease.catalog.ledger.database import redacted
from dprelease.catalog.ledger.store import Catalog


def test_redacted_hides_only_the_password() -> None:
    assert redacted("postgresql+psycopg://alice:s3cret@db.example:5432/cat") == (
        "postgresql+psycopg://alice:***@db.example:5432/cat"
    )
    assert redacted("sqlite:////srv/catalog.db") == "sqlite:////srv/catalog.db"


def test_unreachable_catalog_error_names_the_url_without_its_password() -> None:
    url = "postgresql+psycopg://alice:s3cret@127.0.0.1:1/catalog"  # port 1: refused at once
    with pytest.raises(DprReleaseError) as caught:
        Catalog(url).list_releases()
    message = str(caught.value)
    assert "s3cret" not in message
    assert "127.0.0.1" in message
