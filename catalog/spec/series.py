"""The ``series`` section of a release spec: one release per period over a declared horizon.

``series: {period: file, horizon: T, time_workload: [period, cumulative, {rolling: 12}]}``: each
file of ``dataset.source`` is one period (the files in name order, one released per run); the
release workload is the time workload (each part published at every period) times the cell
workload (``workload``).  The horizon plan (:mod:`catalog.planning.series`) fixes a causal
strategy for all ``T`` periods at the first release; later releases follow it.

Rules (each refused with a message naming the field): Gaussian noise under zCDP only
(``privacy: {rho: ...}``); event level (``rows_per_person``) needs ``dataset.partitions: {by:
file}`` (each period is a partition of people, charged its own increment); person level
(``person_column``, ``max_rows`` per period) needs no partitions (a person may be in every
period; charges are sequential on the whole dataset); a central release of count tables with a
least-squares reconstruction.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

from dprelease.catalog.spec.domain import Strict
from dprelease.mechanisms.continual.workloads import time_workload

MAX_SERIES_HORIZON = 360
"""Periods a series may declare: the horizon plan is a T × T factorisation (optimised in O(T³)
per iteration) and every period is one partition of the ledger."""

TimePart = Literal["period", "cumulative"] | dict[str, int]


class SeriesSection(Strict):
    """``series:`` of a spec (module docstring)."""

    period: str
    """``file``: each file of ``dataset.source`` is one period (its partition), in name order."""
    horizon: int
    """How many periods the series has: its plan covers exactly these; a release past it is refused."""
    time_workload: list[TimePart]
    """What is published at each period: ``period`` (the period's own counts), ``cumulative``
    (counts to date), ``{rolling: w}`` (the last w periods)."""

    @field_validator("period")
    @classmethod
    def _check_period(cls, period: str) -> str:
        if period != "file":
            raise ValueError(
                f"series.period ({period!r}) must be 'file' (each file of dataset.source is one "
                "period); periods given by a column's values are not supported: write one file "
                "per period"
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
    if spec.privacy_unit.person_column is None:
        if partitions is None or partitions.by != "file":
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
