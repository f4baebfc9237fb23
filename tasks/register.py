"""Task: every public check (input size, output folder, budget) before any data is read; record intent."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.ledger.store import Catalog, SkippedRelease
from catalog.planning import Plan
from catalog.spec.model import ReleaseSpec
from mechanisms.privacy import PrivacyCost


@task(name="check-budget", cache_policy=NO_CACHE, retries=0)
def register_task(
    spec: ReleaseSpec,
    plan: Plan,
    catalog_url: str,
    release_id: str,
    directory: str,
    on_unchanged: Literal["skip", "release"] = "release",
) -> PrivacyCost | SkippedRelease:
    return release.register(
        spec,
        plan,
        Catalog(catalog_url),
        release_id=release_id,
        directory=Path(directory),
        on_unchanged=on_unchanged,
    )
