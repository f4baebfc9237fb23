"""`dprelease demo` wall time, and the same pipeline's stages timed one by one (same run).

Usage: .venv/bin/python benchmarks/demo_bench.py
The stage split calls the stage functions directly (no Prefect), so the difference between the
two totals is Prefect's overhead (temporary server start-up, task runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dprelease-bench-") as home:
        env = dict(os.environ, DPRELEASE_HOME=str(Path(home) / "state"))
        os.environ.update(env)
        started = time.perf_counter()
        subprocess.run(
            [
                str(Path(sys.executable).parent / "dprelease"),
                "demo",
                "--out",
                str(Path(home) / "out"),
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        demo_seconds = time.perf_counter() - started

        stages: list[tuple[str, float]] = []

        def timed(name: str, function):
            begin = time.perf_counter()
            value = function()
            stages.append((name, time.perf_counter() - begin))
            return value

        import great_expectations  # noqa: F401  (import cost shown separately)

        from catalog import release
        from catalog.ledger import Catalog
        from catalog.planning import make_plan
        from catalog.spec import load_spec
        from flows.cli import bundled_spec

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
        directory = release.release_directory(Path(home) / "out2", release_id)
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
    print(
        f"dprelease demo (subprocess, fresh state, incl. imports and Prefect server): {demo_seconds:.1f} s"
    )
    print(f"{'stage (in-process, no Prefect)':<38} {'seconds':>8} {'share':>6}")
    for name, seconds in stages:
        print(f"{name:<38} {seconds:>8.2f} {seconds / total:>6.0%}")
    print(f"{'sum of stages':<38} {total:>8.2f}")
    print(f"{'Prefect + imports overhead':<38} {demo_seconds - total:>8.2f}")


if __name__ == "__main__":
    main()
