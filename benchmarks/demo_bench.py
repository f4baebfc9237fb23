"""`dprelease demo` wall time on fresh state homes, and the same pipeline's stages timed one by one.

Usage: .venv/bin/python benchmarks/demo_bench.py [--runs 5]

Each run is a whole ``dprelease demo`` process on a new state home (it starts the shared Prefect
server and the validation service; the server is stopped after the run).  The machine's one-thread
DGEMM speed is measured before and after, against the constant the predictors assume: on this
shared 2-core host a load factor well above 1 means every wall time is inflated by about as much.
The stage split calls the stage functions directly (no Prefect), so the difference between the
two totals is Prefect's overhead (server start-up, task runs) and the imports.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import threadpoolctl
from predict_bench import machine_speed

from dprelease.mechanisms.primitives import compute_limits

CLI = Path(sys.executable).parent / "dprelease"


def demo_once(home: Path) -> float:
    """Seconds of one ``dprelease demo`` on a fresh state home under ``home``."""
    env = dict(os.environ, DPRELEASE_HOME=str(home / "state"))
    started = time.perf_counter()
    try:
        subprocess.run(
            [str(CLI), "demo", "--out", str(home / "out")], check=True, env=env, capture_output=True
        )
        return time.perf_counter() - started
    finally:
        subprocess.run([str(CLI), "server", "stop"], env=env, capture_output=True, check=False)


def load_factor() -> float:
    with threadpoolctl.threadpool_limits(limits=1):
        return compute_limits.DGEMM_FLOPS_PER_SECOND / machine_speed()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="demo runs, each on a fresh home")
    options = parser.parse_args()
    factor_before = load_factor()
    with tempfile.TemporaryDirectory(prefix="dprelease-bench-") as tmp:
        runs = [demo_once(Path(tmp) / f"run-{i}") for i in range(options.runs)]
        factor_after = load_factor()
        print(
            f"machine load factor (DGEMM assumed / measured): {factor_before:.2f} before, "
            f"{factor_after:.2f} after"
        )
        print(
            "dprelease demo (subprocess, fresh state, incl. imports and Prefect server): "
            + ", ".join(f"{seconds:.1f}" for seconds in runs)
            + f" s; median {statistics.median(runs):.1f} s"
        )
        demo_seconds = statistics.median(runs)
        home = Path(tmp) / f"run-{options.runs - 1}"  # its strategy store is warm
        os.environ["DPRELEASE_HOME"] = str(home / "state")
        stages: list[tuple[str, float]] = []

        def timed(name: str, function):
            begin = time.perf_counter()
            value = function()
            stages.append((name, time.perf_counter() - begin))
            return value

        import great_expectations  # noqa: F401  (import cost shown separately)

        from dprelease.catalog import release
        from dprelease.catalog.ledger.store import Catalog
        from dprelease.catalog.planning.planner import make_plan
        from dprelease.catalog.spec.load import load_spec
        from dprelease.flows.cli.release import bundled_spec

        catalog = Catalog()
        spec = timed("load spec", lambda: load_spec(bundled_spec()))
        plan = timed("plan (candidates + SVD bound; store warm)", lambda: make_plan(spec))
        release_id = release.new_release_id(spec)
        before = timed(
            "check budget + register",
            lambda: release.register(spec, plan, catalog, release_id=release_id),
        )
        counted = timed(
            "ingest (read + input checks + count)", lambda: release.ingest(spec, plan, catalog)
        )
        measurement = timed(
            "measure (charge + OpenDP noise)",
            lambda: release.measure(counted, spec, plan, catalog, release_id=release_id),
        )
        tables = timed("reconstruct", lambda: release.reconstruct(spec, plan, measurement))
        directory = release.release_directory(home / "out2", release_id)
        validation = timed(
            "validate (GX + Data Docs)", lambda: release.validate(tables, plan, directory=directory)
        )
        timed(
            "stage (report + manifest)",
            lambda: release.stage(
                spec=spec,
                plan=plan,
                release_id=release_id,
                directory=directory,
                ingested=counted,
                measurement=measurement,
                tables=tables,
                validation=validation,
                spent_before=before,
                catalog=catalog,
            ),
        )
    total = sum(seconds for _, seconds in stages)
    print(f"{'stage (in-process, no Prefect)':<38} {'seconds':>8} {'share':>6}")
    for name, seconds in stages:
        print(f"{name:<38} {seconds:>8.2f} {seconds / total:>6.0%}")
    print(f"{'sum of stages':<38} {total:>8.2f}")
    print(f"{'Prefect + imports overhead (median run)':<38} {demo_seconds - total:>8.2f}")


if __name__ == "__main__":
    main()
