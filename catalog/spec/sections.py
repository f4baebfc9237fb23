"""The sections of a release spec: dataset, privacy unit, workload items, schedule and review."""

from __future__ import annotations

import math
import re
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from dprelease.catalog.spec.domain import Strict
from dprelease.catalog.spec.limits import (
    MAX_ITEM_WEIGHT,
    MAX_ROWS_PER_PERSON,
    check_privacy_dict,
)
from dprelease.mechanisms.derived import DERIVED_KINDS
from dprelease.mechanisms.primitives.privacy import PrivacyCost, cost_from_dict

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class Partitions(Strict):
    """``{by: file}`` or ``{by: column, column: NAME}`` (short ``{column: NAME}``): the data owner
    declares that these partitions hold disjoint sets of people (see ``catalog.partitions``)."""

    by: Literal["file", "column"]
    column: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _column_alone(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "column" in raw and "by" not in raw:
            return {**raw, "by": "column"}
        return raw

    @model_validator(mode="after")
    def _check(self) -> Partitions:
        if self.by == "column" and not self.column:
            raise ValueError("partitions {by: column} needs column: NAME (a domain attribute)")
        if self.by == "file" and self.column is not None:
            raise ValueError(
                f"partitions {{by: file}} takes no column (got {self.column!r}); use "
                "{by: column, column: NAME} to partition by a column"
            )
        return self

    def declaration(self) -> str:
        return "file" if self.by == "file" else f"column:{self.column}"


class DatasetSection(Strict):
    id: str = Field(pattern=ID_PATTERN)
    source: str | None = None
    budget: dict[str, float]
    partitions: Partitions | None = None
    """Disjoint partitions (parallel composition): a cap per partition in the ledger."""

    @field_validator("budget")
    @classmethod
    def _check_budget(cls, budget: dict[str, float]) -> dict[str, float]:
        return check_privacy_dict(budget, field="budget")

    def budget_cap(self) -> PrivacyCost:
        return cost_from_dict(self.budget)


class PrivacyUnit(Strict):
    """``{rows_per_person: 1}`` (each row is a person) or ``{person_column, max_rows}``."""

    rows_per_person: int | None = None
    person_column: str | None = None
    max_rows: int | None = None
    persons_colocated: bool = False
    """Declared by the data custodian: all rows of one person are in one input file (lets a Dask
    run bound contributions file by file; without it a Dask run refuses a ``person_column``)."""

    @model_validator(mode="after")
    def _check(self) -> PrivacyUnit:
        if self.person_column is None:
            if self.max_rows is not None:
                raise ValueError("max_rows needs person_column")
            if self.persons_colocated:
                raise ValueError("persons_colocated needs person_column")
            if self.rows_per_person is None:
                raise ValueError("give rows_per_person, or person_column with max_rows")
            if self.rows_per_person < 1:
                raise ValueError(f"rows_per_person ({self.rows_per_person}) must be >= 1")
        else:
            if self.rows_per_person is not None:
                raise ValueError("give either rows_per_person or person_column/max_rows, not both")
            if self.max_rows is None or self.max_rows < 1:
                raise ValueError(f"max_rows ({self.max_rows}) must be an integer >= 1")
        if self.contribution_bound > MAX_ROWS_PER_PERSON:
            field = "max_rows" if self.person_column is not None else "rows_per_person"
            raise ValueError(
                f"{field} ({self.contribution_bound}) must be at most {MAX_ROWS_PER_PERSON:,} "
                "(the noise scale grows with it)"
            )
        return self

    @property
    def contribution_bound(self) -> int:
        return int(self.max_rows if self.person_column is not None else self.rows_per_person or 1)


ITEM_KINDS = (
    "marginal",
    "prefix",
    "all_ranges",
    "ranges",
    "total",
    "matrix",
    "marginals",
    *DERIVED_KINDS,
)
MAX_QUANTILE_LEVELS = 99


class MarginalsSelection(Strict):
    """``{attributes: [a, b, ...] | all, degree: k}``: every k-way marginal of those attributes."""

    attributes: list[str] | Literal["all"]
    degree: int

    @model_validator(mode="after")
    def _check(self) -> MarginalsSelection:
        if self.degree < 1:
            raise ValueError(f"marginals.degree ({self.degree}) must be an integer >= 1")
        if isinstance(self.attributes, list):
            if not self.attributes:
                raise ValueError("marginals.attributes must list attributes (or be all)")
            if len(set(self.attributes)) != len(self.attributes):
                raise ValueError(f"marginals.attributes {self.attributes} lists an attribute twice")
            if self.degree > len(self.attributes):
                raise ValueError(
                    f"marginals.degree ({self.degree}) exceeds the {len(self.attributes)} "
                    "attributes listed"
                )
        return self


class QuantilesSelection(Strict):
    """``{of: COL, q: [0.5, 0.9]}``: quantiles of a numeric column at levels strictly in (0, 1)."""

    of: str
    q: list[float]

    @field_validator("q")
    @classmethod
    def _check_levels(cls, q: list[float]) -> list[float]:
        if not 1 <= len(q) <= MAX_QUANTILE_LEVELS:
            raise ValueError(f"quantiles.q ({q}) must list 1 to {MAX_QUANTILE_LEVELS} levels")
        for level in q:
            if not (math.isfinite(level) and 0 < level < 1):
                raise ValueError(f"quantiles.q level {level} must lie strictly between 0 and 1")
        if len(set(q)) != len(q):
            raise ValueError(f"quantiles.q ({q}) lists a level twice")
        return q


def check_std_error_target(value: float | None, *, field: str) -> float | None:
    """A standard-error target is a finite number > 0 (in counts)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{field} ({value}) must be a finite number > 0 (a count)")
    return value


class Accuracy(Strict):
    """Accuracy targets instead of a privacy level (``accuracy:`` in a spec).

    Every released cell of a table gets at most the table's ``max_std_error`` (its own, else this
    default); ``plan`` finds the smallest privacy loss under ``noise`` whose strategy meets every
    target and ``run`` charges exactly that.
    """

    max_std_error: float | None = None
    """The target of every table that does not give its own."""
    max_half_width: float | None = None
    """Or the target as the half-width of a ``confidence`` interval (Gaussian noise: every cell's
    estimate is normal, so it is ``max_std_error = max_half_width / z_{(1+confidence)/2}``)."""
    confidence: float = 0.95
    """The level of the intervals ``max_half_width`` targets are stated for."""
    noise: Literal["gaussian", "laplace"] = "gaussian"
    """``gaussian``: the smallest ρ (zCDP; the budget is in rho); ``laplace``: the smallest ε."""

    @field_validator("max_std_error", "max_half_width")
    @classmethod
    def _check_target(cls, value: float | None, info: ValidationInfo) -> float | None:
        return check_std_error_target(value, field=f"accuracy.{info.field_name}")

    @model_validator(mode="after")
    def _check_half_width(self) -> Accuracy:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"accuracy.confidence ({self.confidence}) must be in (0, 1)")
        check_one_target(self.max_std_error, self.max_half_width, where="accuracy")
        return self

    def std_error(self, *, std_error: float | None, half_width: float | None) -> float | None:
        """A table's target as a standard error: its own (``std_error``, or ``half_width`` at
        this ``confidence``), else this section's default; None when neither gives one."""
        if std_error is None and half_width is None:
            std_error, half_width = self.max_std_error, self.max_half_width
        if half_width is not None:
            return half_width / NormalDist().inv_cdf((1.0 + self.confidence) / 2.0)
        return std_error


