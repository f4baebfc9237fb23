"""Derived statistics — means, sums and quantiles of a binned numeric column — as post-processing.

A derived item adds *support* linear queries to the workload the strategy is optimised for; after
reconstruction the statistic is computed from their estimates and per-query variances only
(post-processing: no extra budget, no data).  Within each group (a cell of the ``by`` attributes):

Intervals are ``± z·std_error`` with ``z`` = 1.96 under Gaussian noise and :data:`Z95_LAPLACE`
(2.118, conservative) under Laplace noise.

* **sum and mean** use the *moments* support: three queries per group over the column's cells,
  ``C = Σ h_k`` (count), ``S = Σ u_k h_k`` and ``D = Σ (u_k − ½) h_k = S − C/2`` where
  ``u_k = (r_k − r_min)/(r_max − r_min) ∈ [0, 1]`` are the cells' representative values rescaled
  (so the support queries have the scale of counts and do not dominate the optimisation).
  The three variances fix the error's quadratic form in (S, C):
  ``Cov(S, C) = Var S + Var C/4 − Var D`` (exact), so
  ``q(t) = Var(S − t·C) = Var S − 2t·Cov(S, C) + t²·Var C`` for every t.

  - sum ``= r_min·C + spread·S`` is linear: ``Var = spread²·q(−r_min/spread)`` (exact).
  - mean ``= r_min + spread·S/C``: delta method, ``Var ≈ spread²·q(m_u)/C²`` at ``m_u = S/C``
    (first order; the estimated count stands in for the true one: approximate, and stated as
    unreliable — no interval — when the count is not distinguishable from zero).

* **quantiles** use the *cdf* support: prefix counts ``F_k`` of the column.  With ``N = F_last``,
  the estimate is in the first cell k with ``F_k ≥ qN``, interpolated linearly within it (for
  integer cells: the integer ``lo + ⌊f·(hi − lo + 1)⌋``, so 1-wide cells give the integer itself);
  the interval inverts the CDF's pointwise normal band: lower end the first cell with
  ``F_k − qN + z·s_k ≥ 0``, upper end the first with ``F_k − qN − z·s_k ≥ 0``, where
  ``s_k = sd(F_k) + q·sd(N)`` bounds ``sd(F_k − qN)`` by Cauchy–Schwarz (conservative: the
  covariance is not exposed).  The interval runs over whole cells, so it also covers the binning.
  ``std_error`` is its normal-equivalent half-width ``(ci_high − ci_low + step)/(2z)`` (step 1
  for integer cells, whose values are a grid; 0 for real-valued bins).

Binning: values in cell k lie in ``[value_low_k, value_high_k]`` and count as ``r_k`` (midpoint
unless declared), so a mean is off by at most ``e = max_k max(r_k − value_low_k, value_high_k −
r_k)`` and a sum by at most ``e·N`` (reported with the estimated count N).  A quantile's binning
error is the width ``value_high_k − value_low_k`` of its cell (0 for 1-wide integer cells)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dprelease.mechanisms.primitives.intervals import laplace_quantile
from dprelease.mechanisms.primitives.operators import Factor, Identity, MatrixFactor, Prefix, Total
from dprelease.mechanisms.primitives.workload import WorkloadItem

DerivedKind = Literal["mean", "sum", "quantiles"]
DERIVED_KINDS: tuple[DerivedKind, ...] = ("mean", "sum", "quantiles")
LABEL_ORDER = ("noise", "noise+bias", "noise-only")
"""Uncertainty labels of the support rows, weakest claim last (a derived row takes the weakest)."""
QUANTILE_LABEL = "interval"
"""Uncertainty label of quantile rows: the interval is computed directly (CDF inversion) and
``std_error`` is its normal-equivalent half-width (see the module docstring)."""
Z95 = 1.959963984540054
"""``normal_quantile(0.95)`` as the float ``ndtri`` returns (a unit test keeps them equal), written
out so that importing this module does not load ``scipy.special``."""
Z95_LAPLACE = laplace_quantile(0.95)
"""``z`` of derived intervals under Laplace noise: the exact 95% quantile of one Laplace draw in
standard deviations; a weighted sum of Laplace draws has lighter tails, so it is conservative
where the normal ``z`` undercovers."""


@dataclass(frozen=True, kw_only=True)
class BinnedColumn:
    """Public description of a numeric column's cells.

    ``value_low``/``value_high``: the range of raw values a cell holds; ``integer``: the values are
    the integers of that range (else any real in ``[low, high)``); ``representative``: the value
    each record of the cell counts as in sums and means.
    """

    value_low: np.ndarray
    value_high: np.ndarray
    representative: np.ndarray
    integer: bool

    def __post_init__(self) -> None:
        arrays = (self.value_low, self.value_high)
        n = self.representative.shape
        if self.representative.ndim != 1 or any(a.shape != n for a in arrays):
            raise ValueError(
                "a binned column needs one value_low, value_high and representative per cell "
                f"(got {[a.shape for a in arrays]}, {n})"
            )
        if not all(np.isfinite(a).all() for a in (*arrays, self.representative)):
            raise ValueError("cell bounds and representative values must be finite")
        if n[0] < 2:
            raise ValueError(f"a derived statistic needs a column of at least 2 cells (got {n[0]})")
        outside = np.flatnonzero(
            (self.representative < self.value_low) | (self.representative > self.value_high)
        )
        if outside.size:
            k = int(outside[0])
            raise ValueError(
                f"representative value {self.representative[k]:g} of cell {k} lies outside the "
                f"cell's values [{self.value_low[k]:g}, {self.value_high[k]:g}]"
            )
        if not np.ptp(self.representative) > 0:
            raise ValueError("the representative values must not all be equal")

    @classmethod
    def of_cells(
        cls,
        lower: np.ndarray,
        upper: np.ndarray,
        representative: np.ndarray | None = None,
        *,
        integer: bool,
    ) -> BinnedColumn:
        """Cells ``[lo, hi]`` of integers (``integer``) or ``[lo, hi)`` of reals; representative
        values default to the cells' midpoints."""
        lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
        rep = (lower + upper) / 2 if representative is None else np.asarray(representative, float)
        return cls(value_low=lower, value_high=upper, representative=rep, integer=integer)

    @property
    def size(self) -> int:
        return int(self.representative.size)

    @property
    def low(self) -> float:
        return float(self.representative.min())

    @property
    def spread(self) -> float:
        return float(np.ptp(self.representative))

    def moments_matrix(self) -> np.ndarray:
        """Rows ``[1, u, u − ½]``: count, rescaled sum, centred sum (3 × n), with
        ``u_k = (r_k − r_min)/spread`` in [0, 1]."""
        u = (self.representative - self.low) / self.spread
        return np.vstack([np.ones_like(u), u, u - 0.5])

    def max_record_error(self) -> float:
        """Largest distance between a raw value and its cell's representative value."""
        rep = self.representative
        return float(np.max(np.maximum(rep - self.value_low, self.value_high - rep)))


