"""Tasks of the local-model (LDP) release: the strategy (cached), register, ingest, charge, estimate,
validate, stage.  The logic lives in :mod:`catalog.ldp_release`.

The strategy task is data-free and cached by a public key: workload fingerprint, per-user ε and the
optimiser settings (the same facts as the on-disk StrategyStore key, which also serves the CLI and
other processes).  The response tasks are never cached, retried or persisted: the response counts
stay out of result storage and logs (they are ε-LDP, but the project keeps every data-derived
intermediate out of Prefect's storage).
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import ldp_release
from catalog.errors import DataError
from catalog.ldp_release import CollectionCharge, IngestedResponses, StrategyRecord
from catalog.ledger import Catalog
from catalog.release import StagedRelease
from catalog.spec import ReleaseSpec
from mechanisms.ldp import LDPStrategy
from mechanisms.privacy import PrivacyCost
from tasks.settings import result_storage

STRATEGY_CACHE_VERSION = "1"


def strategy_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    """Key = workload fingerprint + per-user ε + optimiser settings (all public), hashed."""
    spec: ReleaseSpec = parameters["spec"]
    settings = ldp_release.settings_for(spec)
    raw = json.dumps(
        [
            "ldp-strategy",
            STRATEGY_CACHE_VERSION,
            spec.workload_fingerprint(),
            ldp_release.require_local(spec),
            settings.key(),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(raw.encode()).hexdigest()


@task(
    name="ldp-strategy",
    cache_key_fn=strategy_cache_key,
    persist_result=True,
    result_storage=result_storage(),
    cache_expiration=timedelta(days=365),
)
def ldp_strategy_task(spec: ReleaseSpec) -> tuple[LDPStrategy, StrategyRecord]:
    return ldp_release.ensure_strategy(spec)


@task(name="ldp-check-budget", cache_policy=NO_CACHE, retries=0)
def ldp_register_task(
    spec: ReleaseSpec, strategy_fingerprint: str, catalog_url: str, release_id: str
) -> PrivacyCost:
    return ldp_release.register(
        spec, Catalog(catalog_url), release_id=release_id, strategy_fingerprint=strategy_fingerprint
    )


@task(
    name="ldp-ingest-responses",
    retries=0,
    cache_policy=NO_CACHE,
    persist_result=False,
    log_prints=False,
)
def ldp_ingest_task(spec: ReleaseSpec, strategy: LDPStrategy) -> IngestedResponses:
    if spec.dataset.source is None:  # register refused this already; kept for direct calls
        raise DataError("dataset.source is not set; a local-model release needs the responses")
    return ldp_release.ingest_responses(spec.dataset.source, strategy)


@task(name="ldp-charge-collection", retries=0, cache_policy=NO_CACHE, persist_result=False)
def ldp_charge_task(
    spec: ReleaseSpec, ingested: IngestedResponses, catalog_url: str, release_id: str
) -> CollectionCharge:
    return ldp_release.charge_collection(
        spec, Catalog(catalog_url), ingested, release_id=release_id
    )


@task(name="ldp-estimate", cache_policy=NO_CACHE, persist_result=False, log_prints=False)
def ldp_estimate_task(
    spec: ReleaseSpec, strategy: LDPStrategy, ingested: IngestedResponses
) -> dict[str, pa.Table]:
    return ldp_release.estimate_tables(spec, strategy, ingested)


@task(name="ldp-validate-outputs", cache_policy=NO_CACHE, persist_result=False)
def ldp_validate_task(
    spec: ReleaseSpec, tables: dict[str, pa.Table], directory: str
) -> dict[str, Any]:
    return ldp_release.validate(spec, tables, directory=Path(directory))


@task(name="ldp-stage-release", cache_policy=NO_CACHE, persist_result=False)
def ldp_stage_task(
    spec: ReleaseSpec,
    record: StrategyRecord,
    release_id: str,
    directory: str,
    ingested: IngestedResponses,
    charge: CollectionCharge,
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    spent_before: PrivacyCost,
    catalog_url: str,
) -> StagedRelease:
    return ldp_release.stage(
        spec=spec,
        record=record,
        release_id=release_id,
        directory=Path(directory),
        ingested=ingested,
        charge=charge,
        tables=tables,
        validation=validation,
        spent_before=spent_before,
        catalog=Catalog(catalog_url),
    )
