"""Continual release: causal factorisations ``W = B·A`` of time workloads (pure numpy/scipy).

Periods t = 1..T each bring one count; a time workload ``W`` (``kT × T``: stacked per-period,
cumulative and rolling-window blocks) says what is published at each period.  A strategy is
*causal*: the measurements taken at period t use periods ≤ t, and every figure published at t uses
measurements taken by t.  References: Fichtenberger, Henzinger, Upadhyay, ICML 2023 (the square
root); Denisov et al., NeurIPS 2022 (optimised causal factorisations); figures: benchmarks/.

* :mod:`.workloads`: the time workload matrices and their validation;
* :mod:`.factorisation`: :class:`CausalFactorisation` (causality checks, sensitivity, variances);
* :mod:`.strategies`: square root, optimised.
"""

from __future__ import annotations

import importlib
from typing import Any

# Lazy exports: a spec that declares a series needs only :mod:`.workloads` to validate; the
# strategies (scipy.optimize, ~0.1 s to import) load when a plan is made.
_EXPORTS = {
    "CausalFactorisation": "factorisation",
    "optimised": "strategies",
    "square_root": "strategies",
    "square_root_coefficients": "strategies",
    "square_root_matrix": "strategies",
    "cumulative": "workloads",
    "period": "workloads",
    "rolling": "workloads",
    "time_workload": "workloads",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
