"""Every data-independent mechanism on the seed papers' workloads, through `plan` (same run).

Each workload is written as a release spec with an explicit matrix item (`matrix: W.npy`), so the
numbers are exactly what `dprelease plan --json` reports: rmse per query at the privacy level,
the SVD lower bound, and the seconds each candidate took (including its optimisation; a fresh
strategy store per run, so nothing is cached).

Usage: .venv/bin/python benchmarks/mechanisms_bench.py [--n 256] [--m 128] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.spec.load import load_spec
from tests.reference.lrm import wdiscrete_workload, wrange_workload, wrelated_workload

MECHANISMS = ("identity", "hierarchical", "wavelet", "optimized", "eigen", "lrm")


def workloads(n: int, m: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "WDiscrete": wdiscrete_workload(m, n, rng=rng),
        "WRange": wrange_workload(m, n, rng=rng),
        "WRelated(s=m/8)": wrelated_workload(m, n, max(1, m // 8), rng=rng),
    }


def plan_for(folder: Path, name: str, matrix: np.ndarray, privacy: dict) -> dict:
    np.save(folder / f"{name}.npy", matrix)
    budget = {"epsilon": 100.0} if "epsilon" in privacy else {"rho": 100.0}
    spec = {
        "name": "bench",
        "dataset": {"id": "bench", "budget": budget},
        "domain": {"x": {"min": 0, "max": matrix.shape[1] - 1}},
        "workload": [{"name": "w", "matrix": f"{name}.npy", "attributes": ["x"]}],
        "mechanism": "auto",
        "privacy": privacy,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    started = time.perf_counter()
    plan = make_plan(load_spec(path))
    result = plan.to_json()
    result["plan_seconds"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--m", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)  # public randomness: the paper's random workloads
    privacy_levels = {"laplace eps=1": {"epsilon": 1.0}, "gaussian rho=0.5": {"rho": 0.5}}
    with tempfile.TemporaryDirectory() as home:
        os.environ["DPRELEASE_HOME"] = home
        folder = Path(home)
        print(
            f"n = {args.n} cells, m = {args.m} queries, seed = {args.seed}; rmse per query (ratio to identity)"
        )
        header = f"{'workload':<18} {'noise':<17} {'bound':>8} " + " ".join(
            f"{m:>18}" for m in MECHANISMS
        )
        print(header)
        for name, matrix in workloads(args.n, args.m, rng).items():
            for label, privacy in privacy_levels.items():
                plan = plan_for(folder, f"{name.split('(')[0]}-{label.split()[0]}", matrix, privacy)
                by_name = {c["mechanism"]: c for c in plan["candidates"]}
                identity = by_name["identity"]["rmse"]
                cells = []
                for mechanism in MECHANISMS:
                    c = by_name.get(mechanism, {})
                    if c.get("rmse") is None:
                        cells.append(f"{'n/a':>18}")
                    else:
                        cells.append(
                            f"{c['rmse']:>8.3f} ({c['rmse'] / identity:4.2f}) {c['seconds']:4.1f}s"
                        )
                bound = plan["lower_bound_rmse"]
                print(
                    f"{name:<18} {label:<17} {bound if bound else float('nan'):>8.3f} "
                    + " ".join(cells)
                )
        print(
            "cells: rmse (ratio to identity) seconds; 'n/a': not applicable (e.g. LRM is Laplace-only)"
        )


if __name__ == "__main__":
    main()
