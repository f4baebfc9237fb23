"""Release tables: one Arrow table per workload item, one row per query, built from public values only.

Columns: the labels of each non-summed attribute — ``<attr>`` (a marginal's bin label),
``<attr>_upper`` (a CDF's upper bound), ``<attr>_low`` / ``<attr>_high`` (range bounds) — then
``estimate``, ``std_error`` (from the mechanism's error model), ``ci_low`` and ``ci_high`` (95%
two-sided interval) and ``uncertainty``, which says what ``std_error`` and the interval cover:

- ``"noise"``: the estimate is unbiased; ``std_error`` is the noise's standard deviation.
- ``"noise+bias"``: ``std_error = √(noise variance + estimated squared bias)`` (a data-dependent
  mechanism such as DAWA, whose reconstruction is biased; the mechanism documents its estimator).
- ``"noise-only"``: the estimate may be biased and the bias could not be estimated: ``std_error``
  covers the noise only and ``ci_low`` / ``ci_high`` are null (no interval is claimed).

Intervals take the normal quantile (``± 1.96·std_error``), except for rows whose error is exactly one
Laplace draw, which take the exact Laplace quantile (``± b·ln 20 ≈ ± 2.12·std_error``; see
:mod:`mechanisms.primitives.intervals`).  Rows follow the Kronecker (row-major) order of the item.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from dprelease.catalog.spec.model import ReleaseSpec, derived_column, derived_support
from dprelease.catalog.spec.sections import WorkloadItemSpec
from dprelease.mechanisms import derived
from dprelease.mechanisms.derived import QUANTILE_LABEL
from dprelease.mechanisms.primitives.intervals import distinct_strings, interval_half_widths
from dprelease.mechanisms.primitives.operators import AllRanges, Identity, Prefix, Ranges, Total
from dprelease.mechanisms.primitives.protocol import ItemAnswers
from dprelease.mechanisms.primitives.workload import WorkloadItem

UNCERTAINTY_LABELS = ("noise", "noise+bias", "noise-only", QUANTILE_LABEL)
"""What ``std_error`` covers (the ``uncertainty`` column); ``interval`` only in derived tables."""


def label_columns(spec: ReleaseSpec, item: WorkloadItem) -> dict[str, np.ndarray]:
    """Label columns of ``item`` in row-major query order (public metadata only)."""
    per_axis: list[tuple[list[str], list[np.ndarray]]] = []
    for (name, attribute), factor in zip(spec.domain.items(), item.factors, strict=True):
        if isinstance(factor, Total):
            continue
        if isinstance(factor, Identity):
            per_axis.append(([name], [_array(attribute.labels())]))
        elif isinstance(factor, Prefix):
            per_axis.append(([f"{name}_upper"], [_array(attribute.bound_labels()[1])]))
        elif isinstance(factor, Ranges | AllRanges):
            lower, upper = attribute.bound_labels()
            bounds = [_array(lower)[factor.lo], _array(upper)[factor.hi]]
            per_axis.append(([f"{name}_low", f"{name}_high"], bounds))
        else:  # an explicit query matrix: rows are numbered
            per_axis.append(([f"{name}_query"], [np.arange(factor.m, dtype=np.int64)]))
    return _grid(per_axis)


def _grid(per_axis: list[tuple[list[str], list[np.ndarray]]]) -> dict[str, np.ndarray]:
    """The named columns of each axis over the grid of all axes, row-major (first axis slowest)."""
    sizes = [len(columns[0]) for _, columns in per_axis]
    indices = (
        np.unravel_index(np.arange(int(np.prod(sizes, dtype=np.int64))), sizes) if sizes else ()
    )
    result: dict[str, np.ndarray] = {}
    for (names, columns), index in zip(per_axis, indices, strict=True):
        for name, column in zip(names, columns, strict=True):
            result[name] = column[index]
    return result


def build_table(
    spec: ReleaseSpec,
    item: WorkloadItem,
    *,
    estimates: np.ndarray,
    unit_variances: np.ndarray,
    noise_variance: float,
    nonnegative: bool,
    interval: str | np.ndarray = "normal",
    uncertainty: str | np.ndarray = "noise",
) -> pa.Table:
    """Assemble one item's table from released estimates and the public error model.

    ``noise_variance × unit_variances`` is each row's squared ``std_error``.  ``interval`` and
    ``uncertainty`` are one value or one per row (see the module text; ``"none"``: null
    ``ci_low``/``ci_high``).
    """
    estimate = np.asarray(estimates, dtype=np.float64)
    rows = estimate.shape
    variance = noise_variance * np.asarray(unit_variances, dtype=np.float64)
    if variance.shape != rows:
        raise ValueError(
            f"unit_variances (shape {variance.shape}) must have one entry per row {rows}"
        )
    labels = np.asarray(uncertainty, dtype=object)
    if labels.ndim and labels.shape != rows:
        raise ValueError(f"uncertainty (shape {labels.shape}) must be one label or one per row")
    unknown = sorted(distinct_strings(labels) - set(UNCERTAINTY_LABELS))
    if unknown:
        raise ValueError(f"uncertainty labels {unknown} must be one of {UNCERTAINTY_LABELS}")
    std_error = np.sqrt(variance)
    half_width = interval_half_widths(std_error, interval=interval)
    claimed = np.isfinite(half_width)
    ci_low = estimate - half_width
    ci_high = estimate + half_width
    if nonnegative:
        # post-processing: clip at the last step (Li thesis §3.5.1); counts are never negative
        estimate, ci_low, ci_high = (np.maximum(v, 0.0) for v in (estimate, ci_low, ci_high))
    columns: dict[str, Any] = dict(label_columns(spec, item))
    columns.update(
        estimate=estimate,
        std_error=std_error,
        ci_low=pa.array(np.where(claimed, ci_low, 0.0), mask=~claimed),
        ci_high=pa.array(np.where(claimed, ci_high, 0.0), mask=~claimed),
        # every label is a str (checked above): tolist, not astype(str), which cost ~4 ms per table
        uncertainty=pa.array(np.broadcast_to(labels, rows).ravel().tolist(), pa.string()),
    )
    return pa.table(columns)


DERIVED_VALUE_COLUMNS = (
    "statistic",
    "estimate",
    "std_error",
    "ci_low",
    "ci_high",
    "uncertainty",
    "binning_error",
)
"""Columns of a derived table after the group labels (one column per ``by`` attribute)."""


def derived_tables(spec: ReleaseSpec, answers: dict[str, ItemAnswers]) -> dict[str, pa.Table]:
    """The table of every derived item (mean, sum, quantiles), computed from the reconstructed
    answers of its support queries only (post-processing; see :mod:`mechanisms.derived`).

    Rows: groups (cells of ``by``, row-major in domain order), then statistics; columns: the
    group labels, :data:`DERIVED_VALUE_COLUMNS`.  O(support rows) per item.
    """
    return {
        item.name: derived_table(spec, item, answers)
        for item in spec.workload
        if item.derived_column is not None
    }


def derived_descriptions(spec: ReleaseSpec) -> dict[str, dict[str, Any]]:
    """Public description of every derived table for the manifest: what it estimates, from which
    support table, how its uncertainty is computed and what is approximate."""
    described: dict[str, dict[str, Any]] = {}
    for item in spec.workload:
        if item.derived_column is None:
            continue
        column = derived_column(spec, item)
        method = {
            "mean": "ratio of linear queries; std_error by the delta method with the "
            "numerator-denominator covariance (first order: approximate); interval as for sums, "
            "clipped to the column's range; none where the count is not above z standard errors",
            "sum": "linear query over the binned column; std_error exact (the noise's variance); "
            "interval ± 1.96·std_error (Gaussian noise) or ± 2.118·std_error (Laplace noise: "
            "the quantile of one Laplace draw, conservative for combinations)",
            "quantiles": "inversion of the released CDF; interval from its pointwise 95% normal "
            "band, sd(F_k − qN) bounded by sd(F_k) + q·sd(N) (conservative); std_error is the "
            "interval's normal-equivalent half-width",
        }[item.kind]
        described[item.name] = {
            "statistic": item.kind,
            "column": item.derived_column,
            "by": [a for a in spec.domain if a in (item.by or [])],
            "levels": list(item.quantiles.q) if item.quantiles is not None else None,
            "support_table": derived_support(spec, item).name,
            "representative_values": "declared" if item.representative else "cell midpoints",
            "binning_error_per_record": column.max_record_error(),
            "method": method,
        }
    return described


def derived_table(
    spec: ReleaseSpec, item: WorkloadItemSpec, answers: dict[str, ItemAnswers]
) -> pa.Table:
    """One derived item's table (see :func:`derived_tables`)."""
    support = derived_support(spec, item)
    found = answers[support.name]
    axis = list(spec.domain).index(str(item.derived_column))
    column = derived_column(spec, item)

    def grouped(values: Any) -> np.ndarray:
        array = np.broadcast_to(np.asarray(values, dtype=object), (support.num_queries,))
        return derived.per_group(support, array, column_axis=axis)

    # Laplace noise under pure ε: the conservative Laplace z (mechanisms.derived.Z95_LAPLACE)
    laplace = spec.privacy_target().measure == "pure"
    z = derived.Z95_LAPLACE if laplace else derived.Z95
    estimates = grouped(found.estimates).astype(np.float64)
    variances = grouped(found.variances).astype(np.float64)
    labels = grouped(found.uncertainty)
    if item.quantiles is not None:
        levels = tuple(item.quantiles.q)
        rows = derived.quantiles(estimates, variances, labels, column=column, levels=levels, z=z)
        statistics = [derived.quantile_label(q) for q in levels]
    else:
        rows = derived.moments(
            estimates, variances, labels, column=column, mean=item.mean is not None, z=z
        )
        statistics = [item.kind]
    repeat = len(statistics)
    by = [([a], [_array(spec.domain[a].labels())]) for a in spec.domain if a in (item.by or [])]
    columns: dict[str, Any] = {name: np.repeat(group, repeat) for name, group in _grid(by).items()}
    claimed = rows.claimed
    columns.update(
        statistic=pa.array(statistics * (rows.estimate.size // repeat), pa.string()),
        estimate=rows.estimate,
        std_error=rows.std_error,
        ci_low=pa.array(np.where(claimed, rows.ci_low, 0.0), mask=~claimed),
        ci_high=pa.array(np.where(claimed, rows.ci_high, 0.0), mask=~claimed),
        uncertainty=pa.array(rows.uncertainty.astype(str), pa.string()),
        binning_error=rows.binning_error,
    )
    return pa.table(columns)


def _array(values: list[Any]) -> np.ndarray:
    if values and all(isinstance(v, int | np.integer) for v in values):
        return np.asarray(values, dtype=np.int64)
    if values and all(isinstance(v, float | int) for v in values):
        return np.asarray(values, dtype=np.float64)
    return np.asarray([str(v) for v in values], dtype=object)
