"""Explicit matrix items, mechanism options, schedules and DAWA applicability: validators fire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning.planner import build_workload, make_plan
from dprelease.catalog.publishing.tables import label_columns
from dprelease.catalog.spec.load import load_spec, parse_spec


def _spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "m",
        "dataset": {"id": "m", "budget": {"epsilon": 5}},
        "domain": {"v": {"min": 0, "max": 3}, "c": {"values": ["a", "b"]}},
        "workload": [{"name": "q", "matrix": "w.npy", "attributes": ["v"]}],
        "privacy": {"epsilon": 1.0},
    }
    spec.update(overrides)
    return spec


def _write(tmp_path: Path, spec: dict[str, Any], matrix: np.ndarray | None) -> Path:
    if matrix is not None:
        np.save(tmp_path / "w.npy", matrix)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_matrix_item_loads_relative_to_the_spec_and_plans(tmp_path: Path) -> None:
    matrix = np.array([[1.0, -1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    spec = load_spec(_write(tmp_path, _spec(), matrix))
    assert spec.workload[0].matrix == str((tmp_path / "w.npy").resolve())
    workload = build_workload(spec)
    x = np.arange(8.0)  # v-major, c-minor
    np.testing.assert_allclose(workload.items[0].answer(x), matrix @ x.reshape(4, 2).sum(1))
    assert list(label_columns(spec, workload.items[0])) == ["v_query"]
    plan = make_plan(spec)
    assert plan.chosen in {"identity", "hierarchical", "wavelet", "optimized", "lrm"}


def test_matrix_content_is_part_of_the_workload_fingerprint(tmp_path: Path) -> None:
    first = load_spec(_write(tmp_path, _spec(), np.eye(4))).workload_fingerprint()
    second = load_spec(_write(tmp_path, _spec(), 2 * np.eye(4))).workload_fingerprint()
    assert first != second


@pytest.mark.parametrize(
    ("item", "matrix", "message"),
    [
        ({"name": "q", "matrix": "w.npy"}, np.eye(4), "matrix and attributes go together"),
        (
            {"name": "q", "matrix": "w.npy", "attributes": ["v", "c"]},
            np.eye(4),
            "exactly one attribute",
        ),
        ({"name": "q", "matrix": "w.csv", "attributes": ["v"]}, None, r"must be a \.npy file"),
        ({"name": "q", "matrix": "w.npy", "attributes": ["v"]}, np.eye(3), "has 3 columns but"),
        (
            {"name": "q", "matrix": "w.npy", "attributes": ["v"]},
            np.ones(4),
            r"m × n matrix \(got shape \(4,\)\)",
        ),
        (
            {"name": "q", "matrix": "w.npy", "attributes": ["v"]},
            np.array([[np.nan, 0, 0, 0]]),
            "finite numbers",
        ),
        ({"name": "q", "matrix": "missing.npy", "attributes": ["v"]}, None, "cannot read"),
        (
            {"name": "q", "matrix": "w.npy", "attributes": ["zz"]},
            np.eye(4),
            "unknown attribute 'zz'",
        ),
    ],
    ids=[
        "no-attributes",
        "two-attributes",
        "not-npy",
        "wrong-width",
        "one-dimensional",
        "nan",
        "missing-file",
        "unknown-attribute",
    ],
)
def test_matrix_item_validation_fires(
    tmp_path: Path, item: dict[str, Any], matrix: np.ndarray | None, message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(_write(tmp_path, _spec(workload=[item]), matrix))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"branching": 1}, r"branching \(1\) must be an integer >= 2"),
        ({"branching": True}, r"branching \(True\) must be an integer >= 2"),
        ({"ratio": 1.0}, r"ratio \(1.0\) must be a number in \(0, 1\)"),
        ({"ratio": 0}, r"ratio \(0\) must be a number in \(0, 1\)"),
        ({"intervals": "some"}, r"intervals \('some'\) must be 'dyadic' or 'all'"),
        ({"noise_offset": -1}, r"noise_offset \(-1\) must be a number >= 0"),
    ],
    ids=["branching-1", "branching-bool", "ratio-1", "ratio-0", "intervals", "offset"],
)
def test_mechanism_options_validation_fires(options: dict[str, Any], message: str) -> None:
    spec = _spec(workload=[{"name": "t", "total": True}], mechanism_options=options)
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_schedule_and_trigger() -> None:
    spec = parse_spec(
        _spec(
            workload=[{"name": "t", "total": True}],
            schedule={"cron": "0 6 1 * *"},
            trigger="arrival",
        )
    )
    assert (
        spec.schedule is not None
        and spec.schedule.cron == "0 6 1 * *"
        and spec.schedule.timezone == "UTC"
    )
    with pytest.raises(SpecError, match=r"cron \('0 6 1 \*'\) must have 5 fields"):
        parse_spec(_spec(workload=[{"name": "t", "total": True}], schedule={"cron": "0 6 1 *"}))
    with pytest.raises(SpecError, match="trigger"):
        parse_spec(_spec(workload=[{"name": "t", "total": True}], trigger="sometimes"))


def test_dawa_applicability_is_checked_at_plan_time() -> None:
    three = _spec(
        domain={"a": {"min": 0, "max": 3}, "b": {"min": 0, "max": 3}, "c": {"min": 0, "max": 3}},
        workload=[{"name": "t", "total": True}],
        mechanism="dawa",
    )
    with pytest.raises(SpecError, match="one or two ordered attributes"):
        make_plan(parse_spec(three))
    gaussian = _spec(
        domain={"a": {"min": 0, "max": 7}},
        workload=[{"name": "r", "all_ranges": ["a"]}],
        mechanism="dawa",
        privacy={"rho": 0.5},
        dataset={"id": "m", "budget": {"rho": 5}},
    )
    with pytest.raises(SpecError, match=r"give privacy as \{epsilon\}"):
        make_plan(parse_spec(gaussian))
    ok = make_plan(
        parse_spec(
            {
                **gaussian,
                "privacy": {"epsilon": 1.0},
                "dataset": {"id": "m", "budget": {"epsilon": 5}},
            }
        )
    )
    assert ok.chosen == "dawa" and ok.candidate("dawa").rmse is None
    assert "data-dependent" in (ok.candidate("dawa").note or "")
    assert ok.expected_cost.epsilon == 1.0
