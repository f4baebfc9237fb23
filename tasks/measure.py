"""Task: charge the ledger, then add vetted noise to the strategy's answers (never cached, never retried)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.ledger import Catalog
from catalog.planning import Plan
from catalog.source import CountResult
from catalog.spec import ReleaseSpec
from mechanisms.session import NoisyMeasurement


@task(name="measure", retries=0, cache_policy=NO_CACHE, persist_result=False, log_prints=False)
def measure_task(
    counted: CountResult, spec: ReleaseSpec, plan: Plan, catalog_url: str, release_id: str
) -> NoisyMeasurement:
    return release.measure(counted, spec, plan, Catalog(catalog_url), release_id=release_id)
