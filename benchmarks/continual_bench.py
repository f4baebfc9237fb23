"""Continual release (issue 29): causal factorisations of time workloads, planned error at ρ-zCDP.

One count per period, event level, Gaussian noise, ρ = 0.5 (σ² = Δ₂(A)²/(2ρ)).  Pure planning: no
data, no noise drawn; every figure is the factorisation's exact predicted rmse.

1. Cumulative counts, T = 12, 60, 120: worst rmse over the horizon of each strategy, beside the
   reference table (``/work/shared/reference/continual.md``; its binary tree uses full least
   squares, ours the causal least squares over the nodes complete at each period).  The SVD
   bound bounds the *mean* rmse of every factorisation.
2. Per-period + cumulative + rolling-12 stacked: worst and mean rmse, and the ratio optimised /
   best of {sum of periods, square root} (the issue's target: ≤ 0.9).  ``optimised`` minimises
   the worst variance for the worst column and the total variance for the mean column.

Seconds are per optimisation (one BLAS thread).  Usage (from the repository root)::

    .venv/bin/python benchmarks/continual_bench.py
    .venv/bin/python benchmarks/continual_bench.py --horizons 12 24 --rho 1.0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dprelease.mechanisms.continual import cumulative, optimised, square_root, time_workload
from tests.reference.continual import (
    binary_tree,
    mean_rmse,
    sum_of_periods,
    svd_bound_rmse,
    worst_rmse,
)

REFERENCE = {
    12: (3.46, 2.21, 1.85, 1.55),
    60: (7.75, 3.03, 2.37, 2.02),
    120: (10.95, 3.37, 2.59, 2.23),
}
STACKED = ["period", "cumulative", {"rolling": 12}]


def _timed(workload, objective: str):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    found = optimised(workload, objective=objective)
    return found, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizons", type=int, nargs="+", default=[12, 60, 120])
    parser.add_argument("--rho", type=float, default=0.5)
    args = parser.parse_args()
    rho = args.rho

    print(
        f"1. cumulative counts, worst rmse at rho = {rho} (reference figures in brackets, rho = 0.5)"
    )
    print(
        f"{'T':>4} {'sum':>14} {'tree causal':>14} {'sqrt':>14} {'optimised':>10} {'seconds':>8} {'SVD (mean)':>14}"
    )
    for horizon in args.horizons:
        workload = cumulative(horizon)
        ref = [f"({v:.2f})" for v in REFERENCE.get(horizon, (float("nan"),) * 4)]
        summed, tree, root = (
            worst_rmse(s(workload), rho) for s in (sum_of_periods, binary_tree, square_root)
        )
        best, seconds = _timed(workload, "worst")
        bound = svd_bound_rmse(workload, rho)
        print(
            f"{horizon:>4} {summed:>6.2f} {ref[0]:>7} {tree:>6.2f} {ref[1]:>7} {root:>6.2f} {ref[2]:>7}"
            f" {worst_rmse(best, rho):>10.2f} {seconds:>8.2f} {bound:>6.2f} {ref[3]:>7}"
        )

    print(
        f"\n2. per-period + cumulative + rolling-12 (kT x T, k = 3), rho = {rho}: worst | mean rmse"
    )
    print(
        f"{'T':>4} {'sum':>13} {'tree causal':>13} {'sqrt':>13} {'optimised':>13} {'ratio':>13} {'seconds':>11} {'SVD mean':>8}"
    )
    for horizon in args.horizons:
        workload = time_workload(STACKED, horizon)
        rows = [s(workload) for s in (sum_of_periods, binary_tree, square_root)]
        (worst, worst_s), (total, total_s) = _timed(workload, "worst"), _timed(workload, "total")
        figures = [(worst_rmse(f, rho), mean_rmse(f, rho)) for f in rows]
        opt = (worst_rmse(worst, rho), mean_rmse(total, rho))
        ratio = [opt[i] / min(figures[0][i], figures[2][i]) for i in (0, 1)]
        cells = " ".join(f"{w:>6.2f} {m:>6.2f}" for w, m in [*figures, opt, ratio])
        print(
            f"{horizon:>4} {cells} {worst_s:>5.2f} {total_s:>5.2f} {svd_bound_rmse(workload, rho):>8.2f}"
        )


if __name__ == "__main__":
    main()
