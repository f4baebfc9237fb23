"""Benchmark: predicted against measured seconds of every strategy optimiser, and bounded LRM.

The planner chooses candidates from ``predict_seconds`` functions that read sizes only
(``mechanisms.lrm.decomposition``, ``mechanisms.optimized.search``, ``mechanisms.primitives.union``,
``mechanisms.local.optimizer`` and ``mechanisms.primitives.compute_limits.predict_eigen_design_seconds``).
This script runs each optimiser on two sizes and prints predicted seconds, measured wall and
process (CPU) seconds, and the ratio measured / predicted (target: within a factor of 3).  The
first row measures this machine's one-thread DGEMM speed in the same run against the constant the
predictors assume (``compute_limits.DGEMM_FLOPS_PER_SECOND``): a ratio well above 1 means the
machine is loaded and every wall-clock ratio below is inflated by about as much.

It then runs the Low-Rank Mechanism at the largest size ``auto`` allows (m = n = 1024 by
default) with time limits, and prints the wall time, ``stopped_early`` and the error achieved
(ε² × expected total squared error, and its ratio to noise on data).

Usage (from the repository root; one BLAS thread, as the pipeline runs)::

    .venv/bin/python benchmarks/predict_bench.py                   # about 3 minutes
    .venv/bin/python benchmarks/predict_bench.py --skip-lrm-limit  # predictions only
    .venv/bin/python benchmarks/predict_bench.py --skip-predictions --limits 10,30,60
    .venv/bin/python benchmarks/predict_bench.py --calibrate lrm   # raw data behind a fit
      (also: templates, union, ldp, eigen, machine)
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import threadpoolctl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dprelease.mechanisms.eigen.design import eigen_design
from dprelease.mechanisms.local import optimizer
from dprelease.mechanisms.lrm import decomposition as lrm
from dprelease.mechanisms.optimized import search as optimized
from dprelease.mechanisms.primitives import compute_limits, union
from dprelease.mechanisms.primitives.operators import AllRanges, Identity, Prefix, Total
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference import ldp as ldp_reference
from tests.reference import lrm as lrm_reference
from tests.reference import optimized_search
from tests.reference.eigen import all_range_gram, prefix_gram


def measured(function: Callable[[], object]) -> tuple[object, float, float]:
    """(result, wall seconds, process seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def prefix_matrix(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n)))


def union_workload(dense: int, categorical: int) -> Workload:
    """CDF, all ranges and marginals over one ordered attribute and ``categorical`` others."""
    shape = (dense, *range(2, 2 + categorical))
    rest = shape[1:]
    return Workload(
        domain_shape=shape,
        items=(
            WorkloadItem(name="cdf", factors=(Prefix(dense), *(Total(n) for n in rest))),
            WorkloadItem(
                name="pair",
                factors=(
                    Total(dense),
                    *(Identity(n) if i < 2 else Total(n) for i, n in enumerate(rest)),
                ),
            ),
            WorkloadItem(
                name="ranges",
                factors=(
                    AllRanges(dense),
                    *(Identity(n) if i == 0 else Total(n) for i, n in enumerate(rest)),
                ),
            ),
            WorkloadItem(
                name="cells",
                factors=(
                    Identity(dense),
                    *(
                        Identity(n) if i == categorical - 1 else Total(n)
                        for i, n in enumerate(rest)
                    ),
                ),
            ),
        ),
    )


def machine_speed() -> float:
    """One-thread DGEMM flops per second, best of three 1024³ products."""
    a = np.random.default_rng(0).standard_normal((1024, 1024))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2.0 * 1024**3 / best


# --- the prediction table ---------------------------------------------------------------------