def check_item_weight(weight: float | None, *, where: str) -> None:
    """A weight is a finite number in (0, :data:`MAX_ITEM_WEIGHT`]."""
    if weight is not None and not (math.isfinite(weight) and 0 < weight <= MAX_ITEM_WEIGHT):
        raise ValueError(
            f"{where}: weight ({weight!r}) must be a finite number > 0 and <= {MAX_ITEM_WEIGHT:g} "
            "(how much the table's total variance counts; default 1)"
        )


def check_one_target(std_error: float | None, half_width: float | None, *, where: str) -> None:
    """A table's target is a standard error or an interval half-width, not both."""
    if std_error is not None and half_width is not None:
        raise ValueError(f"{where}: give max_std_error or max_half_width, not both")


class WorkloadItemSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    marginal: list[str] | None = None
    prefix: str | None = None
    all_ranges: list[str] | None = None
    ranges: dict[str, list[list[Any]]] | None = None
    total: bool | None = None
    matrix: str | None = None
    """Path of a ``.npy`` file holding an m × n query matrix over the cells of ``attributes``."""
    attributes: list[str] | None = None
    marginals: MarginalsSelection | None = None
    """All k-way marginals of some attributes: one output table each (see :func:`expand_item`)."""
    mean: str | None = None
    """Derived: the mean of a numeric column (per group of ``by``), from released counts."""
    sum: str | None = None
    """Derived: the sum of a numeric column (per group of ``by``), from released counts."""
    quantiles: QuantilesSelection | None = None
    """Derived: quantiles of a numeric column (per group of ``by``), from the released CDF."""
    by: list[str] | None = None
    """Group attributes of a derived item (one row per cell of theirs and statistic)."""
    representative: list[float] | None = None
    """Derived: the value each cell of the column counts as (default: the cells' midpoints)."""
    max_std_error: float | None = None
    """With ``accuracy:``, the largest standard error any cell of this table may have."""
    max_half_width: float | None = None
    """Or the largest half-width of its cells' intervals at ``accuracy.confidence``."""
    weight: float | None = None
    """How much this table counts under ``objective: total_variance`` (default 1): the plan
    minimises ``Σ_items weight × (sum of the variances of the item's cells)``; a ``marginals``
    item's tables each inherit it."""

    @model_validator(mode="after")
    def _one_kind(self) -> WorkloadItemSpec:
        where = f"workload item {self.name!r}"
        given = [k for k in ITEM_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"{where} must have exactly one of {', '.join(ITEM_KINDS)} (got {given or 'none'})"
            )
        if (self.matrix is None) != (self.attributes is None):
            raise ValueError(
                f"{where}: matrix and attributes go together "
                "(matrix: file.npy, attributes: [attribute])"
            )
        if self.attributes is not None and len(self.attributes) != 1:
            raise ValueError(
                f"{where}: a matrix item applies to exactly one attribute "
                f"(got {self.attributes}); combine attributes with marginal/ranges items instead"
            )
        if self.matrix is not None and not self.matrix.endswith(".npy"):
            raise ValueError(f"{where}: matrix ({self.matrix!r}) must be a .npy file")
        if self.marginal is not None and len(set(self.marginal)) != len(self.marginal):
            raise ValueError(f"marginal {self.marginal} lists an attribute twice")
        if self.all_ranges is not None and not 1 <= len(self.all_ranges) <= 2:
            raise ValueError(f"all_ranges ({self.all_ranges}) takes one or two attributes")
        if self.total is False:
            raise ValueError("total must be true when given")
        check_std_error_target(self.max_std_error, field=f"{where}: max_std_error")
        check_std_error_target(self.max_half_width, field=f"{where}: max_half_width")
        check_one_target(self.max_std_error, self.max_half_width, where=where)
        check_item_weight(self.weight, where=where)
        if self.derived_column is None:
            for field in ("by", "representative"):
                if getattr(self, field) is not None:
                    raise ValueError(
                        f"{where}: {field} applies only to derived items "
                        f"({', '.join(DERIVED_KINDS)})"
                    )
        elif self.by is not None:
            if len(set(self.by)) != len(self.by):
                raise ValueError(f"{where}: by {self.by} lists an attribute twice")
            if self.derived_column in self.by:
                raise ValueError(
                    f"{where}: by {self.by} must not contain the column "
                    f"{self.derived_column!r} the statistic is computed of"
                )
        return self

    @property
    def derived_column(self) -> str | None:
        """The column of a derived item (mean, sum, quantiles), None for other kinds."""
        if self.quantiles is not None:
            return self.quantiles.of
        return self.mean if self.mean is not None else self.sum

    @property
    def kind(self) -> str:
        return next(
            kind for kind in ITEM_KINDS if getattr(self, kind) is not None
        )  # validated: one

    def referenced_attributes(self) -> list[str]:
        """The attributes the item names (none for ``total`` and ``marginals`` of ``all``)."""
        if self.derived_column is not None:
            return [self.derived_column, *(self.by or [])]
        if self.prefix is not None:
            return [self.prefix]
        if self.marginals is not None:
            return [] if self.marginals.attributes == "all" else list(self.marginals.attributes)
        return list(self.marginal or self.all_ranges or self.ranges or self.attributes or [])

    def load_matrix(self, *, columns: int) -> np.ndarray:
        """The item's query matrix, checked: 2-D, finite, ``columns`` wide (the attribute's cells)."""
        where = f"workload item {self.name!r}"
        if self.matrix is None:
            raise ValueError(f"{where} has no matrix")
        try:
            matrix = np.load(self.matrix, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot read {self.matrix!r}: {exc}") from None
        if matrix.ndim != 2 or matrix.shape[0] < 1:
            raise ValueError(
                f"{where}: {self.matrix!r} must hold an m × n matrix (got shape {matrix.shape})"
            )
        if matrix.shape[1] != columns:
            raise ValueError(
                f"{where}: {self.matrix!r} has {matrix.shape[1]} columns but "
                f"{self.attributes} has {columns} cells"
            )
        if not np.issubdtype(matrix.dtype, np.number) or not np.all(np.isfinite(matrix)):
            raise ValueError(f"{where}: {self.matrix!r} must hold finite numbers")
        return matrix.astype(np.float64)


class Postprocess(Strict):
    nonnegative: bool = False


class Schedule(Strict):
    """A cron schedule for the spec's deployment (``dprelease deploy``)."""

    cron: str
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, cron: str) -> str:
        fields = cron.split()
        if len(fields) != 5:
            raise ValueError(
                f"cron ({cron!r}) must have 5 fields: minute hour day-of-month month day-of-week"
            )
        return cron


