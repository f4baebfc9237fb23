"""Task: read the input the chosen mechanism measures — the only task that touches raw data.

Privacy: ``retries=0`` (nothing is re-read behind the ledger's back), no cache (the inputs must not
be hashed into keys), no persisted result (the counts must never reach result storage; the
returned ``ProtectedCells`` refuses pickling anyway), no printed logs.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.ledger.store import Catalog
from catalog.planning import Plan
from catalog.spec.model import ReleaseSpec


@task(name="ingest", retries=0, cache_policy=NO_CACHE, persist_result=False, log_prints=False)
def ingest_task(spec: ReleaseSpec, plan: Plan, catalog_url: str) -> release.Ingested:
    return release.ingest(spec, plan, Catalog(catalog_url))