def cases() -> list[tuple[str, str, float, Callable[[], object]]]:
    rows: list[tuple[str, str, float, Callable[[], object]]] = []
    for n in (128, 256):
        W = lrm_reference.wrange_workload(n, n, rng=np.random.default_rng(0))
        rows.append(
            (
                "lrm.decompose",
                f"WRange {n}x{n}",
                lrm.predict_seconds(n, n),
                lambda W=W: lrm.decompose(W, rng=np.random.default_rng(0)),
            )
        )
    for n, noise in ((256, "laplace"), (512, "laplace"), (512, "gaussian"), (1024, "gaussian")):
        terms = [(all_range_gram(n),)]
        rows.append(
            (
                "optimized.optimize_workload",
                f"all ranges n={n} {noise}",
                optimized.predict_seconds((n,), noise=noise),
                lambda t=terms, z=noise: optimized.optimize_workload(
                    t, noise=z, rng=np.random.default_rng(0)
                ),
            )
        )
    for dense, categorical in ((64, 2), (256, 2)):
        workload = union_workload(dense, categorical)
        flags = (True,) + (False,) * categorical
        terms = union.per_item_terms(workload, ordered=flags, family="hierarchical")
        d_cells, blocks = union.weight_problem_sizes(workload, terms)
        rows.append(
            (
                "union.optimize_weights",
                f"D={dense} k={categorical} T={len(terms)}",
                union.predict_seconds(
                    dense_cells=d_cells,
                    split_blocks=blocks,
                    num_terms=len(terms),
                    num_cells=workload.num_cells,
                ),
                lambda w=workload, t=terms: union.optimize_weights(
                    w, t, noise="laplace", name="bench"
                ),
            )
        )
    for n in (64, 256):
        rows.append(
            (
                "optimizer.optimize_strategy",
                f"prefix n={n} eps=1",
                ldp_reference.predict_seconds(n),
                lambda n=n: optimizer.optimize_strategy(
                    prefix_matrix(n), epsilon=1.0, rng=np.random.default_rng(0)
                ),
            )
        )
    for n in (512, 1024):
        rows.append(
            (
                "eigen_design (budget)",
                f"all ranges n={n} l1",
                compute_limits.predict_eigen_design_seconds(n),
                lambda n=n: eigen_design(all_range_gram(n), noise="laplace"),
            )
        )
    return rows


def prediction_table() -> None:
    speed = machine_speed()
    factor = compute_limits.DGEMM_FLOPS_PER_SECOND / speed
    print(
        f"machine: one-thread DGEMM {speed / 1e9:.1f} GF/s measured, "
        f"{compute_limits.DGEMM_FLOPS_PER_SECOND / 1e9:.1f} GF/s assumed by the predictors "
        f"(load factor {factor:.2f})"
    )
    header = (
        f"{'optimiser':<28} {'case':<24} {'predicted_s':>11} {'wall_s':>8} {'cpu_s':>8} "
        f"{'wall/pred':>9} {'cpu/pred':>8}  within 3x"
    )
    print(header)
    print("-" * len(header))
    for name, case, predicted, run in cases():
        _, wall, cpu = measured(run)
        ratio_wall, ratio_cpu = wall / predicted, cpu / predicted
        verdict = "ok" if 1 / 3 <= ratio_cpu <= 3 else "MISSED"
        print(
            f"{name:<28} {case:<24} {predicted:>11.3f} {wall:>8.3f} {cpu:>8.3f} "
            f"{ratio_wall:>9.2f} {ratio_cpu:>8.2f}  {verdict}",
            flush=True,
        )


# --- time-limited LRM ------------------------------------------------------------------------


