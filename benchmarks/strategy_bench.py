"""Benchmark of the optimised strategy templates against HDMM's published figures and the SVD bound.

Prints one plain-text row per workload: the chosen template, our rmse, the SVD-bound rmse and our
ratio to it, the identity strategy's rmse measured in the same run (the baseline) and our ratio to
it, HDMM's stored figure (anchors.md §2 and §12; not re-run here), and the wall and CPU seconds of
the optimisation alone (the bound and the baseline are timed separately and not included).

Units: rmse = √(total error / m) at unit noise variance per unit sensitivity (L2 for Gaussian,
i.e. ρ = 1/2; L1 for Laplace, i.e. ε = √2), m = number of workload queries.

A second table (issue 19) runs the subset-space strategies of :mod:`mechanisms.primitives.marginal_strategies`
on the 14 Adult attributes (private-pgm's discretised domain, the one ``flows/examples`` ships):
all 1–3-way and all 2-way marginals, ρ = 1/2 (Gaussian) and ε = 1 (Laplace).  It prints rmse, the
SVD-bound rmse and the ratio, the baseline measured in the same run (every marginal measured
separately with the budget split evenly: rmse √K at ρ = 1/2, √2·K/ε for Laplace, K marginals)
and the seconds of the strategy search plus the per-item error evaluation.

Usage (from the repository root)::

    .venv/bin/python benchmarks/strategy_bench.py                 # every case (minutes)
    .venv/bin/python benchmarks/strategy_bench.py --cases allrange-gaussian --max-n 1024
    .venv/bin/python benchmarks/strategy_bench.py --cases adult --pinv-domains ''  # issue 19
    .venv/bin/python benchmarks/strategy_bench.py --blas-threads 1  # for a contended machine

``--blas-threads`` sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS before NumPy is imported: on a
machine shared by several busy processes, multi-threaded OpenBLAS can be an order of magnitude
slower on small matrices.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    workload: str
    n: int
    noise: str
    hdmm_rmse: float | None
    note: str = ""


CASES = [
    *(
        Case(name=f"allrange-gaussian-{n}", workload="allrange", n=n, noise="gaussian", hdmm_rmse=h)
        for n, h in [(128, 2.599), (256, 2.902), (512, 3.210), (1024, 3.568), (2048, 3.850)]
    ),
    Case(name="prefix-gaussian-128", workload="prefix", n=128, noise="gaussian", hdmm_rmse=2.312),
    Case(name="prefix-gaussian-1024", workload="prefix", n=1024, noise="gaussian", hdmm_rmse=3.065),
    Case(
        name="prefix-gaussian-2048",
        workload="prefix",
        n=2048,
        noise="gaussian",
        hdmm_rmse=5.002,
        note="HDMM's optimiser failed; target <= 3.25",
    ),
    Case(
        name="width32-gaussian-1024", workload="width32", n=1024, noise="gaussian", hdmm_rmse=2.389
    ),
    Case(
        name="width32-gaussian-2048", workload="width32", n=2048, noise="gaussian", hdmm_rmse=3.577
    ),
    Case(
        name="allrange-gaussian-4096",
        workload="allrange",
        n=4096,
        noise="gaussian",
        hdmm_rmse=None,
        note="speed target: < 60 s",
    ),
    Case(name="allrange-laplace-256", workload="allrange", n=256, noise="laplace", hdmm_rmse=5.736),
    Case(
        name="allrange2d-laplace-256x256",
        workload="allrange2d",
        n=256,
        noise="laplace",
        hdmm_rmse=32.69,
    ),
    Case(
        name="marginals2way-gaussian-8x16x16",
        workload="marginals",
        n=2048,
        noise="gaussian",
        hdmm_rmse=None,
        note="SVD bound is tight (thesis Thm 4.9)",
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names")
    parser.add_argument("--max-n", type=int, default=4096, help="skip cases with larger n")
    parser.add_argument("--blas-threads", type=int, default=None, help="BLAS threads (env)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the public rng")
    parser.add_argument(
        "--time-limit", type=float, default=55.0, help="seconds for each Laplace template search"
    )
    parser.add_argument(
        "--pinv-domains",
        default="10x10x10x10x10x10,10x10x10x10x10x10x10",
        help="domains for the marginals (AᵀA)⁺v timing ('' to skip), e.g. 32x32x32x32",
    )
    args = parser.parse_args()
    if args.blas_threads is not None:
        for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(args.blas_threads)
    wanted = [part for part in args.cases.split(",") if part]
    selected = [
        case
        for case in CASES
        if case.n <= args.max_n and (not wanted or any(w in case.name for w in wanted))
    ]
    if selected:
        run(selected, seed=args.seed)
    if not wanted or any(w in "adult-marginals" for w in wanted):
        run_adult_marginals(seed=args.seed, time_limit=args.time_limit)
    domains = [
        tuple(int(n) for n in part.split("x")) for part in args.pinv_domains.split(",") if part
    ]
    if domains:
        run_pinv(domains, seed=args.seed)


def run(cases: list[Case], *, seed: int) -> None:
    import numpy as np  # imported here so --blas-threads takes effect first

    from dprelease.mechanisms.optimized.search import optimize_workload
    from tests.reference.lower_bound import svd_bound_terms as svd_bound

    def all_range(n: int) -> np.ndarray:
        i = np.arange(1, n + 1)
        return np.minimum.outer(i, i) * (n - np.maximum.outer(i, i) + 1.0)

    def prefix(n: int) -> np.ndarray:
        i = np.arange(1, n + 1)
        return n - np.maximum.outer(i, i) + 1.0

    def width(n: int, w: int) -> np.ndarray:
        starts = np.arange(n - w + 1)
        queries = (np.arange(n)[None, :] >= starts[:, None]) & (
            np.arange(n)[None, :] < starts[:, None] + w
        )
        q = queries.astype(np.float64)
        return q.T @ q

    def workload(case: Case) -> tuple[list[tuple[np.ndarray, ...]], float]:
        n = case.n
        if case.workload == "allrange":
            return [(all_range(n),)], n * (n + 1) / 2
        if case.workload == "prefix":
            return [(prefix(n),)], float(n)
        if case.workload == "width32":
            return [(width(n, 32),)], float(n - 31)
        if case.workload == "allrange2d":
            g = all_range(n)
            return [(g, g)], (n * (n + 1) / 2) ** 2
        sizes = (8, 16, 16)
        terms = [
            tuple(np.eye(k) if i in pair else np.ones((k, k)) for i, k in enumerate(sizes))
            for pair in [(0, 1), (0, 2), (1, 2)]
        ]
        queries = sum(sizes[a] * sizes[b] for a, b in [(0, 1), (0, 2), (1, 2)])
        return terms, float(queries)

    def timed(function: Callable[[], float]) -> tuple[float, float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        value = function()
        return value, time.perf_counter() - wall, time.process_time() - cpu

    header = (
        f"{'case':32} {'template':10} {'rmse':>8} {'bound':>8} {'/bound':>7} {'identity':>9} "
        f"{'/ident':>7} {'HDMM':>7} {'<=HDMM':>6} {'wall s':>8} {'cpu s':>8} {'iters':>6}  note"
    )
    print(header)
    print("-" * len(header))
    for case in cases:
        terms, m = workload(case)
        rng = np.random.default_rng(seed)
        result_box = {}

        def optimise(terms=terms, rng=rng, case=case, box=result_box) -> float:
            box["result"] = optimize_workload(terms, noise=case.noise, rng=rng)
            return box["result"].total_error

        total, wall, cpu = timed(optimise)
        result = result_box["result"]
        try:
            bound = svd_bound(terms)
        except ValueError:  # the exact bound is limited to 4096 non-marginal-like cells
            bound = math.nan
        identity = float(sum(np.prod([np.trace(g) for g in term]) for term in terms))
        rmse = np.sqrt(total / m)
        bound_rmse = np.sqrt(bound / m)
        identity_rmse = np.sqrt(identity / m)
        template = (
            result.kind
            if result.kind != "kron"
            else "kron:" + "/".join(t[:4] for t in result.factor_templates)
        )
        hdmm = f"{case.hdmm_rmse:7.3f}" if case.hdmm_rmse is not None else f"{'-':>7}"
        beats = "-" if case.hdmm_rmse is None else ("yes" if rmse <= case.hdmm_rmse else "NO")
        print(
            f"{case.name:32} {template:10} {rmse:8.4f} {bound_rmse:8.4f} {rmse / bound_rmse:7.4f} "
            f"{identity_rmse:9.3f} {rmse / identity_rmse:7.4f} {hdmm} {beats:>6} {wall:8.2f} "
            f"{cpu:8.2f} {result.iterations:6d}  {case.note}",
            flush=True,
        )


ADULT_SIZES = (85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2)
"""age, workclass, fnlwgt, education-num, marital-status, occupation, relationship, race, sex,
capital-gain, capital-loss, hours-per-week, native-country, income>50K (private-pgm's
data/adult-domain.json; 6.4e17 cells)."""


def run_adult_marginals(*, seed: int, time_limit: float) -> None:
    """Issue 19 targets: subset-space strategies on Adult's marginal workloads."""
    import itertools
    import math

    import numpy as np

    from dprelease.mechanisms.primitives.lower_bound import svd_bound
    from dprelease.mechanisms.primitives.marginal_strategies import (
        marginal_weights_l1,
        marginal_weights_l2,
        marginal_weights_template,
        subset_strategy,
        subset_workload,
    )
    from dprelease.mechanisms.primitives.operators import Identity, Total
    from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

    print()
    header = (
        f"{'adult workload':18} {'noise':9} {'strategy':22} {'rmse':>9} {'bound':>8} {'/bound':>7} "
        f"{'baseline':>9} {'/base':>6} {'search s':>8} {'eval s':>7} {'stopped':>7}"
    )
    print(header)
    print("-" * len(header))
    for label, ways in [("1-3-way marginals", (1, 2, 3)), ("2-way marginals", (2,))]:
        subsets = [s for k in ways for s in itertools.combinations(range(len(ADULT_SIZES)), k)]
        workload = Workload(
            domain_shape=ADULT_SIZES,
            items=tuple(
                WorkloadItem(
                    name="-".join(map(str, s)),
                    factors=tuple(
                        Identity(n) if i in s else Total(n) for i, n in enumerate(ADULT_SIZES)
                    ),
                )
                for s in subsets
            ),
        )
        m, k = workload.num_queries, len(subsets)
        bound = svd_bound(workload)
        started = time.perf_counter()
        projected = subset_workload(workload)
        prepare = time.perf_counter() - started
        runs = [
            (
                "gaussian ρ=.5",
                "subset Eigen-Design",
                1.0,
                math.sqrt(k),
                lambda w: marginal_weights_l2(w),
            ),
            (
                "gaussian ρ=.5",
                "marginals template",
                1.0,
                math.sqrt(k),
                lambda w: marginal_weights_template(
                    w, noise="gaussian", rng=np.random.default_rng(seed), time_limit=time_limit
                ),
            ),
            (
                "laplace ε=1",
                "marginals template",
                2.0,
                math.sqrt(2.0) * k,
                lambda w: marginal_weights_l1(
                    w, rng=np.random.default_rng(seed), time_limit=time_limit
                ),
            ),
        ]  # (noise, strategy, variance per unit sensitivity, baseline rmse, search)
        for noise, name, variance, baseline, search in runs:
            started = time.perf_counter()
            weights = search(projected)
            seconds = time.perf_counter() - started + prepare
            strategy = subset_strategy(weights, name=name)
            started = time.perf_counter()
            total = sum(strategy.item_unit_total(item) for item in workload.items)
            evaluate = time.perf_counter() - started
            unit = (
                strategy.sensitivity(noise=weights.noise) ** 2 * total
            )  # = weights.unit_total_error
            rmse = math.sqrt(variance * unit / m)
            bound_rmse = math.sqrt(variance * bound / m)
            print(
                f"{label:18} {noise:9} {name:22} {rmse:9.4f} {bound_rmse:8.4f} "
                f"{rmse / bound_rmse:7.4f} {baseline:9.3f} {rmse / baseline:6.3f} {seconds:8.2f} "
                f"{evaluate:7.2f} {'yes' if weights.stopped_early else 'no':>7}",
                flush=True,
            )


