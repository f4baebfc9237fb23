"""Task: choose the strategy and compute expected errors (data-free, cached by workload fingerprint)."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from prefect import task

from catalog.planning import Plan, make_plan
from catalog.spec.model import ReleaseSpec
from tasks.settings import result_storage

PLAN_CACHE_VERSION = "2"


def plan_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    """Key = workload fingerprint + privacy level + contribution bound (all public), hashed."""
    spec: ReleaseSpec = parameters["spec"]
    raw = json.dumps(
        [
            "plan-release",
            PLAN_CACHE_VERSION,
            spec.model,
            spec.workload_fingerprint(),
            spec.privacy,
            spec.privacy_unit.contribution_bound,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(raw.encode()).hexdigest()


@task(
    name="plan-strategy",
    cache_key_fn=plan_cache_key,
    persist_result=True,
    result_storage=result_storage(),
    cache_expiration=timedelta(days=30),
)
def plan_task(spec: ReleaseSpec) -> Plan:
    return make_plan(spec)
