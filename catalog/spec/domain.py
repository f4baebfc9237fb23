"""Domain attributes: each turns raw column values into cell indices with vectorised numpy
(applied to the *distinct* values of a column, never row by row).

* integer range ``{min, max, width=1}``: cells ``[min + k·width, min + (k+1)·width − 1]``;
* numeric bins ``{bins: [e0, e1, …, ek]}`` (edges; cell i is ``[e_i, e_{i+1})``, the last one closed)
  or ``{bins: [[lo, hi], …]}`` (half-open ``[lo, hi)`` pairs, sorted and non-overlapping);
* categorical ``{values: [...], ordered: false}``."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dprelease.catalog.spec.limits import MAX_CELLS_PER_ATTRIBUTE, MAX_DOMAIN_INTEGER


class Strict(BaseModel):
    # strict: no coercion, so a boolean is never a number (``epsilon: true`` is not 1) and a quoted
    # string is never a number or a flag.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class IntegerRange(Strict):
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

    ordered: ClassVar[bool] = True

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


class NumericBins(Strict):
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

    ordered: ClassVar[bool] = True

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


class Categorical(Strict):
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
        if repeated := sorted({name for name in names if names.count(name) > 1}):
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


def parse_attribute(name: str, raw: Any) -> Attribute:
    if not isinstance(raw, dict):
        raise ValueError(f"domain.{name} ({raw!r}) must be a mapping")
    kind: type[Attribute]
    if "values" in raw:
        kind = Categorical
    elif "bins" in raw:
        kind = NumericBins
    elif "min" in raw or "max" in raw:
        kind = IntegerRange
    else:
        raise ValueError(
            f"domain.{name} ({raw!r}) must be an integer range {{min, max[, width]}}, "
            "numeric bins {bins: [...]} or categorical {values: [...]}"
        )
    try:
        return kind(**raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {error_message(e)}"
            for e in exc.errors(include_url=False)
        )
        raise ValueError(f"domain.{name} ({raw!r}): {problems}") from None


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def error_message(error: Any) -> str:
    """One pydantic error's message, saying why a boolean was refused where a number belongs."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if isinstance(error.get("input"), bool) and error["type"] in ("float_type", "int_type"):
        message += "; a boolean (true/false) is not a number"
    return message
