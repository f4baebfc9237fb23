"""The ``series`` section of a release spec: one release per period over a declared horizon.

``series: {period: file, horizon: T, time_workload: [period, cumulative, {rolling: 12}]}``: each
file of ``dataset.source`` is one period (the files in name order, one released per run); or
``period: {column: NAME, values: [v1, v2, ...]}``: period s is the rows whose column NAME holds
``values[s]`` (public, declared like a categorical domain; released in that order).  The
release workload is the time workload (each part published at every period) times the cell
workload (``workload``).  The horizon plan (:mod:`catalog.planning.series`) fixes a causal
strategy for all ``T`` periods at the first release; later releases follow it.

Rules (each refused with a message naming the field): Gaussian noise under zCDP only
(``privacy: {rho: ...}``); event level (``rows_per_person``) needs ``dataset.partitions: {by:
file}`` for file periods, ``{column: NAME}`` (the same NAME) for column periods (each period is a
partition of people, charged its own increment); NAME is the time axis, neither a domain
attribute nor the person column; person level
(``person_column``, ``max_rows`` per period) needs no partitions (a person may be in every
period; charges are sequential on the whole dataset); a central release of count tables with a
least-squares reconstruction.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Tag, field_validator, model_validator

from dprelease.catalog.spec.domain import Strict
from dprelease.mechanisms.continual.workloads import time_workload

MAX_SERIES_HORIZON = 360
"""Periods a series may declare: the horizon plan is a T × T factorisation (optimised in O(T³)
per iteration) and every period is one partition of the ledger."""

TimePart = Literal["period", "cumulative"] | dict[str, int]
PeriodValue = str | int


class ColumnPeriods(Strict):
    """``period: {column: NAME, values: [...]}``: period s is the rows whose NAME is ``values[s]``."""

    column: str
    """The time axis: a column of the source, not a domain attribute."""
    values: list[PeriodValue]
    """One value per period, in release order (public): all strings or all integers, unique."""

    @field_validator("column")
    @classmethod
    def _check_column(cls, column: str) -> str:
        if not column:
            raise ValueError("series.period.column must name a column of dataset.source")
        return column

    @field_validator("values", mode="before")
    @classmethod
    def _check_values(cls, values: Any) -> Any:
        if not isinstance(values, list) or not values:
            raise ValueError(
                "series.period.values must be a non-empty list (one value of the period column "
                "per period, in release order)"
            )
        kinds = set()
        for value in values:
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ValueError(
                    f"series.period.values: {value!r} is a {type(value).__name__}; each value "
                    "must be a string or an integer, as the period column holds them (quote "
                    "dates: '2026-01-31')"
                )
            kinds.add(type(value))
        if len(kinds) > 1:
            raise ValueError(
                "series.period.values mixes strings and integers; the period column holds one "
                "type: give all values as strings or all as integers"
            )
        seen: set[PeriodValue] = set()
        for value in values:
            if value in seen:
                raise ValueError(
                    f"series.period.values lists {value!r} twice; each period is one value"
                )
            seen.add(value)
        return values

    def partition(self, period: int) -> str:
        """The ledger partition of ``period`` (0-based): ``NAME=<value>``."""
        return f"{self.column}={self.values[period]}"


def _period_kind(raw: Any) -> str:
    """Which shape ``series.period`` has: a mapping is column periods, anything else ``file``."""
    return "column" if isinstance(raw, dict | ColumnPeriods) else "file"


class SeriesSection(Strict):
    """``series:`` of a spec (module docstring)."""

    period: Annotated[
        Annotated[str, Tag("file")] | Annotated[ColumnPeriods, Tag("column")],
        Discriminator(_period_kind),
    ]
    """``file``: each file of ``dataset.source`` is one period (its partition), in name order;
    ``{column: NAME, values: [...]}``: the rows of each declared value of NAME, in that order."""
    horizon: int
    """How many periods the series has: its plan covers exactly these; a release past it is refused."""
    time_workload: list[TimePart]
    """What is published at each period: ``period`` (the period's own counts), ``cumulative``
    (counts to date), ``{rolling: w}`` (the last w periods)."""

    @field_validator("period")
    @classmethod
    def _check_period(cls, period: str | ColumnPeriods) -> str | ColumnPeriods:
        if isinstance(period, str) and period != "file":
            raise ValueError(
                f"series.period ({period!r}) must be 'file' (each file of dataset.source is one "
                "period) or {column: NAME, values: [...]} (the rows of each declared value of "
                "column NAME)"
            )
        return period

    @field_validator("horizon")
    @classmethod
    def _check_horizon(cls, horizon: int) -> int:
        if not 1 <= horizon <= MAX_SERIES_HORIZON:
            raise ValueError(
                f"series.horizon ({horizon}) must be an integer from 1 to {MAX_SERIES_HORIZON} "
                "(the number of periods the plan covers)"
            )
        return horizon

    @model_validator(mode="after")
    def _check_values_cover_horizon(self) -> SeriesSection:
        columns = self.columns
        if columns is not None and len(columns.values) != self.horizon:
            raise ValueError(
                f"series.period.values lists {len(columns.values)} values and series.horizon is "
                f"{self.horizon}: declare exactly one value per period of the horizon"
            )
        return self

    @model_validator(mode="after")
    def _check_time_workload(self) -> SeriesSection:
        keys = [
            part if isinstance(part, str) else str(sorted(part.items()))
            for part in self.time_workload
        ]
        if len(set(keys)) != len(keys):
            raise ValueError(
                f"series.time_workload ({self.time_workload}) lists a part twice; each part is "
                "published once per period"
            )
        try:
            time_workload(self.time_workload, self.horizon)
        except ValueError as exc:
            raise ValueError(f"series.time_workload: {exc}") from None
        return self

    @property
    def columns(self) -> ColumnPeriods | None:
        """The column periods, or None for file periods."""
        return self.period if isinstance(self.period, ColumnPeriods) else None

    def part_names(self) -> list[str]:
        """One name per time part, in order: ``period``, ``cumulative``, ``rolling12``."""
        return [
            part if isinstance(part, str) else f"rolling{part['rolling']}"
            for part in self.time_workload
        ]

    def parts(self) -> list[Any]:
        """The parts as :func:`mechanisms.continual.time_workload` reads them."""
        return [part if isinstance(part, str) else dict(part) for part in self.time_workload]


def check_series(spec: Any) -> None:
    """The cross-field rules of a series spec (module docstring); raises ``ValueError``.

    ``spec`` is the ``ReleaseSpec`` being validated (not imported here: the model imports this
    section)."""
    series = spec.series
    if series is None:
        return
    if spec.accuracy is not None or spec.privacy is None or set(spec.privacy) != {"rho"}:
        given = spec.privacy if spec.privacy is not None else "accuracy targets"
        raise ValueError(
            f"series needs privacy: {{rho: ...}} (Gaussian noise under zCDP, the accounting of "
            f"the horizon plan); got {given}: Laplace (epsilon), (epsilon, delta) and accuracy "
            "targets are not supported for a series"
        )
    if spec.model != "central":
        raise ValueError("series applies to central releases (model: central)")
    partitions = spec.dataset.partitions
    columns = series.columns
    if columns is not None:
        _check_period_column(spec, columns.column)
    if spec.privacy_unit.person_column is None:
        if columns is not None and (partitions is None or partitions.column != columns.column):
            raise ValueError(
                f"series at event level (privacy_unit.rows_per_person) with periods of column "
                f"{columns.column!r} needs dataset.partitions: {{column: {columns.column}}}: each "
                "period's rows hold other people, and each release charges every period it "
                "reads its own increment"
            )
        if columns is None and (partitions is None or partitions.by != "file"):
            raise ValueError(
                "series at event level (privacy_unit.rows_per_person) needs dataset.partitions: "
                "{by: file}: each period's file holds other people, and each release charges "
                "every period it reads its own increment"
            )
    elif partitions is not None:
        raise ValueError(
            "series at person level (privacy_unit.person_column) takes no dataset.partitions: "
            "a person may contribute to every period (max_rows per period), so the periods are "
            "not disjoint and every release is charged to the whole dataset"
        )
    derived = [item.name for item in spec.workload if item.derived_column is not None]
    if derived:
        raise ValueError(
            f"series: workload item {derived[0]!r} is a derived statistic; a series publishes "
            "count tables (marginal, prefix, ranges, total, matrix items)"
        )
    if spec.reconstruct != "least_squares":
        raise ValueError(
            f"series needs reconstruct: least_squares (got {spec.reconstruct!r}): each "
            "published figure is a linear combination of the periods' measurements"
        )


def _check_period_column(spec: Any, column: str) -> None:
    """The period column is the time axis: neither a domain attribute nor the person column."""
    if column in spec.domain:
        raise ValueError(
            f"series.period.column ({column!r}) is an attribute of the domain; the period column "
            "is the time axis, not a cell dimension: remove it from the domain (its values are "
            "series.period.values)"
        )
    if column == spec.privacy_unit.person_column:
        raise ValueError(
            f"series.period.column ({column!r}) is privacy_unit.person_column; the period column "
            "is the time axis: name the column that holds each row's period"
        )


def period_column_partition(spec: Any) -> str | None:
    """The period column of a column series whose partitions are its periods, else None."""
    series = spec.series
    columns = None if series is None else series.columns
    partitions = spec.dataset.partitions
    if columns is None or partitions is None or partitions.column != columns.column:
        return None
    return columns.column


def arrival_source(spec: Any, arrived: str) -> str:
    """What a release started by the arrival of file ``arrived`` reads: that file (file periods:
    it is the next period's file; any release without column periods), or, for column periods,
    the spec's whole ``dataset.source`` (a period is the rows of its value wherever they lie in
    the source: the past periods a release re-reads, hive folders ``NAME=<value>/``; the arrival
    only starts the run, like a schedule's tick)."""
    series = spec.series
    if series is None or series.columns is None or spec.dataset.source is None:
        return arrived
    return str(spec.dataset.source)
