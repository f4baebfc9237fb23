"""Task: least-squares reconstruction and per-item answers with standard errors (post-processing)."""

from __future__ import annotations

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.planning import Plan
from catalog.spec import ReleaseSpec
from mechanisms.session import NoisyMeasurement


@task(name="reconstruct", cache_policy=NO_CACHE, persist_result=False)
def reconstruct_task(
    spec: ReleaseSpec, plan: Plan, measurement: NoisyMeasurement
) -> dict[str, pa.Table]:
    return release.reconstruct(spec, plan, measurement)
