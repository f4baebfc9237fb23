"""Eigen-Design benchmark: Table 4.1 / section 9 targets at 2048 cells and the section 5.2.2 speed-ups.

Table 1 runs the dense path (``eigen_design(gram)``: minimisation, ``eigh``, weighting, completion,
exact error) on the reference note's 2048-cell workloads and prints total error / SVDB for
Identity, Hierarchical, Wavelet (``mechanisms.primitives.strategies``), Eigen-Design before and after
completion (thesis-faithful, ``compare_svd_bound=False``) and the returned strategy (best of
Eigen-Design and the completed SVD-bound strategy, note A14).

Table 2 compares the weighting methods (full, eigen-query separation, principal vectors) on
ALLRANGE(n) and all 2-way marginals, from closed-form spectra, at each ``--sizes`` n.  The baseline
of every ratio is the full method measured in the same run.  "weigh s" is the time of the weighting
program alone (``complete=False``); "total s" adds completion and the exact O(n^3) error evaluation.

Table 3 (issue 19) runs the ``eigen`` mechanism's whole planning path (workload Gram from closed
forms, Eigen-Design, expected error, support check, SVD bound) on all ranges of n cells in a child
process under an address-space limit (RLIMIT_AS: 2 GiB at 2,048 cells, 4 GiB at 4,096), and prints
TOTAL/SVDB, the identity strategy's ratio measured in the same run (the baseline), wall seconds
and the child's peak resident memory.  Before issue 19 the path allocated the dense 2,098,176 ×
2,048 workload (32 GiB).

Usage (from the repository root)::

    .venv/bin/python benchmarks/eigen_bench.py                 # all tables, n = 2048 and 8192
    .venv/bin/python benchmarks/eigen_bench.py --sizes 2048    # quicker
    .venv/bin/python benchmarks/eigen_bench.py --skip-targets --sizes --plan-sizes 2048 4096

OpenBLAS defaults to one thread here (set ``OPENBLAS_NUM_THREADS`` to override): on a shared
machine, multi-threaded BLAS under contention was 10x slower in our measurements.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dprelease.mechanisms.eigen.design import (
    WorkloadSpectrum,
    eigen_design,
    minimize_workload,
    workload_spectrum,
)
from dprelease.mechanisms.primitives.lower_bound import svd_bound_gram as svd_bound
from dprelease.mechanisms.primitives.strategies import hierarchical_strategy, wavelet_strategy
from tests.reference.eigen import (
    all_range_gram,
    all_range_gram_nd,
    all_range_spectrum,
    eigen_design_from_spectrum,
    k_way_cliques,
    marginals_gram,
    marginals_spectrum,
    prefix_gram,
    svd_bound_from_spectrum,
    total_error_l2,
)


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print()


def fmt(value: float, digits: int = 4) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}f}"
    )


def kron_dense(*factors: np.ndarray) -> np.ndarray:
    result = np.ones((1, 1))
    for factor in factors:
        result = np.kron(result, factor)
    return result


def competitors(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {
        "identity": np.eye(math.prod(shape)),
        "H": kron_dense(*(hierarchical_strategy(n).dense() for n in shape)),
        "Y": kron_dense(*(wavelet_strategy(n).dense() for n in shape)),
    }


def table_targets(rng: np.random.Generator) -> None:
    permutation = rng.permutation(2048)
    cases: list[tuple[str, Callable[[], np.ndarray], tuple[int, ...] | None, str, str]] = [
        ("ALLRANGE(1024)", lambda: all_range_gram(1024), (1024,), "1.0301", "1.0656"),
        ("ALLRANGE(2048)", lambda: all_range_gram(2048), (2048,), "1.0278 (T4.1 1.028)", "1.0606"),
        (
            "ALLRANGE(2048) permuted",
            lambda: all_range_gram(2048)[np.ix_(permutation, permutation)],
            (2048,),
            "= unpermuted",
            "= unpermuted",
        ),
        (
            "ALLRANGE(64,32)",
            lambda: all_range_gram_nd((64, 32)),
            (64, 32),
            "1.1071 (T4.1 1.107)",
            "1.1900",
        ),
        (
            "2-way marg 8x16x16",
            lambda: marginals_gram((8, 16, 16), k_way_cliques(3, 2)),
            None,
            "1.0000",
            "1.0000",
        ),
        ("ALLRANGE(2^x10)", lambda: all_range_gram_nd((2,) * 10), (2,) * 10, "1.0000", "1.0000"),
        ("CDF(2048)", lambda: prefix_gram(2048), (2048,), "1.643", "-"),
    ]
    headers = [
        "workload", "n", "SVDB", "identity", "H", "Y", "ED before", "ED after", "target after",
        "target before", "returned", "source", "iters", "gap", "ED s",
    ]  # fmt: skip
    rows = []
    for name, build, shape, target_after, target_before in cases:
        gram = build()
        start = time.perf_counter()
        returned = eigen_design(gram)  # the dense path, with the A14 comparison
        seconds = time.perf_counter() - start
        bound = svd_bound(gram)
        spectrum = workload_spectrum(minimize_workload(gram).gram)
        faithful = eigen_design_from_spectrum(spectrum, compare_svd_bound=False)
        errors = {"identity": float(np.trace(gram)), "H": math.nan, "Y": math.nan}
        if shape is not None:
            # H and Y keep the natural cell order, so on the permuted workload they lose locality.
            strategies = competitors(shape)
            errors.update(
                {k: total_error_l2(gram, v) for k, v in strategies.items() if k != "identity"}
            )
        rows.append(
            [
                name, str(gram.shape[0]), f"{bound:.6e}", fmt(errors["identity"] / bound),
                fmt(errors["H"] / bound), fmt(errors["Y"] / bound),
                fmt(faithful.total_error_before_completion / bound), fmt(faithful.total_error / bound),
                target_after, target_before, fmt(returned.total_error / bound), returned.source,
                str(returned.solver_iterations), f"{returned.solver_relative_gap:.1e}", f"{seconds:.1f}",
            ]
        )  # fmt: skip
        if name.startswith("CDF"):
            ed = faithful.total_error
            print(
                f"CDF(2048) workload-error ratios (sqrt of total): H/ED {math.sqrt(errors['H'] / ed):.3f}"
                f" (note 0.991), Y/ED {math.sqrt(errors['Y'] / ed):.3f} (note 0.987),"
                f" bound/ED {math.sqrt(bound / ed):.3f} (note 0.780)"
            )
        if name.endswith("permuted"):
            ed = faithful.total_error
            print(
                f"ALLRANGE(2048) permuted, workload-error ratios: Y/ED {math.sqrt(errors['Y'] / ed):.2f}"
                f" (note 9.56), H/ED {math.sqrt(errors['H'] / ed):.2f} (note 12.88)"
            )
    print()
    print(
        "Table 1. total error / SVDB under L2 (independent of eps, delta, rho).  'ED before/after':"
    )
    print(
        "Program 5.1.2 without/with completion; 'returned': eigen_design() default (best of ED and"
    )
    print(
        "the completed SVD-bound strategy, A14); 'ED s': wall time of eigen_design(gram), dense path."
    )
    print_table(headers, rows)


def table_methods(sizes: list[int]) -> None:
    methods: list[tuple[str, dict[str, object]]] = [
        ("full", {"method": "full"}),
        ("separation g=16", {"method": "separation", "group_size": 16}),
        ("separation g=64", {"method": "separation", "group_size": 64}),
        ("principal 6%", {"method": "principal", "principal_fraction": 0.06}),
        ("principal 10%", {"method": "principal", "principal_fraction": 0.10}),
        ("principal 25%", {"method": "principal", "principal_fraction": 0.25}),
    ]
    headers = [
        "workload", "n", "rank", "method", "after/SVDB", "before/SVDB", "sqrt vs full",
        "weigh s", "weigh speed-up", "total s", "iters", "gap",
    ]  # fmt: skip
    rows = []
    for n in sizes:
        marginal_shape = {2048: (8, 16, 16), 8192: (8, 32, 32)}.get(n)
        workloads: list[tuple[str, Callable[[], WorkloadSpectrum]]] = [
            (f"ALLRANGE({n})", lambda n=n: all_range_spectrum(n)),
        ]
        if marginal_shape is not None:
            label = "x".join(map(str, marginal_shape))
            workloads.append(
                (
                    f"2-way marg {label}",
                    lambda s=marginal_shape: marginals_spectrum(s, k_way_cliques(3, 2)),
                )
            )
        for name, build in workloads:
            start = time.perf_counter()
            spectrum = build()
            spectrum_seconds = time.perf_counter() - start
            print(
                f"{name}: closed-form spectrum in {spectrum_seconds:.2f} s (rank {spectrum.rank})"
            )
            bound = svd_bound_from_spectrum(spectrum)
            baseline_error = baseline_seconds = math.nan
            for label, options in methods:
                start = time.perf_counter()
                eigen_design_from_spectrum(
                    spectrum, complete=False, compare_svd_bound=False, **options
                )
                weigh_seconds = time.perf_counter() - start
                start = time.perf_counter()
                result = eigen_design_from_spectrum(spectrum, compare_svd_bound=False, **options)
                total_seconds = time.perf_counter() - start
                if label == "full":
                    baseline_error, baseline_seconds = result.total_error, weigh_seconds
                rows.append(
                    [
                        name, str(n), str(spectrum.rank), label, fmt(result.total_error / bound),
                        fmt(result.total_error_before_completion / bound),
                        f"{math.sqrt(result.total_error / baseline_error) - 1:+.1%}",
                        f"{weigh_seconds:.2f}", f"{baseline_seconds / weigh_seconds:.1f}x",
                        f"{total_seconds:.1f}", str(result.solver_iterations),
                        f"{result.solver_relative_gap:.1e}",
                    ]
                )  # fmt: skip
                print(
                    f"  {label}: {rows[-1][4]} after completion, {total_seconds:.1f} s", flush=True
                )
    print()
    print(
        "Table 2. Section 5.2.2 speed-ups (thesis-faithful: no A14 comparison).  'sqrt vs full' is the"
    )
    print("change in workload error (sqrt of total error) against the full method in the same run.")
    print_table(headers, rows)


def table_plan_path(sizes: list[int]) -> None:
    import subprocess
    import sys
    from pathlib import Path

    headers = [
        "workload", "AS limit", "TOTAL/SVDB", "target", "identity/SVDB", "residual", "seconds",
        "peak RSS GiB", "status",
    ]  # fmt: skip
    rows = []
    for n in sizes:
        limit_gib = 2 if n <= 2048 else 4
        result = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("eigen_plan_child.py")),
                str(n),
                str(limit_gib),
            ],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
        )
        if result.returncode != 0:
            tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
            rows.append([f"ALLRANGE({n})", f"{limit_gib} GiB", *["-"] * 6, f"failed: {tail[0]}"])
            continue
        ratio, identity, residual, seconds, peak = (float(v) for v in result.stdout.split())
        rows.append(
            [
                f"ALLRANGE({n})", f"{limit_gib} GiB", fmt(ratio), "<= 1.028" if n == 2048 else "-",
                fmt(identity, 2), f"{residual:.1e}", f"{seconds:.1f}", f"{peak:.2f}", "ok",
            ]
        )  # fmt: skip
        print(
            f"  ALLRANGE({n}): {rows[-1][2]} in {rows[-1][6]} s, peak {rows[-1][7]} GiB", flush=True
        )
    print()
    print(
        "Table 3. The eigen mechanism's planning path under an address-space limit (child process)."
    )
    print_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[2048, 8192])
    parser.add_argument("--plan-sizes", type=int, nargs="*", default=[2048, 4096])
    parser.add_argument("--skip-targets", action="store_true")
    parser.add_argument("--seed", type=int, default=20240611, help="cell permutation (public)")
    args = parser.parse_args()
    print(f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}, numpy {np.__version__}")
    start = time.perf_counter()
    if not args.skip_targets:
        table_targets(np.random.default_rng(args.seed))
    if args.sizes:
        table_methods(args.sizes)
    if args.plan_sizes:
        table_plan_path(args.plan_sizes)
    print(f"benchmark finished in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
