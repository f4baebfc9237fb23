"""Noise for 10^6 strategy answers: the vetted OpenDP sampler vs an unvetted numpy draw (same run).

Usage: .venv/bin/python benchmarks/noise_bench.py [--size N]
Target (issue 3): the noise step for 10^6 values under 10 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from dprelease.mechanisms.primitives.noise import OpenDPSampler


def best_of(repeats: int, function) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    values = np.zeros(args.size)
    rng = np.random.default_rng(1)  # baseline only: numpy is NOT floating-point safe
    rows = []
    for kind in ("laplace", "gaussian"):
        for threads in (1, os.cpu_count() or 1):
            sampler = OpenDPSampler(threads=threads)
            draw = (
                (lambda s=sampler: s.add_laplace(values, scale=1.0))
                if kind == "laplace"
                else (lambda s=sampler: s.add_gaussian(values, sigma=1.0))
            )
            vetted = best_of(args.repeats, draw)
            baseline = best_of(
                args.repeats,
                (lambda: values + rng.laplace(0, 1.0, values.size))
                if kind == "laplace"
                else (lambda: values + rng.normal(0, 1.0, values.size)),
            )
            rows.append((kind, threads, vetted, baseline, vetted / baseline))
    print(f"noise for {args.size:,} values (best of {args.repeats}); cpu_count={os.cpu_count()}")
    print(f"{'kind':<9} {'threads':>7} {'opendp s':>9} {'numpy s':>9} {'ratio':>8}")
    for kind, threads, vetted, baseline, ratio in rows:
        print(f"{kind:<9} {threads:>7} {vetted:>9.2f} {baseline:>9.4f} {ratio:>8.0f}x")


if __name__ == "__main__":
    main()
