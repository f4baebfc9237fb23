"""The ``series`` section of a spec: accepted shapes, and every rule refused naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.series import MAX_SERIES_HORIZON


def raw_series_spec(**overrides: Any) -> dict[str, Any]:
    """An event-level series spec over two attributes (12 monthly files, cumulative counts)."""
    raw: dict[str, Any] = {
        "name": "monthly",
        "dataset": {
            "id": "monthly",
            "source": "data/",
            "budget": {"rho": 2.0},
            "partitions": {"by": "file"},
        },
        "domain": {"region": {"values": ["n", "s", "e"]}, "age": {"min": 0, "max": 3}},
        "workload": [{"name": "by_region", "marginal": ["region"]}, {"name": "all", "total": True}],
        "privacy": {"rho": 0.5},
        "series": {"period": "file", "horizon": 12, "time_workload": ["cumulative"]},
    }
    for key, value in overrides.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


def _series(**fields: Any) -> dict[str, Any]:
    return {"period": "file", "horizon": 12, "time_workload": ["cumulative"]} | fields


def test_a_series_spec_parses_with_its_parts_in_order() -> None:
    spec = parse_spec(
        raw_series_spec(series=_series(time_workload=["period", "cumulative", {"rolling": 3}]))
    )
    assert spec.series is not None
    assert spec.series.part_names() == ["period", "cumulative", "rolling3"]
    assert spec.series.horizon == 12


def test_a_spec_without_series_keeps_its_fingerprint_field_free() -> None:
    raw = raw_series_spec(series=None)
    spec = parse_spec(raw)
    assert '"series"' not in spec.canonical_json()
    assert '"series"' in parse_spec(raw_series_spec()).canonical_json()


@pytest.mark.parametrize(
    ("series", "needle"),
    [
        (_series(period="month"), "series.period ('month') must be 'file'"),
        (_series(horizon=0), "series.horizon (0) must be an integer from 1"),
        (_series(horizon=MAX_SERIES_HORIZON + 1), f"series.horizon ({MAX_SERIES_HORIZON + 1})"),
        (_series(time_workload=[]), "time_workload must be a non-empty list"),
        (_series(time_workload=["weekly"]), "time_workload"),
        (_series(time_workload=[{"rolling": 13}]), "rolling window must satisfy window <= horizon"),
        (_series(time_workload=[{"rolling": 0}]), "rolling window must be an integer >= 1"),
        (_series(time_workload=[{"window": 3}]), "time_workload part"),
        (_series(time_workload=["cumulative", "cumulative"]), "lists a part twice"),
        (_series(revisions="publish"), "revisions"),
    ],
)
def test_a_malformed_series_section_is_refused_naming_the_field(
    series: dict[str, Any], needle: str
) -> None:
    with pytest.raises(SpecError, match="series") as info:
        parse_spec(raw_series_spec(series=series))
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"privacy": {"epsilon": 1.0}}, "series needs privacy: {rho: ...}"),
        ({"privacy": {"epsilon": 1.0, "delta": 1e-6}}, "series needs privacy: {rho: ...}"),
        (
            {"privacy": None, "accuracy": {"max_std_error": 5.0}},
            "series needs privacy: {rho: ...}",
        ),
        (
            {"dataset": {"id": "monthly", "source": "data/", "budget": {"rho": 2.0}}},
            "series at event level (privacy_unit.rows_per_person) needs dataset.partitions",
        ),
        (
            {
                "dataset": {
                    "id": "monthly",
                    "source": "data/",
                    "budget": {"rho": 2.0},
                    "partitions": {"by": "column", "column": "region"},
                }
            },
            "needs dataset.partitions: {by: file}",
        ),
        (
            {"privacy_unit": {"person_column": "pid", "max_rows": 2}},
            "series at person level (privacy_unit.person_column) takes no dataset.partitions",
        ),
        (
            {"workload": [{"name": "mean_age", "mean": "age"}]},
            "workload item 'mean_age' is a derived statistic",
        ),
        ({"reconstruct": "pgm"}, "series needs reconstruct: least_squares (got 'pgm')"),
    ],
)
def test_a_series_spec_breaking_a_cross_field_rule_is_refused(
    overrides: dict[str, Any], needle: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(raw_series_spec(**overrides))
    assert needle in str(info.value)


def test_a_person_level_series_without_partitions_parses() -> None:
    raw = raw_series_spec(privacy_unit={"person_column": "pid", "max_rows": 2})
    raw["dataset"] = {"id": "monthly", "source": "data/", "budget": {"rho": 2.0}}
    spec = parse_spec(raw)
    assert spec.privacy_unit.contribution_bound == 2


MONTHS = ["2026-01", "2026-02", "2026-03"]


def raw_column_series(**period: Any) -> dict[str, Any]:
    """An event-level series whose periods are the values of column ``month``."""
    raw = raw_series_spec()
    raw["dataset"]["partitions"] = {"column": "month"}
    raw["series"] = {
        "period": {"column": "month", "values": list(MONTHS)} | period,
        "horizon": 3,
        "time_workload": ["cumulative"],
    }
    return raw


def test_column_periods_parse_with_their_partitions_and_labels() -> None:
    spec = parse_spec(raw_column_series())
    assert spec.series is not None and spec.series.columns is not None
    assert [spec.series.columns.partition(t) for t in range(3)] == [
        "month=2026-01",
        "month=2026-02",
        "month=2026-03",
    ]
    raw = raw_column_series(column="year", values=[2024, 2025, 2026])
    raw["dataset"]["partitions"] = {"column": "year"}
    assert parse_spec(raw).series.columns.partition(2) == "year=2026"  # type: ignore[union-attr]
    assert parse_spec(raw_series_spec()).series.columns is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("period", "needle"),
    [
        ({"values": ["2026-01", "2026-02"]}, "lists 2 values and series.horizon is 3"),
        ({"values": ["2026-01", "2026-02", "2026-01"]}, "lists '2026-01' twice"),
        ({"values": ["2026-01", 2, "2026-03"]}, "mixes strings and integers"),
        ({"values": ["2026-01", True, "2026-03"]}, "True is a bool"),
        ({"values": [1.5, 2.5, 3.5]}, "1.5 is a float"),
        ({"values": []}, "series.period.values must be a non-empty list"),
        ({"values": "2026-01"}, "series.period.values must be a non-empty list"),
        ({"column": ""}, "series.period.column must name a column"),
        ({"every": "month"}, "every"),
    ],
)
def test_malformed_column_periods_are_refused_naming_the_field(
    period: dict[str, Any], needle: str
) -> None:
    with pytest.raises(SpecError, match=r"series\.period") as info:
        parse_spec(raw_column_series(**period))
    assert needle in str(info.value)


def test_a_date_value_is_refused_with_the_hint_to_quote_it() -> None:
    import datetime

    raw = raw_column_series(values=[datetime.date(2026, m, 1) for m in (1, 2, 3)])
    with pytest.raises(SpecError, match=r"is a date; each value must be a string or an integer"):
        parse_spec(raw)


def test_a_period_column_breaking_a_cross_field_rule_is_refused() -> None:
    in_domain = raw_column_series(column="region")
    in_domain["dataset"]["partitions"] = {"column": "region"}
    with pytest.raises(SpecError, match=r"series.period.column \('region'\) is an attribute"):
        parse_spec(in_domain)
    person = raw_column_series(column="pid")
    person["privacy_unit"] = {"person_column": "pid", "max_rows": 2}
    person["dataset"].pop("partitions")
    with pytest.raises(SpecError, match=r"series.period.column \('pid'\) is privacy_unit.person"):
        parse_spec(person)
    for partitions in (None, {"by": "file"}, {"column": "region"}):
        raw = raw_column_series()
        raw["dataset"].pop("partitions")
        if partitions is not None:
            raw["dataset"]["partitions"] = partitions
        with pytest.raises(SpecError, match=r"needs dataset.partitions: \{column: month\}"):
            parse_spec(raw)
    people = raw_column_series()
    people["privacy_unit"] = {"person_column": "pid", "max_rows": 2}
    with pytest.raises(SpecError, match=r"takes no dataset\.partitions"):
        parse_spec(people)
    people["dataset"].pop("partitions")
    assert parse_spec(people).series is not None  # person level: no partitions


def test_a_partition_column_outside_the_domain_is_still_refused_without_column_periods() -> None:
    raw = raw_series_spec(series=None)
    raw["dataset"]["partitions"] = {"column": "month"}
    with pytest.raises(SpecError, match=r"dataset.partitions.column \('month'\) must be"):
        parse_spec(raw)
