"""Tasks for DAWA: the private partition (cached with its receipt), the measurement, reconstruction.

The partition task's cache key is public: input fingerprint, dataset id, ε₁ and the settings.  A
re-run of the same release on the same data hits the cache and reuses the partition and its
ledger receipt without paying again; a different input or ε₁ misses, recomputes and pays.
The confidential cells are a task argument but never part of the key (custom ``cache_key_fn``) and
never persisted (only the public ``PartitionRecord`` result is).
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import dawa_release
from catalog.dawa_release import PartitionRecord
from catalog.ledger import Catalog
from catalog.source import CountResult
from catalog.spec import ReleaseSpec
from mechanisms.dawa import HierarchicalStrategy
from mechanisms.session import NoisyMeasurement
from tasks.settings import result_storage

PARTITION_CACHE_VERSION = "1"


def partition_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    spec: ReleaseSpec = parameters["spec"]
    counted: CountResult = parameters["counted"]
    raw = json.dumps(
        [
            "dawa-partition",
            PARTITION_CACHE_VERSION,
            spec.dataset.id,
            counted.input_fingerprint,
            list(spec.domain_shape),
            spec.privacy_unit.contribution_bound,
            dawa_release.settings_for(spec).key(),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(raw.encode()).hexdigest()


@task(
    name="dawa-partition",
    retries=0,
    cache_key_fn=partition_cache_key,
    persist_result=True,
    result_storage=result_storage(),
    cache_expiration=timedelta(days=365),
    log_prints=False,
)
def partition_task(
    counted: CountResult, spec: ReleaseSpec, catalog_url: str, release_id: str
) -> PartitionRecord:
    return dawa_release.select_partition(counted, spec, Catalog(catalog_url), release_id=release_id)


@task(name="dawa-measure", retries=0, cache_policy=NO_CACHE, persist_result=False, log_prints=False)
def dawa_measure_task(
    counted: CountResult,
    spec: ReleaseSpec,
    record: PartitionRecord,
    catalog_url: str,
    release_id: str,
) -> tuple[NoisyMeasurement, HierarchicalStrategy]:
    return dawa_release.measure(counted, spec, record, Catalog(catalog_url), release_id=release_id)


@task(name="dawa-reconstruct", cache_policy=NO_CACHE, persist_result=False)
def dawa_reconstruct_task(
    spec: ReleaseSpec, strategy: HierarchicalStrategy, measurement: NoisyMeasurement
) -> dict[str, pa.Table]:
    return dawa_release.reconstruct(spec, strategy, measurement)
