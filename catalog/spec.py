"""The release spec: pydantic models for the YAML a release engineer writes (the contract).

Everything in a spec is public: the domain, bins and workload never come from the data.  Every
invalid spec fails here, before any work, with a :class:`~catalog.errors.SpecError` whose message
names the field, the value and the rule.

Domain kinds, each turning raw column values into cell indices with vectorised numpy (applied to
the *distinct* values of a column, never row by row):

* integer range ``{min, max, width=1}``: cells ``[min + k·width, min + (k+1)·width − 1]``;
* numeric bins ``{bins: [e0, e1, …, ek]}`` (edges; cell i is ``[e_i, e_{i+1})``, the last one closed)
  or ``{bins: [[lo, hi], …]}`` (half-open ``[lo, hi)`` pairs, sorted and non-overlapping);
* categorical ``{values: [...], ordered: false}``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from catalog.engine import Execution
from catalog.errors import SpecError
from mechanisms import registry
from mechanisms.derived import DERIVED_KINDS, BinnedColumn, support_item
from mechanisms.privacy import PrivacyCost, cost_from_dict
from mechanisms.workload import WorkloadItem

_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

# --- supported sizes and ranges (refused before any work, with the field and the range named) -----
# Privacy parameters.  Outside these, the noise scale (Δ/ε for Laplace, Δ/√(2ρ) for Gaussian) or its
# square overflows or underflows float64 once multiplied by a sensitivity and a contribution bound,
# or the guarantee is void.  The ρ range is the ε range mapped by ρ = ε²/2 (ε-DP ⇒ ε²/2-zCDP).
EPSILON_RANGE = (1e-6, 100.0)
RHO_RANGE = (EPSILON_RANGE[0] ** 2 / 2, EPSILON_RANGE[1] ** 2 / 2)  # (5e-13, 5000)
# δ: at most 1e-3 (≈ 1/n for a thousand people is already a weak guarantee) unless the spec says
# ``allow_large_delta: true``; below 1e-30 ln(1/δ) adds nothing a smaller ε would not.
DELTA_RANGE = (1e-30, 1e-3)
# Lifetime caps of a dataset (``dataset.budget``): the same lower ends, 100 releases at the maximum.
BUDGET_EPSILON_RANGE = (EPSILON_RANGE[0], 100 * EPSILON_RANGE[1])
BUDGET_RHO_RANGE = (RHO_RANGE[0], 100 * RHO_RANGE[1])
MAX_ROWS_PER_PERSON = 1_000_000  # contribution bound: keeps sensitivity × bound / ε finite
MAX_DOMAIN_INTEGER = 2**53  # |min|, |max|, width of an integer range: exact in float64 encoding
MAX_CELLS_PER_ATTRIBUTE = 10_000_000
# Domain size.  ``plan`` works on implicit operators and never allocates the cell vector, but cell
# indices and sizes are int64 and products of sizes are formed in float64: 1e18 < 2⁶³ ≈ 9.2e18.
MAX_PLAN_CELLS = 10**18
# A run holds the cell vector (float64) and the released tables (one row per query) in memory.
MAX_RELEASE_CELLS = 200_000_000  # 1.6 GB of float64
MAX_RELEASE_QUERIES = 200_000_000  # rows of all output tables together
# YAML: a spec is a small hand-written file.  No anchors/aliases (an alias bomb expands
# exponentially), bounded size and nesting (PyYAML composes recursively).
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_DEPTH = 32


class _Strict(BaseModel):
    # strict: no coercion, so a boolean is never a number (``epsilon: true`` is not 1) and a quoted
    # string is never a number or a flag.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- domain attributes ----------------------------------------------------------------------------


class IntegerRange(_Strict):
    """Integers ``min..max`` in cells of ``width`` values (the last cell may be narrower)."""

    kind: Literal["integer"] = "integer"
    min: int
    max: int
    width: int = 1

    @model_validator(mode="after")
    def _check(self) -> IntegerRange:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        if self.width < 1:
            raise ValueError(f"width ({self.width}) must be >= 1")
        for name in ("min", "max", "width"):
            if abs(getattr(self, name)) > MAX_DOMAIN_INTEGER:
                raise ValueError(
                    f"{name} ({getattr(self, name)}) must be within ±{MAX_DOMAIN_INTEGER:,} "
                    "(2**53, the integers float64 represents exactly)"
                )
        if self.size > MAX_CELLS_PER_ATTRIBUTE:
            raise ValueError(
                f"{self.size} cells is more than the {MAX_CELLS_PER_ATTRIBUTE:,} allowed per attribute"
            )
        return self

    @property
    def size(self) -> int:
        return (self.max - self.min) // self.width + 1

    @property
    def ordered(self) -> bool:
        return True

    def cell_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lower = self.min + self.width * np.arange(self.size)
        return lower, np.minimum(lower + self.width - 1, self.max)

    def labels(self) -> list[Any]:
        lower, upper = self.cell_bounds()
        if self.width == 1:
            return [int(v) for v in lower]
        return [f"{lo}-{hi}" for lo, hi in zip(lower, upper, strict=True)]

    def encode(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cell index, in-domain mask) for an array of raw values. O(k) for k values."""
        values = np.asarray(values, dtype=np.float64)
        valid = (values >= self.min) & (values <= self.max) & (np.floor(values) == values)
        index = np.where(valid, (np.where(valid, values, self.min) - self.min) // self.width, 0)
        return index.astype(np.int64), valid

    def value_to_cell(self, value: float, *, edge: Literal["low", "high"]) -> int:
        index, valid = self.encode(np.array([value]))
        if not valid[0]:
            raise ValueError(f"{value} is outside [{self.min}, {self.max}]")
        lower, upper = self.cell_bounds()
        cell = int(index[0])
        aligned = lower[cell] if edge == "low" else upper[cell]
        if value != aligned:
            raise ValueError(
                f"{value} is not a cell {'start' if edge == 'low' else 'end'} "
                f"(cells have width {self.width}; nearest is {aligned})"
            )
        return cell

    def bound_labels(self) -> tuple[list[Any], list[Any]]:
        lower, upper = self.cell_bounds()
        return [int(v) for v in lower], [int(v) for v in upper]


class NumericBins(_Strict):
    """Explicit numeric bins: edges ``[e0, …, ek]`` or half-open pairs ``[[lo, hi), …]``."""

    kind: Literal["bins"] = "bins"
    bins: list[float] | list[list[float]]

    @field_validator("bins")
    @classmethod
    def _check_bins(cls, bins: list[Any]) -> list[Any]:
        if not bins:
            raise ValueError("bins must not be empty")
        if isinstance(bins[0], list):
            for k, pair in enumerate(bins):
                if len(pair) != 2:
                    raise ValueError(f"bin {k} ({pair}) must be a [low, high) pair")
                if not all(math.isfinite(v) for v in pair):
                    raise ValueError(f"bin {k} ({pair}) must be finite")
                if not pair[0] < pair[1]:
                    raise ValueError(f"bin {k} ({pair}) is empty: low must be < high")
                if k and pair[0] < bins[k - 1][1]:
                    raise ValueError(
                        f"bin {k} ({pair}) overlaps bin {k - 1} ({bins[k - 1]}): bins must be "
                        "sorted and must not overlap"
                    )
            return bins
        if len(bins) < 2:
            raise ValueError(f"bin edges ({bins}) need at least two values")
        if not all(math.isfinite(v) for v in bins):
            raise ValueError(f"bin edges ({bins}) must be finite")
        for k in range(1, len(bins)):
            if not bins[k] > bins[k - 1]:
                raise ValueError(
                    f"bin edges must be strictly increasing: edge {k} ({bins[k]}) <= "
                    f"edge {k - 1} ({bins[k - 1]}) makes an empty or overlapping bin"
                )
        return bins

    def pairs(self) -> np.ndarray:
        if isinstance(self.bins[0], list):
            return np.asarray(self.bins, dtype=np.float64)
        edges = np.asarray(self.bins, dtype=np.float64)
        return np.column_stack([edges[:-1], edges[1:]])

    @property
    def size(self) -> int:
        return len(self.pairs())

    @property
    def ordered(self) -> bool:
        return True

    def labels(self) -> list[Any]:
        pairs = self.pairs()
        last = len(pairs) - 1
        closed_last = not isinstance(self.bins[0], list)
        return [
            f"[{_fmt(lo)}, {_fmt(hi)}{']' if closed_last and k == last else ')'}"
            for k, (lo, hi) in enumerate(pairs)
        ]

    def encode(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values = np.asarray(values, dtype=np.float64)
        pairs = self.pairs()
        index = np.searchsorted(pairs[:, 0], values, side="right") - 1
        safe = np.clip(index, 0, len(pairs) - 1)
        valid = (index >= 0) & (values < pairs[safe, 1])
        if not isinstance(self.bins[0], list):  # edges: the last bin includes its upper edge
            valid |= values == pairs[-1, 1]
            safe = np.where(values == pairs[-1, 1], len(pairs) - 1, safe)
        return safe.astype(np.int64), valid

    def value_to_cell(self, value: float, *, edge: Literal["low", "high"]) -> int:
        pairs = self.pairs()
        column = pairs[:, 0] if edge == "low" else pairs[:, 1]
        hits = np.flatnonzero(column == value)
        if hits.size == 0:
            raise ValueError(f"{value} is not a bin {'lower' if edge == 'low' else 'upper'} edge")
        return int(hits[0])

    def bound_labels(self) -> tuple[list[Any], list[Any]]:
        pairs = self.pairs()
        return [float(v) for v in pairs[:, 0]], [float(v) for v in pairs[:, 1]]


class Categorical(_Strict):
    """Categorical values; ``ordered: true`` allows prefix and range queries in list order."""

    kind: Literal["categorical"] = "categorical"
    values: list[Annotated[str, Field(strict=True)]] | list[Annotated[int, Field(strict=True)]]
    ordered: bool = False
    # display names, one per value in the same order (codes 0/1 read Female/Male): released
    # tables and the report show them; queries (ranges) and the data keep using ``values``
    value_labels: list[Annotated[str, Field(strict=True, min_length=1)]] | None = None

    @model_validator(mode="after")
    def _check_value_labels(self) -> Categorical:
        names = self.value_labels
        if names is None:
            return self
        if len(names) != len(self.values):
            raise ValueError(
                f"value_labels has {len(names)} entries but values has {len(self.values)}: give "
                "one label per value, in the same order"
            )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"value_labels {repeated} are listed twice; labels must be distinct")
        return self

    @field_validator("values")
    @classmethod
    def _check_values(cls, values: list[Any]) -> list[Any]:
        if not values:
            raise ValueError("values must not be empty")
        seen: set[Any] = set()
        for value in values:
            if value in seen:
                raise ValueError(f"value {value!r} is listed twice; categories must be distinct")
            seen.add(value)
        return values

    @property
    def size(self) -> int:
        return len(self.values)

    def labels(self) -> list[Any]:
        return list(self.value_labels or self.values)

    def encode(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # vectorised over the distinct values handed in (group keys), never over rows
        categories = np.asarray(self.values, dtype=object)
        order = np.argsort(categories)
        values = np.asarray(values, dtype=object)
        try:
            position = np.searchsorted(categories[order], values)
        except TypeError:  # values of another type than the categories: none match
            return np.zeros(len(values), dtype=np.int64), np.zeros(len(values), dtype=bool)
        position = np.clip(position, 0, len(categories) - 1)
        found = categories[order][position] == values
        index = np.where(found, order[position], 0).astype(np.int64)
        return index, np.asarray(found, dtype=bool)

    def value_to_cell(self, value: Any, *, edge: Literal["low", "high"]) -> int:
        if value not in self.values:
            raise ValueError(f"{value!r} is not one of the values {self.values}")
        return self.values.index(value)

    def bound_labels(self) -> tuple[list[Any], list[Any]]:
        return self.labels(), self.labels()


Attribute = IntegerRange | NumericBins | Categorical


def _parse_attribute(name: str, raw: Any) -> Attribute:
    if not isinstance(raw, dict):
        raise ValueError(f"domain.{name} ({raw!r}) must be a mapping")
    kind: type[Attribute] | None = None
    if "values" in raw:
        kind = Categorical
    elif "bins" in raw:
        kind = NumericBins
    elif "min" in raw or "max" in raw:
        kind = IntegerRange
    if kind is not None:
        try:
            return kind(**raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {_error_message(e)}"
                for e in exc.errors(include_url=False)
            )
            raise ValueError(f"domain.{name} ({raw!r}): {problems}") from None
    raise ValueError(
        f"domain.{name} ({raw!r}) must be an integer range {{min, max[, width]}}, "
        "numeric bins {bins: [...]} or categorical {values: [...]}"
    )


# --- the rest of the spec -------------------------------------------------------------------------


class Partitions(_Strict):
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


class DatasetSection(_Strict):
    id: str = Field(pattern=_ID_PATTERN)
    source: str | None = None
    budget: dict[str, float]
    partitions: Partitions | None = None
    """Disjoint partitions (parallel composition): a cap per partition in the ledger."""

    @field_validator("budget")
    @classmethod
    def _check_budget(cls, budget: dict[str, float]) -> dict[str, float]:
        return _check_privacy_dict(budget, field="budget")

    def budget_cap(self) -> PrivacyCost:
        return cost_from_dict(self.budget)


class PrivacyUnit(_Strict):
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
MAX_EXPANDED_MARGINALS = 10_000
"""Output tables one ``marginals`` item may expand to (C(14, 3) = 364 for Adult's 3-way)."""


class MarginalsSelection(_Strict):
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


class QuantilesSelection(_Strict):
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


class WorkloadItemSpec(_Strict):
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

    @model_validator(mode="after")
    def _one_kind(self) -> WorkloadItemSpec:
        given = [k for k in ITEM_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"workload item {self.name!r} must have exactly one of "
                f"{', '.join(ITEM_KINDS)} (got {given or 'none'})"
            )
        if (self.matrix is None) != (self.attributes is None):
            raise ValueError(
                f"workload item {self.name!r}: matrix and attributes go together "
                "(matrix: file.npy, attributes: [attribute])"
            )
        if self.attributes is not None and len(self.attributes) != 1:
            raise ValueError(
                f"workload item {self.name!r}: a matrix item applies to exactly one attribute "
                f"(got {self.attributes}); combine attributes with marginal/ranges items instead"
            )
        if self.matrix is not None and not self.matrix.endswith(".npy"):
            raise ValueError(
                f"workload item {self.name!r}: matrix ({self.matrix!r}) must be a .npy file"
            )
        if self.marginal is not None and len(set(self.marginal)) != len(self.marginal):
            raise ValueError(f"marginal {self.marginal} lists an attribute twice")
        if self.all_ranges is not None and not 1 <= len(self.all_ranges) <= 2:
            raise ValueError(f"all_ranges ({self.all_ranges}) takes one or two attributes")
        if self.total is False:
            raise ValueError("total must be true when given")
        if self.derived_column is None:
            for field in ("by", "representative"):
                if getattr(self, field) is not None:
                    raise ValueError(
                        f"workload item {self.name!r}: {field} applies only to derived items "
                        f"({', '.join(DERIVED_KINDS)})"
                    )
        elif self.by is not None:
            if len(set(self.by)) != len(self.by):
                raise ValueError(
                    f"workload item {self.name!r}: by {self.by} lists an attribute twice"
                )
            if self.derived_column in self.by:
                raise ValueError(
                    f"workload item {self.name!r}: by {self.by} must not contain the column "
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
        for kind in ITEM_KINDS:
            if getattr(self, kind) is not None:
                return kind
        raise AssertionError("unreachable: validated to have one kind")  # pragma: no cover

    def referenced_attributes(self) -> list[str]:
        if self.marginal is not None:
            return list(self.marginal)
        if self.prefix is not None:
            return [self.prefix]
        if self.all_ranges is not None:
            return list(self.all_ranges)
        if self.ranges is not None:
            return list(self.ranges)
        if self.attributes is not None:
            return list(self.attributes)
        if self.marginals is not None and self.marginals.attributes != "all":
            return list(self.marginals.attributes)
        if self.derived_column is not None:
            return [self.derived_column, *(self.by or [])]
        return []

    def load_matrix(self, *, columns: int) -> np.ndarray:
        """The item's query matrix, checked: 2-D, finite, ``columns`` wide (the attribute's cells)."""
        if self.matrix is None:
            raise ValueError(f"workload item {self.name!r} has no matrix")
        try:
            matrix = np.load(self.matrix, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"workload item {self.name!r}: cannot read {self.matrix!r}: {exc}"
            ) from None
        if matrix.ndim != 2 or matrix.shape[0] < 1:
            raise ValueError(
                f"workload item {self.name!r}: {self.matrix!r} must hold an m × n matrix (got shape {matrix.shape})"
            )
        if matrix.shape[1] != columns:
            raise ValueError(
                f"workload item {self.name!r}: {self.matrix!r} has {matrix.shape[1]} columns but "
                f"{self.attributes} has {columns} cells"
            )
        if not np.issubdtype(matrix.dtype, np.number) or not np.all(np.isfinite(matrix)):
            raise ValueError(
                f"workload item {self.name!r}: {self.matrix!r} must hold finite numbers"
            )
        return matrix.astype(np.float64)


class Postprocess(_Strict):
    nonnegative: bool = False


class Schedule(_Strict):
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


class ReviewPolicy(_Strict):
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


class ReleaseSpec(_Strict):
    """A validated release spec.  Build it with :func:`load_spec` or :func:`parse_spec`."""

    name: str = Field(pattern=_ID_PATTERN)
    dataset: DatasetSection
    privacy_unit: PrivacyUnit = PrivacyUnit(rows_per_person=1)
    domain: dict[str, Attribute]
    workload: list[WorkloadItemSpec]
    mechanism: str = "auto"
    mechanism_options: dict[str, Any] = Field(default_factory=dict)
    privacy: dict[str, float]
    on_out_of_domain: Literal["error", "drop"] = "error"
    postprocess: Postprocess = Postprocess()
    reconstruct: Literal["least_squares", "pgm", "auto"] = "least_squares"
    """``pgm``: consistent, non-negative tables (marginal-space plans; :mod:`catalog.estimators`);
    ``auto``: ``pgm`` where the plan supports it, least squares otherwise."""
    model: Literal["central", "local"] = "central"
    """``local``: users randomise on their devices with a published strategy (``dprelease ldp``);
    ``privacy.epsilon`` is then the per-user ε and ``dataset.source`` holds their responses."""
    schedule: Schedule | None = None
    trigger: Literal["arrival"] | None = None
    review: ReviewPolicy | None = None
    """Separation of duties and reviewer notification; without it one reviewer decides, who is
    not the person who ran the release."""
    allow_large_delta: bool = False
    """Accept ``delta`` above 1e-3 in ``privacy`` and ``dataset.budget`` (shown in manifest/report)."""
    execution: Execution = Execution()
    """Where the run counts and noises: ``{engine: local | dask, address: tcp://…}`` (CLI wins)."""
    on_unchanged: Literal["skip", "release"] = "skip"
    """A scheduled or triggered run whose input and spec equal those of the last release of the
    series (same ``name`` and dataset id): ``skip`` charges nothing and records a ``skipped``
    ledger entry; ``release`` releases again (and pays again)."""

    @model_validator(mode="after")
    def _check_partitions(self) -> ReleaseSpec:
        partitions = self.dataset.partitions
        if partitions is None:
            return self
        if self.model == "local":
            raise ValueError(
                "dataset.partitions applies to central releases; a local-model (model: local) "
                "collection is charged as a whole"
            )
        if partitions.by == "column" and partitions.column not in self.domain:
            raise ValueError(
                f"dataset.partitions.column ({partitions.column!r}) must be an attribute of the "
                f"domain (the partitions are its public cells, never values read from the data); "
                f"the domain has {sorted(self.domain)}"
            )
        return self

    @field_validator("domain", mode="before")
    @classmethod
    def _parse_domain(cls, raw: Any) -> dict[str, Attribute]:
        if not isinstance(raw, dict) or not raw:
            raise ValueError("domain must be a non-empty mapping of attribute name to kind")
        return {str(name): _parse_attribute(str(name), value) for name, value in raw.items()}

    @field_validator("privacy")
    @classmethod
    def _check_privacy(cls, privacy: dict[str, float]) -> dict[str, float]:
        return _check_privacy_dict(privacy, field="privacy")

    @field_validator("mechanism")
    @classmethod
    def _check_mechanism(cls, mechanism: str) -> str:
        if mechanism != registry.AUTO and mechanism not in registry.names():
            raise ValueError(
                f"unknown mechanism {mechanism!r}; choose one of "
                f"{', '.join((registry.AUTO, *registry.names()))}"
            )
        return mechanism

    @field_validator("workload")
    @classmethod
    def _check_workload(cls, items: list[WorkloadItemSpec]) -> list[WorkloadItemSpec]:
        if not items:
            raise ValueError("workload must have at least one item")
        names = [item.name for item in items]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"workload item names must be unique; repeated: {duplicates}")
        return items

    @model_validator(mode="after")
    def _cross_checks(self) -> ReleaseSpec:
        for k, item in enumerate(self.workload):
            where = f"workload[{k}] ({item.name!r})"
            for attribute in item.referenced_attributes():
                if attribute not in self.domain:
                    raise ValueError(
                        f"{where}: unknown attribute {attribute!r}; the domain has {sorted(self.domain)}"
                    )
            if item.kind in ("prefix", "all_ranges", "ranges"):
                for attribute in item.referenced_attributes():
                    if not _is_ordered(self.domain[attribute]):
                        raise ValueError(
                            f"{where}: {item.kind} needs an ordered attribute, but {attribute!r} is "
                            "categorical (give it ordered: true, or use a marginal)"
                        )
            if item.ranges is not None:
                for attribute, pairs in item.ranges.items():
                    if not pairs:
                        raise ValueError(f"{where}: ranges for {attribute!r} must not be empty")
                    for pair in pairs:
                        if len(pair) != 2:
                            raise ValueError(f"{where}: range {pair} must be [low, high]")
                        try:
                            lo = self.domain[attribute].value_to_cell(pair[0], edge="low")
                            hi = self.domain[attribute].value_to_cell(pair[1], edge="high")
                        except ValueError as exc:
                            raise ValueError(
                                f"{where}: range {pair} on {attribute!r}: {exc}"
                            ) from None
                        if lo > hi:
                            raise ValueError(
                                f"{where}: range {pair} on {attribute!r} has low > high"
                            )
            if item.derived_column is not None:
                try:
                    derived_column(self, item)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
        if self.privacy_unit.person_column in self.domain:
            raise ValueError(
                f"privacy_unit.person_column ({self.privacy_unit.person_column!r}) must not be a domain attribute"
            )
        registry.check_options(
            requested=self.mechanism, model=self.model, options=self.mechanism_options
        )
        if self.model == "local":
            if set(self.privacy) != {"epsilon"}:
                raise ValueError(
                    f"model: local needs privacy {{epsilon}} (the per-user epsilon); got {self.privacy}"
                )
            if (
                self.privacy_unit.person_column is not None
                or (self.privacy_unit.rows_per_person or 1) != 1
            ):
                raise ValueError(
                    "model: local needs privacy_unit {rows_per_person: 1} (one response per user)"
                )
        return self

    @model_validator(mode="after")
    def _check_sizes_and_delta(self) -> ReleaseSpec:
        _check_large_delta(self.privacy, field="privacy", allowed=self.allow_large_delta)
        _check_large_delta(
            self.dataset.budget, field="dataset.budget", allowed=self.allow_large_delta
        )
        if self.num_cells > MAX_PLAN_CELLS:
            raise ValueError(
                f"domain has {self.num_cells:.3g} cells ({' × '.join(map(str, self.domain_shape))}); "
                f"at most {MAX_PLAN_CELLS:.0e} are supported (cell indices are 64-bit integers)"
            )
        for k, item in enumerate(self.workload):
            for attribute, pairs in (item.ranges or {}).items():
                if any(isinstance(v, bool) for pair in pairs for v in pair):
                    raise ValueError(
                        f"workload[{k}] ({item.name!r}): ranges for {attribute!r} ({pairs}) hold a "
                        "boolean; range bounds are numbers or category values, never true/false"
                    )
        return self

    @model_validator(mode="after")
    def _check_marginals_items(self) -> ReleaseSpec:
        """``marginals`` items: degree within the attributes, bounded table count, unique names."""
        names = [item.name for item in self.workload if item.marginals is None]
        for k, item in enumerate(self.workload):
            if item.marginals is None:
                continue
            where = f"workload[{k}] ({item.name!r})"
            chosen = _marginals_attributes(self, item)
            degree = item.marginals.degree
            if degree > len(chosen):
                raise ValueError(
                    f"{where}: marginals.degree ({degree}) exceeds the {len(chosen)} attributes"
                )
            tables = math.comb(len(chosen), degree)
            if tables > MAX_EXPANDED_MARGINALS:
                raise ValueError(
                    f"{where}: all {degree}-way marginals of {len(chosen)} attributes are "
                    f"{tables:,} tables; at most {MAX_EXPANDED_MARGINALS:,} per item"
                )
            names += [part.name for part in expand_item(self, item)]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"workload: marginals items expand to table names that repeat {repeated[:5]} "
                "(another item has that name, or attribute names differ only in characters "
                "outside A-Z a-z 0-9 _ -): rename an item"
            )
        return self

    # --- derived, public -------------------------------------------------------------------------
    def expanded_workload(self) -> list[WorkloadItemSpec]:
        """The workload with every ``marginals`` item replaced by its marginal items (in order)."""
        expanded: list[WorkloadItemSpec] = []
        for item in self.workload:
            expanded += expand_item(self, item) if item.marginals is not None else [item]
        return expanded

    @property
    def attribute_names(self) -> list[str]:
        return list(self.domain)

    @property
    def domain_shape(self) -> tuple[int, ...]:
        return tuple(attribute.size for attribute in self.domain.values())

    @property
    def num_cells(self) -> int:
        return math.prod(self.domain_shape)

    def privacy_target(self) -> PrivacyCost:
        return cost_from_dict(self.privacy)

    def canonical_json(self) -> str:
        # where a run counts changes no output; fields added later at their default change no hash
        data = self.model_dump(mode="json", exclude={"execution"})
        if not self.privacy_unit.persons_colocated:
            del data["privacy_unit"]["persons_colocated"]
        if self.dataset.partitions is None:
            del data["dataset"]["partitions"]
        if self.on_unchanged == "skip":
            del data["on_unchanged"]
        if self.review is not None and not self.review.allow_self_approval:
            del data["review"]["allow_self_approval"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def series_key(self) -> str:
        """sha256 of the spec minus where the input lives (``dataset.source``) and the
        ``on_unchanged`` policy: with the keyed input fingerprint (names and bytes of the input
        files), what "unchanged since the last release of the series" compares."""
        data = json.loads(self.canonical_json())
        data["dataset"].pop("source", None)
        data.pop("on_unchanged", None)
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def fingerprint(self) -> str:
        """sha256 of the canonical spec (everything, including the dataset and privacy level)."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def workload_fingerprint(self) -> str:
        """sha256 of what determines strategies: domain sizes and order, workload, noise kind, options."""
        payload = {
            "domain": {name: attr.model_dump(mode="json") for name, attr in self.domain.items()},
            "workload": [item.model_dump(mode="json", exclude_none=True) for item in self.workload],
            "matrices": [_file_sha256(item.matrix) for item in self.workload if item.matrix],
            "noise": "laplace" if self.privacy_target().measure == "pure" else "gaussian",
            "mechanism": self.mechanism,
            "options": self.mechanism_options,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _is_ordered(attribute: Attribute) -> bool:
    return attribute.ordered if isinstance(attribute, Categorical) else True


def _marginals_attributes(spec: ReleaseSpec, item: WorkloadItemSpec) -> list[str]:
    """A ``marginals`` item's attributes, in domain order."""
    selection = item.marginals
    if selection is None or selection.attributes == "all":
        return list(spec.domain)
    return [name for name in spec.domain if name in selection.attributes]


def expand_item(spec: ReleaseSpec, item: WorkloadItemSpec) -> list[WorkloadItemSpec]:
    """A ``marginals`` item as one ``marginal`` item per k-subset of its attributes (domain order),
    named ``<item>.<a>.<b>`` (characters outside ``A-Za-z0-9_-`` of an attribute name become
    ``_``, so every name is a safe file name). O(C(attributes, k)).

    The parts are built without re-validation: their attributes and names are checked by the
    spec's validators (``_cross_checks``, ``_check_marginals_items``).
    """
    if item.marginals is None:
        return [item]
    chosen = _marginals_attributes(spec, item)
    return [
        WorkloadItemSpec.model_construct(
            name=".".join([item.name, *(re.sub(r"[^A-Za-z0-9_-]", "_", a) for a in combo)]),
            marginal=list(combo),
        )
        for combo in itertools.combinations(chosen, item.marginals.degree)
    ]


def item_num_queries(spec: ReleaseSpec, item: WorkloadItemSpec) -> int:
    """Rows of the item's output table, from the spec alone (a matrix item reads only the .npy
    header; a ``marginals`` item: of all its tables). O(attributes)."""
    if item.marginals is not None:
        return sum(item_num_queries(spec, part) for part in expand_item(spec, item))
    if item.derived_column is not None:
        return derived_support(spec, item).num_queries + derived_rows(spec, item)
    count = 1
    for name, attribute in spec.domain.items():
        n = attribute.size
        if (item.marginal is not None and name in item.marginal) or item.prefix == name:
            count *= n
        elif item.all_ranges is not None and name in item.all_ranges:
            count *= n * (n + 1) // 2
        elif item.attributes is not None and name in item.attributes and item.matrix is not None:
            try:
                count *= int(np.load(item.matrix, mmap_mode="r", allow_pickle=False).shape[0])
            except (OSError, ValueError, IndexError) as exc:
                raise SpecError(
                    f"workload item {item.name!r}: cannot read {item.matrix!r}: {exc}"
                ) from None
        elif item.ranges is not None and name in item.ranges:
            count *= len(item.ranges[name])
    return count


def derived_column(spec: ReleaseSpec, item: WorkloadItemSpec) -> BinnedColumn:
    """The public cells of a derived item's column (raises ``ValueError`` naming the rule)."""
    name = item.derived_column
    attribute = spec.domain[name] if name is not None else None
    if not isinstance(attribute, IntegerRange | NumericBins):
        raise ValueError(
            f"{item.kind} needs a numeric column (an integer range or numeric bins), but "
            f"{name!r} is {type(attribute).__name__.lower()}"
        )
    if item.representative is not None and len(item.representative) != attribute.size:
        raise ValueError(
            f"representative lists {len(item.representative)} values but {name!r} has "
            f"{attribute.size} cells"
        )
    rep = None if item.representative is None else np.asarray(item.representative, np.float64)
    if isinstance(attribute, IntegerRange):
        lower, upper = attribute.cell_bounds()
        return BinnedColumn.of_cells(lower, upper, rep, integer=True)
    pairs = attribute.pairs()
    return BinnedColumn.of_cells(pairs[:, 0], pairs[:, 1], rep, integer=False)


def derived_support(spec: ReleaseSpec, item: WorkloadItemSpec) -> WorkloadItem:
    """The support queries a derived item adds to the workload (``<name>.moments`` or
    ``<name>.cdf``; see :mod:`mechanisms.derived`)."""
    names = list(spec.domain)
    kind = "quantiles" if item.quantiles is not None else "mean"
    return support_item(
        name=f"{item.name}.{'cdf' if kind == 'quantiles' else 'moments'}",
        kind=kind,
        domain_shape=spec.domain_shape,
        column_axis=names.index(str(item.derived_column)),
        by_axes=tuple(names.index(a) for a in item.by or []),
        column=derived_column(spec, item),
    )


def derived_rows(spec: ReleaseSpec, item: WorkloadItemSpec) -> int:
    """Rows of a derived item's table: one per group and statistic."""
    groups = math.prod(spec.domain[a].size for a in item.by or [])
    return groups * (len(item.quantiles.q) if item.quantiles is not None else 1)


def check_runnable(spec: ReleaseSpec) -> None:
    """Refuse, from the spec alone, a central release this machine cannot run; call it before any
    data is read (``plan`` does not need it: it works up to ``MAX_PLAN_CELLS``).

    Raises :class:`SpecError` naming the size and the limit: no ``dataset.source``, a cell vector of
    more than ``MAX_RELEASE_CELLS`` cells, or output tables of more than ``MAX_RELEASE_QUERIES``
    rows together.  O(attributes × workload items); reads no data.
    """
    if spec.dataset.source is None:
        raise SpecError(
            "dataset.source is not set in the spec; plan works without it, run does not"
        )
    if spec.num_cells > MAX_RELEASE_CELLS:
        raise SpecError(
            f"domain: the domain has {spec.num_cells:,} cells "
            f"({' × '.join(map(str, spec.domain_shape))}); a release counts at most "
            f"{MAX_RELEASE_CELLS:,} cells on one machine (plan works up to {MAX_PLAN_CELLS:.0e}): "
            "use wider bins or fewer attributes"
        )
    _check_release_rows({item.name: item_num_queries(spec, item) for item in spec.workload})


def _check_release_rows(sizes: dict[str, int], *, lower_bound: bool = False) -> None:
    """Refuse output tables above ``MAX_RELEASE_QUERIES`` rows, naming the largest item."""
    if sum(sizes.values()) > MAX_RELEASE_QUERIES:
        largest = max(sizes, key=lambda name: sizes[name])
        raise SpecError(
            f"workload: the output tables would have {'at least ' if lower_bound else ''}"
            f"{sum(sizes.values()):,} rows (item {largest!r}: {sizes[largest]:,}); a release "
            f"writes at most {MAX_RELEASE_QUERIES:,} rows: drop or narrow the largest items"
        )


def check_runnable_before_planning(spec: ReleaseSpec) -> None:
    """Refuse, from sizes alone, a central release that every later check would refuse, before
    the (costly) plan is made: planning a 10¹⁴-cell identity workload builds dense Gram matrices
    for seconds and gigabytes only to be refused afterwards.

    Raises :class:`SpecError` (the messages of :func:`check_runnable`): no ``dataset.source``;
    output tables of plain (not derived) items above ``MAX_RELEASE_QUERIES`` rows, which every
    mechanism writes; and, for a named mechanism that counts the full cell vector, a domain above
    ``MAX_RELEASE_CELLS``.  ``auto`` may still choose a marginal-space plan, so its cell count is
    checked after planning.  O(attributes × workload items); reads no data, builds no matrix.
    """
    if spec.model != "central":
        return
    if spec.dataset.source is None:
        raise SpecError(
            "dataset.source is not set in the spec; plan works without it, run does not"
        )
    plain = [item for item in spec.workload if item.derived_column is None]
    _check_release_rows(
        {item.name: item_num_queries(spec, item) for item in plain}, lower_bound=True
    )
    if (
        spec.mechanism != registry.AUTO
        and registry.get(spec.mechanism, model=spec.model).input_kind == "cells"
    ):
        check_runnable(spec)


def _check_privacy_dict(values: dict[str, float], *, field: str) -> dict[str, float]:
    keys = set(values)
    if keys not in ({"epsilon"}, {"rho"}, {"epsilon", "delta"}):
        raise ValueError(
            f"{field} keys {sorted(keys)} must be exactly one of {{epsilon}}, {{rho}}, {{epsilon, delta}}"
        )
    ranges = (
        {"epsilon": EPSILON_RANGE, "rho": RHO_RANGE}
        if field == "privacy"
        else {"epsilon": BUDGET_EPSILON_RANGE, "rho": BUDGET_RHO_RANGE}
    )
    for key, (low, high) in ranges.items():
        if key not in values:
            continue
        if not (math.isfinite(values[key]) and values[key] > 0):
            raise ValueError(f"{field}.{key} ({values[key]}) must be a finite number > 0")
        if not low <= values[key] <= high:
            raise ValueError(
                f"{field}.{key} ({values[key]:g}) is outside the supported range [{low:g}, {high:g}]: "
                "a smaller value makes the noise scale overflow, a larger one protects nothing"
            )
    if "delta" in values:
        if not 0 < values["delta"] < 1:
            raise ValueError(
                f"{field}.delta ({values['delta']}) must be in the open interval (0, 1)"
            )
        if values["delta"] < DELTA_RANGE[0]:
            raise ValueError(
                f"{field}.delta ({values['delta']:g}) is below the supported minimum "
                f"{DELTA_RANGE[0]:g} (use pure epsilon, or rho, for no delta at all)"
            )
    return values


def _check_large_delta(values: dict[str, float], *, field: str, allowed: bool) -> None:
    """δ above ``DELTA_RANGE[1]`` only with ``allow_large_delta: true`` (recorded in the spec)."""
    delta = values.get("delta")
    if delta is not None and delta > DELTA_RANGE[1] and not allowed:
        raise ValueError(
            f"{field}.delta ({delta:g}) must be at most {DELTA_RANGE[1]:g}: a larger delta allows "
            "a total disclosure with that probability; set allow_large_delta: true in the spec "
            "to accept it (the manifest and report show it)"
        )


def _file_sha256(path: str) -> str:
    """Content hash of a workload matrix file (so an edited matrix never hits a stale cache)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return f"unreadable:{path}"


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _py(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def parse_spec(data: Any, *, source: str = "<spec>") -> ReleaseSpec:
    """Validate a spec mapping; raise :class:`SpecError` naming field, value and rule."""
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a release spec must be a YAML mapping, got {type(data).__name__}"
        )
    try:
        return ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: invalid release spec:\n" + _format_errors(exc)) from None


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases, and with bounded nesting.

    An alias re-uses a node, so nine nested aliases expand to 10⁹ strings ("billion laughs") while
    the file stays under 1 kB; a spec never needs them.  Refused at the first anchor or alias
    event, before anything is expanded: O(size of the file).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise yaml.composer.ComposerError(
                None,
                None,
                f"YAML {kind}{event.anchor} is not allowed in a release spec (anchors, aliases "
                "and merge keys are refused: write the value out)",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_SPEC_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"YAML nesting deeper than {MAX_SPEC_DEPTH} levels is not allowed in a release spec",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_spec_yaml(path: Path) -> Any:
    """The YAML document of a spec file: at most ``MAX_SPEC_BYTES``, UTF-8, no anchors/aliases."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)  # never more, even from a growing file or a FIFO
    except OSError as exc:
        raise SpecError(f"spec file {str(path)!r} cannot be read: {exc.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            f"{path}: the spec file is larger than {MAX_SPEC_BYTES:,} bytes (1 MiB), the limit for "
            "a release spec; put large workload matrices in .npy files (workload item `matrix`)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path}: not UTF-8 text (byte {exc.start}); a release spec is a UTF-8 YAML file"
        ) from None
    try:
        return yaml.load(text, Loader=_SpecLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise SpecError(f"{path}: not valid YAML: {exc}") from None


def load_spec(path: str | Path) -> ReleaseSpec:
    """Read and validate a YAML spec.  A relative ``dataset.source`` is resolved against the spec's folder."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist")
    spec = parse_spec(read_spec_yaml(path), source=str(path))
    items = [
        item.model_copy(update={"matrix": str((path.parent / item.matrix).resolve())})
        if item.matrix is not None and not Path(item.matrix).is_absolute()
        else item
        for item in spec.workload
    ]
    spec = spec.model_copy(update={"workload": items})
    for item in spec.workload:
        if item.matrix is not None and item.attributes is not None:
            try:
                item.load_matrix(columns=spec.domain[item.attributes[0]].size)
            except ValueError as exc:
                raise SpecError(f"{path}: invalid release spec:\n  - workload: {exc}") from None
    source = spec.dataset.source
    if source is not None and not Path(source).is_absolute():
        resolved = str((path.parent / source).resolve())
        spec = spec.model_copy(
            update={"dataset": spec.dataset.model_copy(update={"source": resolved})}
        )
    return spec


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error["loc"]) or "spec"
        message = _error_message(error)
        value = error.get("input")
        shown = (
            "" if isinstance(value, dict | list) and len(repr(value)) > 120 else f" (got {value!r})"
        )
        lines.append(f"  - {location}: {message}{shown}")
    return "\n".join(lines)


def _error_message(error: Any) -> str:
    """One pydantic error's message, saying why a boolean was refused where a number belongs."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if isinstance(error.get("input"), bool) and error["type"] in ("float_type", "int_type"):
        message += "; a boolean (true/false) is not a number"
    return message
