"""The generic planner: only what is needed, early stop at the bound, time budget, loud bugs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning import planner as planning
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms import registry
from dprelease.mechanisms.primitives.protocol import (
    CandidateUnavailable,
    MatrixMechanism,
    PlanRequest,
    StrategyCache,
)


def _spec(**overrides: Any) -> Any:
    raw = {
        "name": "p",
        "dataset": {"id": "p", "budget": {"rho": 5}},
        "domain": {"a": {"min": 0, "max": 15}, "b": {"values": ["x", "y", "z"]}},
        "workload": [{"name": "cells", "marginal": ["a", "b"]}],
        "privacy": {"rho": 0.5},
    }
    raw.update(overrides)
    return parse_spec(raw)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))


class _Broken(MatrixMechanism):
    name = "test-broken"
    summary = "raises a bug while planning"

    def predicted_seconds(self, request: PlanRequest) -> float:
        return 0.0  # planned first

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> Any:
        raise ValueError("a bug, not a verdict")


class _Unavailable(_Broken):
    name = "test-unavailable"
    summary = "cannot serve any workload"

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> Any:
        raise CandidateUnavailable("this toy serves nothing")


@pytest.fixture
def registered() -> Iterator[None]:
    extra = [_Unavailable()]
    for mechanism in extra:
        registry.register(mechanism)
    try:
        yield
    finally:
        for mechanism in extra:
            registry.unregister(mechanism)


def test_identity_workload_stops_at_the_bound_without_planning_the_rest(registered: None) -> None:
    plan = planning.make_plan(_spec())
    assert plan.candidate(plan.chosen).rmse == pytest.approx(plan.lower_bound_rmse, rel=1e-9)
    assert plan.candidate("test-unavailable").status == "unavailable"
    assert "this toy serves nothing" in (plan.candidate("test-unavailable").note or "")
    skipped = [c for c in plan.candidates if c.status == "skipped"]
    assert {c.mechanism for c in skipped} >= {"optimized", "hierarchical", "wavelet"}
    assert all("within 0.5% of the SVD lower bound" in (c.note or "") for c in skipped)


def test_a_named_mechanism_is_the_only_one_planned() -> None:
    plan = planning.make_plan(_spec(mechanism="wavelet"))
    assert [c.mechanism for c in plan.candidates] == ["wavelet"]
    assert plan.lower_bound_rmse is not None


def test_a_bug_while_planning_fails_the_plan_loudly() -> None:
    broken = _Broken()
    registry.register(broken)
    try:
        with pytest.raises(ValueError, match="a bug, not a verdict"):
            planning.make_plan(_spec())
    finally:
        registry.unregister(broken)


def test_candidates_predicted_over_the_time_budget_are_skipped_with_the_reason() -> None:
    spec = _spec(
        workload=[{"name": "cdf", "prefix": "a"}, {"name": "b", "marginal": ["b"]}],
        domain={"a": {"min": 0, "max": 1023}, "b": {"values": ["x", "y", "z"]}},
    )
    plan = planning.make_plan(spec, time_budget=0.01)
    optimized = plan.candidate("optimized")
    assert optimized.status == "skipped"
    assert "exceeds the remaining time budget" in (optimized.note or "")
    with pytest.raises(SpecError, match=r"time budget \(0 s\) must be > 0"):
        planning.make_plan(spec, time_budget=0)


def test_a_named_mechanism_that_cannot_serve_the_spec_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="mechanism 'dawa' cannot run on this spec"):
        planning.make_plan(_spec(mechanism="dawa"))


def test_the_plan_carries_the_strategy_it_evaluated() -> None:
    plan = planning.make_plan(_spec(mechanism="hierarchical"))
    assert plan.strategy.name == "hierarchical"
    assert plan.workload is not None and plan.workload.num_cells == 48
    assert plan.mechanism is registry.get("hierarchical", model="central")
