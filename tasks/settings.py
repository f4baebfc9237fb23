"""Where Prefect keeps the persisted results of cacheable (public) tasks."""

from __future__ import annotations

from pathlib import Path

from catalog.home import default_home


def result_storage() -> Path:
    """``$DPRELEASE_HOME/prefect-results``: a ``Path`` means local storage with no server-side block."""
    path = default_home() / "prefect-results"
    path.mkdir(parents=True, exist_ok=True)
    return path
