"""Release tables (catalog/publishing/tables.py): interval quantile per row, uncertainty labels, no-interval rows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dprelease.catalog.planning.planner import build_workload
from dprelease.catalog.publishing.tables import build_table
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec

Z = 1.959963984540054
LAPLACE = math.log(20.0) / math.sqrt(2.0)  # b·ln 20 in units of σ = √2·b


@pytest.fixture
def spec(tmp_path: Path) -> ReleaseSpec:
    return parse_spec(
        {
            "name": "t",
            "dataset": {"id": "t", "source": str(tmp_path / "d.parquet"), "budget": {"epsilon": 5}},
            "domain": {"v": {"min": 0, "max": 3}},
            "workload": [{"name": "cells", "marginal": ["v"]}],
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
        }
    )


def table(spec: ReleaseSpec, **options):
    item = build_workload(spec).items[0]
    arguments = {
        "estimates": np.array([10.0, -1.0, 5.0, 7.0]),
        "unit_variances": np.ones(4),
        "noise_variance": 2.0,
        "nonnegative": False,
    }
    return build_table(spec, item, **{**arguments, **options})


def test_unbiased_rows_use_the_normal_quantile_and_say_noise(spec: ReleaseSpec) -> None:
    t = table(spec)
    np.testing.assert_allclose(t["std_error"].to_numpy(), np.sqrt(2.0))
    np.testing.assert_allclose(t["ci_high"].to_numpy() - t["estimate"].to_numpy(), Z * np.sqrt(2))
    assert t["uncertainty"].to_pylist() == ["noise"] * 4
    assert t.column_names[-5:] == ["estimate", "std_error", "ci_low", "ci_high", "uncertainty"]


def test_single_laplace_rows_use_the_laplace_quantile(spec: ReleaseSpec) -> None:
    t = table(spec, interval=np.array(["laplace", "normal", "laplace", "normal"]))
    half = t["ci_high"].to_numpy() - t["estimate"].to_numpy()
    np.testing.assert_allclose(half, np.sqrt(2) * np.array([LAPLACE, Z, LAPLACE, Z]))
    everywhere = table(spec, interval="laplace")
    np.testing.assert_allclose(
        everywhere["estimate"].to_numpy() - everywhere["ci_low"].to_numpy(), np.sqrt(2) * LAPLACE
    )


def test_rows_without_an_interval_have_null_bounds_and_say_so(spec: ReleaseSpec) -> None:
    t = table(
        spec,
        unit_variances=np.array([1.0, 4.5, 1.0, 2.0]),
        interval=np.array(["laplace", "normal", "none", "normal"]),
        uncertainty=np.array(["noise+bias", "noise+bias", "noise-only", "noise+bias"]),
    )
    np.testing.assert_allclose(t["std_error"].to_numpy(), np.sqrt([2.0, 9.0, 2.0, 4.0]))
    assert t["uncertainty"].to_pylist() == ["noise+bias", "noise+bias", "noise-only", "noise+bias"]
    assert t["ci_low"].null_count == t["ci_high"].null_count == 1
    assert t["ci_low"].to_pylist()[2] is None and t["ci_high"].to_pylist()[2] is None
    high = np.array(t["ci_high"].to_pylist(), dtype=float)
    np.testing.assert_allclose(
        high - t["estimate"].to_numpy(), [np.sqrt(2) * LAPLACE, 3 * Z, np.nan, 2 * Z]
    )


def test_nonnegative_clips_estimates_and_intervals_but_keeps_nulls(spec: ReleaseSpec) -> None:
    t = table(spec, nonnegative=True, interval=np.array(["normal", "normal", "none", "normal"]))
    assert t["estimate"].to_pylist()[1] == 0.0
    assert min(v for v in t["ci_low"].to_pylist() if v is not None) >= 0.0
    assert t["ci_low"].null_count == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unit_variances": np.ones(3)}, r"unit_variances \(shape \(3,\)\) must have one entry"),
        (
            {"interval": np.array(["laplace", "normal"])},
            r"interval \(shape \(2,\)\) must be one value or one per row",
        ),
        (
            {"interval": "t"},
            r"interval values \['t'\] must be one of \('normal', 'laplace', 'none'\)",
        ),
        (
            {"uncertainty": np.array(["noise"] * 3)},
            r"uncertainty \(shape \(3,\)\) must be one label or one per row",
        ),
        ({"uncertainty": "exact"}, r"uncertainty labels \['exact'\] must be one of"),
    ],
)
def test_inconsistent_error_models_are_refused(spec: ReleaseSpec, options, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        table(spec, **options)