def run_pinv(domains: list[tuple[int, ...]], *, seed: int) -> None:
    """Time ``(AᵀA)⁺ v`` for a random weighted-marginals strategy on data-sized vectors."""
    import numpy as np

    from tests.reference.marginal_algebra import marginals_gram_apply, marginals_gram_pinv_apply

    print()
    header = (
        f"{'domain (marginals pinv apply)':32} {'cells':>12} {'pinv s':>8} {'cpu s':>8} "
        f"{'1 pass s':>8} {'/pass':>7} {'residual':>9}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(seed)
    for sizes in domains:
        d = len(sizes)
        weights = rng.random(2**d)  # includes the identity: AᵀA is invertible
        vector = rng.standard_normal(int(np.prod(sizes)))
        wall, cpu = time.perf_counter(), time.process_time()
        solved = marginals_gram_pinv_apply(weights, sizes, vector)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        buffer = vector * 2.0  # baseline: one elementwise pass over the cells (timed warm)
        one_pass = time.perf_counter()
        np.multiply(vector, 2.0, out=buffer)
        one_pass = time.perf_counter() - one_pass
        back = marginals_gram_apply(weights**2, sizes, solved)
        residual = float(np.linalg.norm(back - vector) / np.linalg.norm(vector))
        print(
            f"{'x'.join(map(str, sizes)):32} {vector.size:12d} {wall:8.2f} {cpu:8.2f} "
            f"{one_pass:8.3f} {wall / one_pass:7.1f} {residual:9.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
