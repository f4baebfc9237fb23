"""A release too large for this machine is refused from sizes alone, before it is planned
(issue 26 item 1): planning a 10¹⁴-cell identity workload built dense Gram matrices for seconds
and gigabytes only to be refused afterwards."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.load import check_runnable_before_planning, parse_spec

HUGE = {f"a{k}": {"min": 1, "max": n} for k, n in enumerate([10_000, 10_000, 10_000, 100])}


def spec_of(
    workload: list[dict[str, Any]], *, mechanism: str, source: str | None = "/nonexistent/x.pq"
) -> Any:
    dataset: dict[str, Any] = {"id": "huge", "budget": {"epsilon": 10.0}}
    if source is not None:
        dataset["source"] = source
    return parse_spec(
        {
            "name": "huge",
            "dataset": dataset,
            "domain": HUGE,
            "workload": workload,
            "mechanism": mechanism,
            "privacy": {"epsilon": 1.0},
        }
    )


@pytest.mark.parametrize("mechanism", ["identity", "auto", "marginal_space"])
def test_an_identity_workload_of_1e14_cells_is_refused_without_building_anything(
    mechanism: str,
) -> None:
    spec = spec_of([{"name": "all", "marginal": ["a0", "a1", "a2", "a3"]}], mechanism=mechanism)
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as raised:
            check_runnable_before_planning(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "the output tables would have at least 100,000,000,000,000 rows (item 'all'" in str(
        raised.value
    )
    assert "a release writes at most 200,000,000 rows" in str(raised.value)
    assert peak < 1_000_000  # sizes only: no workload, no Gram matrix


def test_a_named_cell_mechanism_is_refused_on_a_domain_too_large_to_count() -> None:
    spec = spec_of([{"name": "everyone", "total": True}], mechanism="identity")
    with pytest.raises(SpecError, match=r"the domain has 100,000,000,000,000 cells"):
        check_runnable_before_planning(spec)


def test_auto_and_marginal_space_are_planned_on_a_large_domain_with_small_tables() -> None:
    """A marginal-space plan counts only marginals: the cell count is checked after planning."""
    for mechanism in ("auto", "marginal_space"):
        spec = spec_of([{"name": "a0", "marginal": ["a0"]}], mechanism=mechanism)
        check_runnable_before_planning(spec)  # no refusal


def test_a_spec_without_a_source_is_refused_before_planning() -> None:
    spec = spec_of([{"name": "a0", "marginal": ["a0"]}], mechanism="auto", source=None)
    with pytest.raises(SpecError, match=r"dataset.source is not set in the spec"):
        check_runnable_before_planning(spec)


def test_the_flow_s_load_spec_stage_refuses_it_too(tmp_path: Any) -> None:
    """Deployed runs (schedule, arrival) do not pass through `dprelease run`: the flow's first
    stage refuses the same spec before the plan stage, also with an arrived file as source."""
    import yaml

    from dprelease.tasks.stages import load_spec_task

    path = tmp_path / "huge.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "huge",
                "dataset": {"id": "huge", "source": "x.parquet", "budget": {"epsilon": 10.0}},
                "domain": HUGE,
                "workload": [{"name": "all", "marginal": ["a0", "a1", "a2", "a3"]}],
                "mechanism": "identity",
                "privacy": {"epsilon": 1.0},
            }
        )
    )
    for override in (None, str(tmp_path / "arrived.parquet")):
        with pytest.raises(SpecError, match="a release writes at most 200,000,000 rows"):
            load_spec_task.fn(str(path), override)
