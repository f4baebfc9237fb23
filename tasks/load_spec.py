"""Task: read and validate the release spec (public)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from catalog.spec.load import check_runnable_before_planning, load_spec
from catalog.spec.model import ReleaseSpec


@task(name="load-spec", cache_policy=NO_CACHE, retries=0)
def load_spec_task(spec_path: str, source_override: str | None = None) -> ReleaseSpec:
    """The spec, with a newly arrived file as its source if given; refused from sizes alone (as
    `dprelease run` refuses it) before the plan is made."""
    spec = load_spec(spec_path)
    if source_override is not None:
        spec = spec.model_copy(
            update={"dataset": spec.dataset.model_copy(update={"source": source_override})}
        )
    check_runnable_before_planning(spec)
    return spec
