"""Task: Great Expectations checks of the released tables (released values and public metadata only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog import release
from catalog.planning import Plan


@task(name="validate-outputs", cache_policy=NO_CACHE, persist_result=False)
def validate_task(tables: dict[str, pa.Table], plan: Plan, directory: str) -> dict[str, Any]:
    return release.validate(tables, plan, directory=Path(directory))
