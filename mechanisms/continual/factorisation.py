"""A causal factorisation ``W = B·A`` of a time workload, and the error it implies.

``A`` (m × T) holds the measurements: row i is measured at period ``times[i]`` and uses periods
``≤ times[i]`` (a square ``A`` with ``times = 0..T-1`` is lower-triangular).  ``B`` (kT × T·… ,
``kT × m``) holds one block of T rows per workload part; row t of a block publishes at period t
from the measurements taken by then.  Noise ``z ~ N(0, σ² I)`` (or Laplace) is added to ``A·x``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dprelease.mechanisms.continual.workloads import positive_int

NOISES = ("gaussian", "laplace")
UNITS = ("event", "person")


def _matrix(value: np.ndarray, name: str) -> np.ndarray:
    array = np.array(value, dtype=np.float64)
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"{name} (shape {array.shape}) must be a non-empty 2-D matrix")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite (it has a NaN or infinite entry)")
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class CausalFactorisation:
    """``W = B·A`` with causal ``A`` and ``B``; construction refuses a non-causal pair."""

    A: np.ndarray
    B: np.ndarray
    name: str
    times: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        a = _matrix(self.A, "A")
        b = _matrix(self.B, "B")
        rows, horizon = a.shape
        if self.times is None:
            if rows != horizon:
                raise ValueError(f"A (shape {a.shape}) must be square when times is not given")
            times = np.arange(horizon)
        else:
            times = np.asarray(self.times)
            if times.shape != (rows,) or not np.issubdtype(times.dtype, np.integer):
                raise ValueError(
                    f"times (shape {times.shape}) must be {rows} integers, one per row of A"
                )
            if times.min() < 0 or times.max() >= horizon:
                raise ValueError(
                    f"times must lie in 0..{horizon - 1} (got {times.min()}..{times.max()})"
                )
        if b.shape[1] != rows or b.shape[0] % horizon:
            raise ValueError(f"B (shape {b.shape}) must be kT × m = (k·{horizon}) × {rows}")
        # O(m·T + kT·m): exact zeros required, a future period with weight 1e-17 still leaks
        late = np.nonzero(a * (np.arange(horizon)[None, :] > times[:, None]))
        if late[0].size:
            i, j = int(late[0][0]), int(late[1][0])
            raise ValueError(
                f"A is not causal: row {i} (measured at period {times[i]}) uses period {j}; "
                "a measurement may use only periods up to its own"
            )
        published_at = np.arange(b.shape[0]) % horizon
        early = np.nonzero(b * (times[None, :] > published_at[:, None]))
        if early[0].size:
            r, i = int(early[0][0]), int(early[1][0])
            raise ValueError(
                f"B is not causal: row {r} (published at period {published_at[r]}) uses "
                f"measurement {i} taken at period {times[i]}; a figure may use only earlier ones"
            )
        times = times.astype(np.int64)
        times.setflags(write=False)
        object.__setattr__(self, "A", a)
        object.__setattr__(self, "B", b)
        object.__setattr__(self, "times", times)

    @property
    def horizon(self) -> int:
        return self.A.shape[1]

    def sensitivity(
        self, *, noise: str = "gaussian", unit: str = "event", max_rows: int = 1
    ) -> float:
        """Δ of ``A``: L2 (gaussian) or L1 (laplace).  O(m·T).

        ``event``: at most ``max_rows`` rows in one period, ``max_rows`` × the largest column norm.  ``person``: at most
        ``max_rows`` rows in every period, ``max_rows · ‖|A|·1‖``; exact for non-negative ``A``
        (the worst contribution is ``max_rows`` in every period), an upper bound otherwise
        (``|A·v| ≤ |A|·v`` entrywise for ``0 ≤ v ≤ max_rows``).
        """
        if noise not in NOISES:
            raise ValueError(f"noise {noise!r} is not one of {NOISES}")
        if unit not in UNITS:
            raise ValueError(f"unit {unit!r} is not one of {UNITS}")
        positive_int(max_rows, name="max_rows")
        order = 2 if noise == "gaussian" else 1
        if unit == "event":
            return float(np.linalg.norm(self.A, ord=order, axis=0).max()) * max_rows
        return max_rows * float(np.linalg.norm(np.abs(self.A).sum(axis=1), ord=order))

    def row_variances(self, sigma2: float) -> np.ndarray:
        """``σ²·‖B_r‖²`` per published row (kT values, block-major).  O(kT·m)."""
        if not (math.isfinite(sigma2) and sigma2 >= 0):
            raise ValueError(f"sigma2 must be finite and >= 0 (got {sigma2!r})")
        return sigma2 * np.einsum("ij,ij->i", self.B, self.B)