def support_item(
    *,
    name: str,
    kind: DerivedKind,
    domain_shape: tuple[int, ...],
    column_axis: int,
    by_axes: tuple[int, ...],
    column: BinnedColumn,
) -> WorkloadItem:
    """The support queries of a derived item: per group (Identity on ``by_axes``), the moments
    (3 queries, sum and mean) or the prefix counts (n queries, quantiles) of the column."""
    if domain_shape[column_axis] != column.size:
        raise ValueError(
            f"the column has {column.size} cells but axis {column_axis} has {domain_shape[column_axis]}"
        )
    if column_axis in by_axes:
        raise ValueError(f"axis {column_axis} cannot be both the column and a group attribute")
    factors: list[Factor] = []
    for axis, n in enumerate(domain_shape):
        if axis == column_axis:
            factors.append(
                Prefix(n) if kind == "quantiles" else MatrixFactor(column.moments_matrix())
            )
        elif axis in by_axes:
            factors.append(Identity(n))
        else:
            factors.append(Total(n))
    return WorkloadItem(name=name, factors=tuple(factors))


def per_group(item: WorkloadItem, values: np.ndarray, *, column_axis: int) -> np.ndarray:
    """The item's rows as ``(groups, column queries)``: groups row-major over the group axes."""
    shape = tuple(f.m for f in item.factors)
    moved = np.moveaxis(np.asarray(values).reshape(shape), column_axis, -1)
    return moved.reshape(-1, shape[column_axis])


def weakest_label(labels: np.ndarray) -> np.ndarray:
    """Per group (row of ``labels``) the weakest claim among its support rows."""
    rank = np.vectorize(LABEL_ORDER.index, otypes=[np.int64])(labels.astype(str))
    return np.asarray(LABEL_ORDER, dtype=object)[rank.max(axis=1)]


@dataclass(frozen=True, kw_only=True)
class DerivedRows:
    """One derived statistic per group: estimate, standard error, 95% interval, what it covers."""

    estimate: np.ndarray
    std_error: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    claimed: np.ndarray
    """False where no interval is claimed (``ci_low``/``ci_high`` are then meaningless)."""
    uncertainty: np.ndarray
    binning_error: np.ndarray


