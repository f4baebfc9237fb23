"""Task: the chosen mechanism charges the ledger, then adds vetted noise (never cached or retried)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.ledger.store import Catalog
from catalog.planning import Plan
from catalog.spec.model import ReleaseSpec
from mechanisms.protocol import Measurement


@task(name="measure", retries=0, cache_policy=NO_CACHE, persist_result=False, log_prints=False)
def measure_task(
    ingested: release.Ingested, spec: ReleaseSpec, plan: Plan, catalog_url: str, release_id: str
) -> Measurement:
    return release.measure(ingested, spec, plan, Catalog(catalog_url), release_id=release_id)
