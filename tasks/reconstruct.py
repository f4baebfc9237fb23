"""Task: every item's estimates and standard errors from the measurement (post-processing)."""

from __future__ import annotations

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.planning import Plan
from catalog.spec.model import ReleaseSpec
from mechanisms.protocol import Measurement


@task(name="reconstruct", cache_policy=NO_CACHE, persist_result=False)
def reconstruct_task(
    spec: ReleaseSpec, plan: Plan, measurement: Measurement
) -> dict[str, pa.Table]:
    return release.reconstruct(spec, plan, measurement)