def _quadratic(variances: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``Var(S − t·C)`` per group from the moments rows' variances ``(groups, 3)``.

    ``Cov(S, C) = Var S + Var C/4 − Var D`` (exact for the estimates' covariance or MSE matrix),
    clipped to the Cauchy–Schwarz range ``±√(Var S·Var C)`` against round-off. O(groups).
    """
    v_count, v_sum, v_centred = variances.T
    bound = np.sqrt(v_sum * v_count)
    cov = np.clip(v_sum + v_count / 4 - v_centred, -bound, bound)
    return np.maximum(v_sum - 2 * t * cov + t * t * v_count, 0.0)


def moments(
    estimates: np.ndarray,
    variances: np.ndarray,
    labels: np.ndarray,
    *,
    column: BinnedColumn,
    mean: bool,
    z: float = Z95,
) -> DerivedRows:
    """Per-group sums (``mean`` False) or means from moments rows ``(groups, 3)`` (module docstring).

    A mean and its interval are clipped to ``[r_min, r_max]`` (post-processing: every mean lies
    there); where the estimated count is not above ``z·sd(count)`` the row is ``noise-only`` (no
    interval) and its ``std_error`` uses that threshold in place of the count.
    """
    count, unit_sum, _ = estimates.T
    spread, low = column.spread, column.low
    if not mean:
        estimate = low * count + spread * unit_sum
        std_error = spread * np.sqrt(_quadratic(variances, np.full(count.shape, -low / spread)))
        uncertainty = weakest_label(labels)
        binning_error = column.max_record_error() * np.maximum(count, 0.0)
        bounds = (-np.inf, np.inf)
    else:
        threshold = z * np.sqrt(variances[:, 0])
        denominator = np.maximum(count, threshold)
        denominator = np.where(denominator > 0, denominator, 1.0)
        unit_mean = np.clip(np.where(count > 0, unit_sum / denominator, 0.5), 0.0, 1.0)
        estimate = low + spread * unit_mean
        std_error = spread * np.sqrt(_quadratic(variances, unit_mean)) / denominator
        uncertainty = np.where(count > threshold, weakest_label(labels), "noise-only").astype(
            object
        )
        binning_error = np.full(count.shape, column.max_record_error())
        bounds = (low, low + spread)
    return DerivedRows(
        estimate=estimate,
        std_error=std_error,
        ci_low=np.clip(estimate - z * std_error, *bounds),
        ci_high=np.clip(estimate + z * std_error, *bounds),
        claimed=np.asarray(uncertainty != "noise-only"),
        uncertainty=uncertainty,
        binning_error=binning_error,
    )


def quantiles(
    estimates: np.ndarray,
    variances: np.ndarray,
    labels: np.ndarray,
    *,
    column: BinnedColumn,
    levels: tuple[float, ...],
    z: float = Z95,
) -> DerivedRows:
    """Quantiles per group from prefix rows ``(groups, n)``; rows ordered group-major, then level.

    O(groups · levels · n).  Groups whose count is not above ``1.96·sd(count)`` get the whole
    column range as their interval; groups whose support rows claim no interval (``noise-only``)
    claim none either.
    """
    groups = estimates.shape[0]
    total = estimates[:, -1]
    sd_total = np.sqrt(variances[:, -1])
    sd = np.sqrt(variances)
    out = {key: np.empty((groups, len(levels))) for key in ("estimate", "low", "high", "width")}
    for j, q in enumerate(levels):
        gap = estimates - q * total[:, None]  # F_k − qN
        band = z * (sd + q * sd_total[:, None])
        band[:, -1] = z * (1 - q) * sd_total  # F_last − qN = (1 − q)N: exact
        k_hat = _first(gap >= 0)
        k_low = _first(gap + band >= 0)
        k_high = _first(gap - band >= 0)
        rows = np.arange(groups)
        before = np.where(k_hat > 0, estimates[rows, np.maximum(k_hat - 1, 0)], 0.0)
        step = estimates[rows, k_hat] - before
        fraction = np.where(
            step > 0, np.clip((q * total - before) / np.where(step > 0, step, 1.0), 0, 1), 0.5
        )
        lo, hi = column.value_low[k_hat], column.value_high[k_hat]
        if column.integer:  # the integer lo + ⌊f·(number of integers)⌋, at most hi
            out["estimate"][:, j] = lo + np.minimum(np.floor(fraction * (hi - lo + 1)), hi - lo)
        else:
            out["estimate"][:, j] = lo + fraction * (hi - lo)
        out["width"][:, j] = hi - lo
        located = total > z * sd_total
        out["low"][:, j] = np.where(located, column.value_low[k_low], column.value_low[0])
        out["high"][:, j] = np.where(located, column.value_high[k_high], column.value_high[-1])
    ci_low, ci_high = out["low"].ravel(), out["high"].ravel()
    step = 1.0 if column.integer else 0.0
    unclaimed = np.repeat(weakest_label(labels) == "noise-only", len(levels))
    return DerivedRows(
        estimate=out["estimate"].ravel(),
        std_error=(ci_high - ci_low + step) / (2 * z),
        ci_low=ci_low,
        ci_high=ci_high,
        claimed=~unclaimed,
        uncertainty=np.where(unclaimed, "noise-only", QUANTILE_LABEL).astype(object),
        binning_error=out["width"].ravel(),
    )


def _first(mask: np.ndarray) -> np.ndarray:
    """Per row, the first True column (the last column where none is True)."""
    return np.where(mask.any(axis=1), mask.argmax(axis=1), mask.shape[1] - 1)


def quantile_label(q: float) -> str:
    """``q0.5``, ``q0.9``: the statistic column's name for a level."""
    return f"q{q:g}"
