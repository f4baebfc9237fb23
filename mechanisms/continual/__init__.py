"""Continual release: causal factorisations ``W = B·A`` of time workloads (pure numpy/scipy).

Periods t = 1..T each bring one count; a time workload ``W`` (``kT × T``: stacked per-period,
cumulative and rolling-window blocks) says what is published at each period.  A strategy is
*causal*: the measurements taken at period t use periods ≤ t, and every figure published at t uses
measurements taken by t.  References: Fichtenberger, Henzinger, Upadhyay, ICML 2023 (the square
root); Denisov et al., NeurIPS 2022 (optimised causal factorisations); figures: benchmarks/.

* :mod:`.workloads`: the time workload matrices and their validation;
* :mod:`.factorisation`: :class:`CausalFactorisation` (sensitivity, variances, rmse, checks);
* :mod:`.strategies`: sum of periods, square root, causal binary tree, optimised, SVD bound.
"""

from __future__ import annotations

from dprelease.mechanisms.continual.factorisation import CausalFactorisation
from dprelease.mechanisms.continual.strategies import (
    binary_tree,
    optimised,
    square_root,
    square_root_coefficients,
    square_root_matrix,
    sum_of_periods,
    svd_bound_rmse,
)
from dprelease.mechanisms.continual.workloads import (
    cumulative,
    period,
    rolling,
    time_workload,
)

__all__ = [
    "CausalFactorisation",
    "binary_tree",
    "cumulative",
    "optimised",
    "period",
    "rolling",
    "square_root",
    "square_root_coefficients",
    "square_root_matrix",
    "sum_of_periods",
    "svd_bound_rmse",
    "time_workload",
]
