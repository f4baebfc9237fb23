"""Release tables: one Arrow table per workload item, one row per query, built from public values only.

Columns: the labels of each non-summed attribute — ``<attr>`` (a marginal's bin label),
``<attr>_upper`` (a CDF's upper bound), ``<attr>_low`` / ``<attr>_high`` (range bounds) — then
``estimate``, ``std_error`` (from the mechanism's error model), ``ci_low`` and ``ci_high``
(approximate 95% normal intervals).  Rows follow the Kronecker (row-major) order of the item.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from catalog.spec import ReleaseSpec
from mechanisms.operators import AllRanges, Identity, Prefix, Ranges, Total
from mechanisms.workload import WorkloadItem

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


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
            per_axis.append(
                (
                    [f"{name}_low", f"{name}_high"],
                    [_array(lower)[factor.lo], _array(upper)[factor.hi]],
                )
            )
        else:  # an explicit query matrix: rows are numbered
            per_axis.append(([f"{name}_query"], [np.arange(factor.m, dtype=np.int64)]))
    sizes = [len(columns[0]) for _, columns in per_axis]
    total = int(np.prod(sizes, dtype=np.int64)) if sizes else 1
    indices = np.unravel_index(np.arange(total), sizes) if sizes else ()
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
) -> pa.Table:
    """Assemble one item's table from released estimates and the public error model."""
    std_error = np.sqrt(noise_variance * np.asarray(unit_variances, dtype=np.float64))
    estimate = np.asarray(estimates, dtype=np.float64)
    ci_low = estimate - Z_95 * std_error
    ci_high = estimate + Z_95 * std_error
    if nonnegative:
        # post-processing: clip at the last step (Li thesis §3.5.1); counts are never negative
        estimate, ci_low, ci_high = (np.maximum(v, 0.0) for v in (estimate, ci_low, ci_high))
    columns: dict[str, Any] = dict(label_columns(spec, item))
    columns.update(estimate=estimate, std_error=std_error, ci_low=ci_low, ci_high=ci_high)
    return pa.table(columns)


def _array(values: list[Any]) -> np.ndarray:
    if values and all(isinstance(v, int | np.integer) for v in values):
        return np.asarray(values, dtype=np.int64)
    if values and all(isinstance(v, float | int) for v in values):
        return np.asarray(values, dtype=np.float64)
    return np.asarray([str(v) for v in values], dtype=object)
