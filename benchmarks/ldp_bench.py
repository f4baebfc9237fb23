"""Benchmark of the LDP workload factorization mechanism (mechanisms/local/) against its baselines.

For each domain size it builds every baseline (randomized response, Hadamard in the general and
the Table-1 form, hierarchical B=4 with the Hadamard oracle, Fourier when n is a power of two),
optimises a strategy from a random start, and prints one plain table: worst-case variance per
user with the Theorem 3.10 reconstruction (what releases use), the same with V = W pinv(Q) (the
authors' README convention), average-case variance, sample complexity at alpha = 0.01
(Cor 5.4), the ratio of each baseline's worst case to the optimised one, and seconds taken.
Reference figures (shared/reference/seed-ldp.md §9.2): Prefix n=128, eps=1: hierarchical 5466.13
(5665.56 with pinv), the reference code's optimised strategy 1896.25 (1910.87 with pinv).

BLAS runs single-threaded (as inside mechanisms/local/: on a shared machine BLAS threads contend).
Run from the repository root with the project installed (``install.sh``):

    .venv/bin/python benchmarks/ldp_bench.py                      # Prefix, n = 128 and 512
    .venv/bin/python benchmarks/ldp_bench.py --n 128 --seeds 3
    .venv/bin/python benchmarks/ldp_bench.py --n 128 --workload all_range --epsilon 4
    .venv/bin/python benchmarks/ldp_bench.py --n 128 --ablation   # + each phase alone
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
import threadpoolctl

from dprelease.mechanisms.local import baselines, estimation, optimizer, randomizer
from tests.reference import ldp as ldp_reference

ALPHA = 0.01
REFERENCE = {  # (workload, n, epsilon) -> (label, worst-case per user, Thm 3.10 V)
    ("prefix", 128, 1.0): ("reference code, best start", 1896.25),
}


def workload_matrix(name: str, n: int) -> np.ndarray:
    if name == "prefix":
        return np.tril(np.ones((n, n)))
    if name == "histogram":
        return np.eye(n)
    if name == "all_range":
        starts, ends = np.triu_indices(n)
        items = np.arange(n)
        return ((items >= starts[:, None]) & (items <= ends[:, None])).astype(float)
    raise ValueError(f"workload ({name!r}) must be prefix, histogram or all_range")


def baseline_builders(n: int, epsilon: float) -> dict[str, Callable[[], randomizer.LDPStrategy]]:
    builders: dict[str, Callable[[], randomizer.LDPStrategy]] = {
        "randomized_response": lambda: baselines.randomized_response(n, epsilon=epsilon),
        "hadamard (general)": lambda: baselines.hadamard(n, epsilon=epsilon),
        "hadamard (table 1)": lambda: baselines.hadamard(n, epsilon=epsilon, blocks=1),
        "hierarchical B=4": lambda: baselines.hierarchical(n, epsilon=epsilon),
    }
    if n & (n - 1) == 0:
        builders["fourier (all)"] = lambda: baselines.fourier(n.bit_length() - 1, epsilon=epsilon)
    return builders


def _start(W: np.ndarray, epsilon: float, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    n = W.shape[1]
    gram = W.T @ W
    matrix, lower = optimizer._random_start(4 * n, n, epsilon, rng)
    evaluation = optimizer._evaluate(matrix, gram)
    state = optimizer._Iterate(
        matrix,
        lower,
        math.exp(epsilon) * lower,
        evaluation,
        optimizer._centered_gradient(evaluation),
    )
    return gram, state


def algorithm_2_alone(
    W: np.ndarray, *, epsilon: float, rng: np.random.Generator, iterations: int, tolerance: float
) -> randomizer.LDPStrategy:
    """Ablation: the paper's joint (Q, z) step from the random start, without the fixed-z phase."""
    gram, state = _start(W, epsilon, rng)
    state, _ = optimizer._bound_descent(
        state, gram, epsilon=epsilon, max_steps=iterations, tolerance=tolerance
    )
    return randomizer.LDPStrategy(
        name="algorithm 2 alone",
        Q=randomizer.enforce_row_ratio(state.matrix, epsilon),
        epsilon=epsilon,
    )