MAX_APPROVERS = 5
# Prefect addresses a saved block as "<block type slug>/<block document name>" (both slugs).
_BLOCK_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}/[a-z0-9][a-z0-9-]{0,62}$"


class ReviewPolicy(Strict):
    """Who must approve a staged release before it is published (``review:`` in a spec).

    The person who ran the release (``DPRELEASE_OPERATOR``, else the login name) may not approve
    it, with or without a ``review`` section, unless ``allow_self_approval: true`` (a one-person
    setup; recorded with the release, shown by ``dprelease review ID``); ``approvers`` distinct
    reviewers must approve.  ``notify`` names the Prefect notification block told when the release
    is staged (see deploy/NOTIFICATIONS.md).
    """

    approvers: int = Field(default=1, ge=1, le=MAX_APPROVERS)
    notify: str | None = None
    allow_self_approval: bool = False

    @field_validator("notify")
    @classmethod
    def _check_notify(cls, notify: str | None) -> str | None:
        if notify is not None and not re.match(_BLOCK_PATTERN, notify):
            raise ValueError(
                f"notify ({notify!r}) must name a saved Prefect block as BLOCK_TYPE/BLOCK_NAME in "
                "lowercase letters, digits and dashes, e.g. custom-webhook/dprelease-reviewers"
            )
        return notify