def lrm_limit_table(size: int, limits: list[float]) -> None:
    W = lrm_reference.wrange_workload(size, size, rng=np.random.default_rng(0))
    baseline = lrm_reference.noise_on_data_error(W, epsilon=1.0)
    lower, _ = lrm_reference.error_bounds(W, epsilon=1.0)
    print()
    print(
        f"LRM with a time limit: WRange {size}x{size}; predicted unbounded run "
        f"{lrm.predict_seconds(size, size):.0f} s; noise on data (eps^2 x total error) "
        f"{baseline:.4g}; nuclear-norm lower bound {lower:.4g} ({lower / baseline:.3f} x NOD)"
    )
    header = (
        f"{'limit_s':>7} {'wall_s':>8} {'within':>6} {'stopped':>7} {'iters':>5} {'rank':>5} "
        f"{'error':>11} {'vs NOD':>7} {'bias_sq':>9} {'progress calls':>14} {'max gap s':>9}"
    )
    print(header)
    print("-" * len(header))
    for limit in limits:
        stamps: list[float] = []
        start = time.perf_counter()

        def stamp(fraction: float, message: str, stamps: list[float] = stamps) -> None:
            stamps.append(time.perf_counter())

        decomposition, wall, _ = measured(
            lambda limit=limit, stamp=stamp: lrm.decompose(
                W, rng=np.random.default_rng(0), time_limit=limit, progress=stamp
            )
        )
        error = lrm_reference.expected_total_error(W, decomposition, epsilon=1.0)
        gaps = np.diff([start, *stamps, start + wall])
        print(
            f"{limit:>7.1f} {wall:>8.2f} {'yes' if wall <= limit else 'NO':>6} "
            f"{decomposition.stopped_early!s:>7} {decomposition.iterations:>5} "
            f"{decomposition.rank:>5} {error:>11.4g} {error / baseline:>7.3f} "
            f"{decomposition.bias_sq:>9.2g} {len(stamps):>14} {float(gaps.max()):>9.2f}",
            flush=True,
        )


# --- calibration data (what the fitted constants in the modules came from) -------------------