def fixed_bounds_only(
    W: np.ndarray, *, epsilon: float, rng: np.random.Generator, iterations: int, tolerance: float
) -> randomizer.LDPStrategy:
    """Ablation: phase 1 alone (z fixed at the start's bounds, spectral projected gradient)."""
    gram, state = _start(W, epsilon, rng)
    state, _ = optimizer._spectral_projected_gradient(
        state, gram, max_steps=iterations, tolerance=tolerance
    )
    return randomizer.LDPStrategy(
        name="phase 1 only", Q=randomizer.enforce_row_ratio(state.matrix, epsilon), epsilon=epsilon
    )


def measure(
    W: np.ndarray, build: Callable[[], randomizer.LDPStrategy], *, with_pinv: bool
) -> dict[str, float]:
    start = time.perf_counter()
    strategy = build()
    built = time.perf_counter() - start
    sigma2 = estimation.per_type_variance(W, strategy)
    row = {
        "rows": strategy.num_outputs,
        "worst": float(sigma2.max()),
        "average": float(sigma2.mean()),
        "samples": float(sigma2.max()) / (W.shape[0] * ALPHA),
        "seconds": built,
        "worst_pinv": math.nan,
    }
    if with_pinv:
        V = W @ np.linalg.pinv(strategy.Q, rcond=1e-8)
        row["worst_pinv"] = ldp_reference.worst_case_variance(W, strategy, V)
    return row


def run(args: argparse.Namespace, n: int) -> None:
    W = workload_matrix(args.workload, n)
    epsilon = args.epsilon
    rows: dict[str, dict[str, float]] = {}
    for name, build in baseline_builders(n, epsilon).items():
        rows[name] = measure(W, build, with_pinv=True)
    for seed in range(args.seeds):

        def optimised(seed: int = seed) -> randomizer.LDPStrategy:
            return optimizer.optimize_strategy(
                W,
                epsilon=epsilon,
                rng=np.random.default_rng(seed),
                rows=args.rows_factor * n,
                iterations=args.iterations,
                tolerance=args.tolerance,
            )

        rows[f"optimized (seed {seed})"] = measure(W, optimised, with_pinv=True)
        if args.ablation:
            for label, variant in (
                ("phase 1 only", fixed_bounds_only),
                ("algorithm 2 alone", algorithm_2_alone),
            ):

                def ablation(
                    seed: int = seed, variant: Callable[..., randomizer.LDPStrategy] = variant
                ) -> randomizer.LDPStrategy:
                    return variant(
                        W,
                        epsilon=epsilon,
                        rng=np.random.default_rng(seed),
                        iterations=args.iterations,
                        tolerance=args.tolerance,
                    )

                rows[f"{label} (seed {seed})"] = measure(W, ablation, with_pinv=True)

    best_optimised = min(r["worst"] for k, r in rows.items() if k.startswith("optimized"))
    bound = estimation.lower_bound(W, epsilon=epsilon)
    print(f"\n{args.workload}, n = {n}, epsilon = {epsilon:g}, p = {W.shape[0]} queries")
    header = (
        f"{'mechanism':<30} {'rows':>6} {'worst (Thm3.10 V)':>18} {'worst (V=WQ+)':>14} "
        f"{'average':>12} {'N at a=0.01':>12} {'worst/opt':>9} {'seconds':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        print(
            f"{name:<30} {row['rows']:>6d} {row['worst']:>18.2f} {row['worst_pinv']:>14.2f} "
            f"{row['average']:>12.2f} {row['samples']:>12.1f} "
            f"{row['worst'] / best_optimised:>9.3f} {row['seconds']:>8.2f}"
        )
    print(
        f"{'lower bound (Cor 5.7)':<30} {'':>6} {bound:>18.2f} {'':>14} {'':>12} "
        f"{bound / (W.shape[0] * ALPHA):>12.1f} {bound / best_optimised:>9.3f} {'':>8}"
    )
    reference = REFERENCE.get((args.workload, n, epsilon))
    if reference is not None:
        label, value = reference
        print(
            f"{label:<30} {'':>6} {value:>18.2f} {'':>14} {'':>12} "
            f"{value / (W.shape[0] * ALPHA):>12.1f} {value / best_optimised:>9.3f} {'':>8}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument(
        "--workload", default="prefix", choices=["prefix", "histogram", "all_range"]
    )
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rows-factor", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--ablation", action="store_true")
    args = parser.parse_args()
    with threadpoolctl.threadpool_limits(limits=1):
        for n in args.n:
            run(args, n)


if __name__ == "__main__":
    main()
