"""Coverage of DAWA's published 95% intervals on the DPBench histograms (issue 26).

For every DPBench 1-D file (4,096 cells) and every 2-D file (256 × 256, coarsened to 64 × 64 =
4,096 cells by summing 4 × 4 blocks, laid out on the Hilbert curve as the release pipeline does),
at ε = 0.1 and 1, DAWA runs ``--trials`` times (fresh noise and a fresh private partition each
time) on two workloads: every single cell, and 2,000 random ranges (1-D: intervals; 2-D:
rectangles).  Per row of the table:

- ``cover``: the fraction of rows claiming an interval whose interval holds the true answer
  (target ≥ 0.90; nominal 0.95);
- ``none``: the fraction of rows published noise-only (no interval);
- ``naive``: the coverage of a noise-only interval (``1.96·√noise_variance``), the baseline that
  ignores the bias of uniform expansion, measured on the same releases;
- ``scale``: the 95th percentile of ``|error| ÷ half-width`` over the claimed rows, the factor the
  published widths would need to cover exactly 95%: 1 is exact, 0.5 twice as wide as needed,
  above 1 too narrow.

The DPBench files are not bundled (they carry no licence): fetch ``dpcomp-org/dpcomp_core`` and
pass its ``datafiles`` folder (holding ``1D/`` and ``2D/``).  Run:
``.venv/bin/python benchmarks/dawa_coverage_bench.py --dpbench-dir DIR`` (about 10 minutes on one
core with the default 3 trials).  The noise is NumPy's Laplace sampler: a benchmark, not a release.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from dawa_bench import NumpyLaplace  # benchmarks/ is on sys.path when run as a script

from dprelease.mechanisms.dawa.hilbert import HilbertLayout
from dprelease.mechanisms.dawa.partition import IntervalWorkload
from dprelease.mechanisms.dawa.uncertainty import cell_coordinates, query_uncertainty
from dprelease.mechanisms.primitives.intervals import interval_half_widths, normal_quantile
from tests.reference.dawa import (
    answer,
    dawa,
    ranges_workload,
)

EPSILONS = (0.1, 1.0)
N_RANGES = 2000
COARSE_SIDE = 64
RATIO, NOISE_OFFSET = 0.25, 3.0  # the release pipeline's defaults
WORKLOAD_SEED, NOISE_SEED = 1000, 5000


def load(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray, HilbertLayout | None]:
    """DAWA's cell vector, each position's grid coordinates, and the 2-D layout (None in 1-D)."""
    grid = np.load(path).astype(float)
    if grid.ndim == 1:
        return grid, cell_coordinates(grid.shape), None
    side = grid.shape[0] // COARSE_SIDE
    coarse = grid.reshape(COARSE_SIDE, side, COARSE_SIDE, side).sum(axis=(1, 3))
    layout = HilbertLayout.for_shape(coarse.shape, keep_padding=False)
    cells = np.zeros(coarse.size)
    cells[layout.position_of_cell().ravel()] = coarse.ravel()
    return cells, cell_coordinates(coarse.shape, layout.cell_at), layout


def workloads(
    n: int, layout: HilbertLayout | None, rng: np.random.Generator
) -> dict[str, IntervalWorkload]:
    """Every cell, and ``N_RANGES`` random intervals (1-D) or rectangles (2-D)."""
    cells = ranges_workload(np.arange(n), np.arange(n), n_cells=n)
    if layout is None:
        ends = np.sort(rng.integers(0, n, size=(N_RANGES, 2)), axis=1)
        return {"cells": cells, "ranges": ranges_workload(*ends.T, n_cells=n)}
    rows = np.sort(rng.integers(0, COARSE_SIDE, size=(N_RANGES, 2)), axis=1)
    columns = np.sort(rng.integers(0, COARSE_SIDE, size=(N_RANGES, 2)), axis=1)
    query, lo, hi = layout.rectangle_pieces(*rows.T, *columns.T)
    rectangles = IntervalWorkload(
        n_cells=n, n_rows=N_RANGES, row=query, lo=lo, hi=hi, weight=np.ones(query.size)
    )
    return {"cells": cells, "ranges": rectangles}


def coverage_row(
    x: np.ndarray,
    coordinates: np.ndarray,
    workload: IntervalWorkload,
    *,
    epsilon: float,
    trials: int,
    seed: int,
) -> dict[str, float]:
    """``cover``, ``none``, ``naive`` and ``scale`` of one workload over ``trials`` releases."""
    sampler = NumpyLaplace(np.random.default_rng(seed))
    truth = answer(workload, x)
    hits = claims = rows = naive_hits = 0
    ratios: list[np.ndarray] = []
    for _ in range(trials):
        result = dawa(
            x, workload, epsilon=epsilon, sampler=sampler, ratio=RATIO, noise_offset=NOISE_OFFSET
        )
        uncertainty = query_uncertainty(
            workload,
            result.strategy,
            result.bucket_estimates,
            noise_variance=2.0 * result.measurement_scale**2,
            coordinates=coordinates,
        )
        error = np.abs(answer(workload, result.estimate) - truth)
        half = interval_half_widths(uncertainty.std_error, interval=uncertainty.interval)
        claimed = uncertainty.bias_estimated
        hits += int(np.count_nonzero(error[claimed] <= half[claimed]))
        claims += int(np.count_nonzero(claimed))
        rows += error.size
        naive = normal_quantile(0.95) * np.sqrt(uncertainty.noise_variance)
        naive_hits += int(np.count_nonzero(error <= naive))
        ratios.append(error[claimed] / half[claimed])
    scale = float(np.quantile(np.concatenate(ratios), 0.95)) if claims else float("nan")
    return {
        "cover": hits / claims if claims else float("nan"),
        "none": 1.0 - claims / rows,
        "naive": naive_hits / rows,
        "scale": scale,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dpbench-dir",
        required=True,
        type=pathlib.Path,
        help="dpcomp_core's datafiles folder (holding 1D/*.npy and 2D/*.npy)",
    )
    parser.add_argument("--trials", type=int, default=3, help="releases per row (default 3)")
    args = parser.parse_args()
    files = sorted((args.dpbench_dir / "1D").glob("*.npy")) + sorted(
        (args.dpbench_dir / "2D").glob("*.npy")
    )
    if not files:
        parser.error(f"--dpbench-dir {args.dpbench_dir} holds no 1D/*.npy or 2D/*.npy files")
    started = time.perf_counter()
    print(
        f"DAWA 95% intervals on DPBench: {args.trials} releases per row, ratio {RATIO}, "
        f"noise offset {NOISE_OFFSET}; seeds: workloads {WORKLOAD_SEED}, noise {NOISE_SEED}+i"
    )
    header = (
        f"{'dataset':<42}{'ε':>5}{'workload':>10}{'cover':>8}{'none':>7}{'naive':>8}{'scale':>8}"
    )
    print(header)
    worst = 1.0
    for index, path in enumerate(files):
        x, coordinates, layout = load(path)
        name = f"{path.parent.name}/{path.stem}"
        for epsilon in EPSILONS:
            queries = workloads(x.size, layout, np.random.default_rng(WORKLOAD_SEED + index))
            for label, workload in queries.items():
                row = coverage_row(
                    x,
                    coordinates,
                    workload,
                    epsilon=epsilon,
                    trials=args.trials,
                    seed=NOISE_SEED + index,
                )
                worst = min(worst, row["cover"])
                print(
                    f"{name[:41]:<42}{epsilon:>5g}{label:>10}{row['cover']:>8.3f}"
                    f"{row['none']:>7.2f}{row['naive']:>8.3f}{row['scale']:>8.2f}",
                    flush=True,
                )
    print(f"\nlowest coverage {worst:.3f} (target ≥ 0.90); {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