def calibrate(kind: str) -> None:
    if kind == "machine":
        for n in (1024, 2048):
            a = np.random.default_rng(0).standard_normal((n, n))
            g = a @ a.T
            _, product, _ = measured(lambda a=a: a @ a)
            _, eigh, _ = measured(lambda g=g: np.linalg.eigh(g))
            _, svd, _ = measured(lambda a=a: np.linalg.svd(a, full_matrices=False))
            print(
                f"n={n}: dgemm {product:.3f} s ({2 * n**3 / product / 1e9:.1f} GF/s), "
                f"eigh {eigh:.3f} s ({eigh / n**3:.2e}·n³), svd {svd:.3f} s ({svd / n**3:.2e}·n³)"
            )
    elif kind == "lrm":
        shapes = [(64, 64), (128, 128), (256, 256), (512, 512), (1024, 1024), (2048, 64)]
        shapes += [(256, 1024), (1024, 256), (2080, 64), (4096, 128), (4096, 256)]
        shapes += [(128, 1024), (64, 2048), (512, 2048), (2048, 512)]
        for m, n in shapes:
            W = lrm_reference.wrange_workload(m, n, rng=np.random.default_rng(0))
            _, _, svd = measured(lambda W=W: np.linalg.svd(W, full_matrices=False))
            outer = 3 if m * n > 300_000 else 10
            result, _, total = measured(
                lambda W=W, outer=outer: lrm.decompose(
                    W, rng=np.random.default_rng(0), max_outer=outer, gamma=0.0
                )
            )
            print(
                f"m={m} n={n} r={result.rank}: cpu per outer iteration {(total - svd) / outer:.4f} s"
            )
        for n in (32, 64, 128):
            for label, W in (
                ("wrange", lrm_reference.wrange_workload(n, n, rng=np.random.default_rng(0))),
                ("wdiscrete", lrm_reference.wdiscrete_workload(n, n, rng=np.random.default_rng(0))),
                (
                    "wrelated",
                    lrm_reference.wrelated_workload(n, n, n // 4, rng=np.random.default_rng(0)),
                ),
                ("prefix", prefix_matrix(n)),
                ("identity", np.eye(n)),
            ):
                result = lrm.decompose(W, rng=np.random.default_rng(0))
                print(f"n={n} {label}: {result.iterations} outer iterations to converge")
    elif kind == "templates":
        for n in (64, 128, 256, 512, 1024):
            for noise in ("laplace", "gaussian"):
                for label, gram in (("allrange", all_range_gram(n)), ("prefix", prefix_gram(n))):
                    result, _, cpu = measured(
                        lambda g=gram, z=noise: optimized_search.optimize_kron(
                            [(g,)], noise=z, rng=np.random.default_rng(0)
                        )
                    )
                    print(f"n={n} {label} {noise}: {result.iterations} iterations, cpu {cpu:.3f} s")
        for n1, n2 in ((32, 16), (64, 32), (128, 64), (256, 16)):
            terms = [
                (all_range_gram(n1), prefix_gram(n2)),
                (np.eye(n1), np.ones((n2, n2))),
                (np.ones((n1, n1)), all_range_gram(n2)),
            ]
            result, _, cpu = measured(
                lambda t=terms: optimized_search.optimize_kron(
                    t, noise="laplace", rng=np.random.default_rng(0)
                )
            )
            print(f"union {n1}x{n2}: {result.iterations} iterations, cpu {cpu:.3f} s")
        for d in (4, 6, 8, 10, 12, 14):
            subsets = list(itertools.combinations(range(d), 2))
            for noise in ("laplace", "gaussian"):
                result, _, cpu = measured(
                    lambda s=subsets, d=d, z=noise: optimized_search.optimize_marginals(
                        s, [4] * d, noise=z, rng=np.random.default_rng(0), restarts=2
                    )
                )
                print(f"marginals d={d} {noise}: {result.iterations} iterations, cpu {cpu:.3f} s")
    elif kind == "union":
        for dense, categorical in ((16, 2), (64, 2), (64, 4), (256, 2), (256, 4), (512, 3)):
            workload = union_workload(dense, categorical)
            flags = (True,) + (False,) * categorical
            terms = union.per_item_terms(workload, ordered=flags, family="hierarchical")
            result, _, cpu = measured(
                lambda w=workload, t=terms: union.optimize_weights(w, t, noise="laplace", name="x")
            )
            _, blocks = union.weight_problem_sizes(workload, terms)
            evaluations = result.parameters["evaluations"]
            print(
                f"D={dense} k={categorical}: {evaluations} evaluations, cpu {cpu:.3f} s, "
                f"{cpu / evaluations / blocks * 1e3:.2f} ms per evaluation and block"
            )
    elif kind == "ldp":
        for n in (32, 64, 128, 256):
            for label, W in (("prefix", prefix_matrix(n)), ("identity", np.eye(n))):
                for epsilon in (1.0, 4.0):
                    result, _, cpu = measured(
                        lambda W=W, e=epsilon: optimizer.optimize_strategy(
                            W, epsilon=e, rng=np.random.default_rng(0)
                        )
                    )
                    steps = int(result.details["steps"])
                    print(
                        f"n={n} {label} eps={epsilon}: {steps} steps, cpu {cpu:.3f} s, "
                        f"{cpu / max(steps, 1):.5f} s per step"
                    )
    elif kind == "eigen":
        for n in (256, 512, 1024, 2048):
            for label, gram in (
                ("allrange", all_range_gram(n)),
                ("prefix", prefix_gram(n)),
                ("identity", np.eye(n)),
            ):
                for noise in ("gaussian", "laplace"):
                    _, _, cpu = measured(lambda g=gram, s=noise: eigen_design(g, noise=s))
                    eighs = cpu / compute_limits.eigh_seconds(n)
                    print(f"n={n} {label} {noise}: cpu {cpu:.3f} s ({eighs:.1f} eighs)")
    else:
        raise SystemExit(f"unknown calibration {kind!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calibrate", choices=["machine", "lrm", "templates", "union", "ldp", "eigen"]
    )
    parser.add_argument("--lrm-size", type=int, default=1024, help="m = n of the LRM run")
    parser.add_argument("--limits", default="10,30", help="LRM time limits in seconds")
    parser.add_argument("--skip-lrm-limit", action="store_true")
    parser.add_argument("--skip-predictions", action="store_true")
    args = parser.parse_args()
    with threadpoolctl.threadpool_limits(limits=1):
        if args.calibrate:
            calibrate(args.calibrate)
            return
        if not args.skip_predictions:
            prediction_table()
        if not args.skip_lrm_limit:
            limits = [float(value) for value in args.limits.split(",") if value.strip()]
            lrm_limit_table(args.lrm_size, limits)


if __name__ == "__main__":
    main()
