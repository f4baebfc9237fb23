"""Time workloads as explicit matrices: ``T × T`` blocks over periods, stacked to ``kT × T``.

A part is ``"period"`` (identity), ``"cumulative"`` (lower-triangular ones) or ``{"rolling": w}``
(the w periods ending at t; fewer at the start), as the issue's ``time_workload`` list spells them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

KINDS = ("period", "cumulative", "rolling")

TimePart = str | Mapping[str, int]


def positive_int(value: int, *, name: str) -> int:
    """``value`` as an int after checking it is an integer (not a bool) >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (got {value!r})")
    return int(value)


def period(horizon: int) -> np.ndarray:
    """Each period's own count: the identity, ``T × T``."""
    return np.eye(positive_int(horizon, name="horizon"))


def cumulative(horizon: int) -> np.ndarray:
    """Counts to date: lower-triangular ones, ``T × T``."""
    return np.tril(np.ones((positive_int(horizon, name="horizon"),) * 2))


def rolling(horizon: int, window: int) -> np.ndarray:
    """Rolling totals of ``window`` periods ending at t: a band of ones, ``T × T``."""
    size = positive_int(horizon, name="horizon")
    if positive_int(window, name="rolling window") > size:
        raise ValueError(f"rolling window must satisfy window <= horizon {size} (got {window})")
    return np.tril(np.triu(np.ones((size, size)), -(int(window) - 1)))


def _part(part: TimePart, horizon: int) -> np.ndarray:
    if isinstance(part, str):
        if part == "rolling":
            raise ValueError("time_workload part 'rolling' needs a window: {rolling: w}")
        if part not in KINDS:
            raise ValueError(f"time_workload part {part!r} is not one of {KINDS}")
        return period(horizon) if part == "period" else cumulative(horizon)
    if isinstance(part, Mapping) and list(part) == ["rolling"]:
        return rolling(horizon, part["rolling"])
    raise ValueError(f"time_workload part {part!r} must be one of {KINDS[:2]} or {{rolling: w}}")


def time_workload(parts: Sequence[TimePart], horizon: int) -> np.ndarray:
    """The parts stacked in order, ``kT × T`` (block b, row t: part b published at period t)."""
    if isinstance(parts, str | Mapping) or len(parts) == 0:
        raise ValueError(f"time_workload must be a non-empty list of parts (got {parts!r})")
    return np.vstack([_part(part, horizon) for part in parts])
