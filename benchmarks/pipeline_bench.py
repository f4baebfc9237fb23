"""Where a release's time and memory go: every stage against its baseline, measured in the same run.

Usage:
    .venv/bin/python benchmarks/pipeline_bench.py                # all cases, 10M-row counting
    .venv/bin/python benchmarks/pipeline_bench.py --rows 100000000 --cases count
    .venv/bin/python benchmarks/pipeline_bench.py --cases adult,plan256 --skip-cli

Cases (issue 14's table): ``adult`` identity release of Adult age × education (1,360 cells);
``rows`` identity release of generated rows × 3 columns (100k cells); ``plan256`` / ``plan1024``
plan of all ranges n with Laplace noise and ``mechanism: optimized``; ``planid`` auto plan of an
identity workload; ``lrm`` plan of LRM at the largest size auto allows; ``count`` counting alone.

Each stage runs in-process through the stage functions (no Prefect) and prints seconds, peak
peak memory (the process's peak RSS, reset before each stage) and the ratio to its baseline: pyarrow
read + group_by for ingest, the identity strategy for planning, numpy's Laplace sampler for noise.
Unless ``--skip-cli``, the whole ``dprelease run`` is then timed as a user sees it, on a fresh
state home (cold) and again with the local Prefect server already running (warm).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT / "flows" / "examples" / "adult.parquet"
CLI = Path(sys.executable).parent / "dprelease"


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` 5), so each stage gets its own peak."""
    with contextlib.suppress(OSError):  # not Linux, or not permitted: peaks then accumulate
        Path("/proc/self/clear_refs").write_text("5")


def measured(function: Callable[[], Any]) -> tuple[Any, float, float]:
    """(value, seconds, peak RSS MB of the whole process) of one call.

    Peak RSS, not tracemalloc: tracing every allocation slowed the stages it measured by up to 3×.
    """
    _reset_peak_rss()
    started = time.perf_counter()
    value = function()
    seconds = time.perf_counter() - started
    return value, seconds, _peak_rss_mb()


def write_spec(home: Path, name: str, body: dict[str, Any]) -> Path:
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **body}))
    return path


def adult_spec(home: Path) -> Path:
    return write_spec(
        home,
        "bench-adult",
        {
            "dataset": {"id": "bench-adult", "source": str(ADULT), "budget": {"epsilon": 1000}},
            "domain": {"age": {"min": 0, "max": 84}, "education-num": {"min": 0, "max": 15}},
            "workload": [{"name": "age_by_education", "marginal": ["age", "education-num"]}],
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
        },
    )


def write_random_parquet(
    path: Path, rows: int, columns: dict[str, tuple[int, pa.DataType]], *, seed: int
) -> None:
    """``rows`` uniform integers in ``[0, high)`` per column, written in 2M-row batches (public
    randomness: synthetic benchmark data)."""
    rng = np.random.default_rng(seed)
    chunk = 2_000_000
    with pq.ParquetWriter(
        path, pa.schema([(name, kind) for name, (_, kind) in columns.items()])
    ) as writer:
        for start in range(0, rows, chunk):
            size = min(chunk, rows - start)
            writer.write_table(
                pa.table(
                    {
                        name: pa.array(rng.integers(0, high, size), kind)
                        for name, (high, kind) in columns.items()
                    }
                )
            )


def rows_spec(home: Path, rows: int) -> Path:
    path = home / f"rows-{rows}.parquet"
    if not path.exists():
        columns = {"a": (100, pa.int16()), "b": (100, pa.int16()), "c": (10, pa.int8())}
        write_random_parquet(path, rows, columns, seed=3)
    return write_spec(
        home,
        f"bench-rows-{rows}",
        {
            "dataset": {
                "id": f"bench-rows-{rows}",
                "source": str(path),
                "budget": {"epsilon": 1000},
            },
            "domain": {
                "a": {"min": 0, "max": 99},
                "b": {"min": 0, "max": 99},
                "c": {"min": 0, "max": 9},
            },
            "workload": [{"name": "cells", "marginal": ["a", "b", "c"]}],
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
        },
    )


def ranges_spec(home: Path, n: int, *, mechanism: str, workload: str = "all_ranges") -> Path:
    item = {"name": "w", workload: ["v"] if workload != "prefix" else "v"}
    return write_spec(
        home,
        f"bench-{workload}-{n}-{mechanism}",
        {
            "dataset": {"id": f"bench-{n}", "budget": {"epsilon": 1000}},
            "domain": {"v": {"min": 0, "max": n - 1}},
            "workload": [item],
            "mechanism": mechanism,
            "privacy": {"epsilon": 1.0},
        },
    )


def baseline_group_by(spec_path: Path) -> float:
    from dprelease.catalog.spec.load import load_spec

    spec = load_spec(spec_path)
    started = time.perf_counter()
    table = ds.dataset(spec.dataset.source).to_table(columns=list(spec.domain))
    table.group_by(list(spec.domain)).aggregate([([], "count_all")])
    return time.perf_counter() - started


def baseline_identity_plan(spec_path: Path) -> float:
    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import load_spec

    spec = load_spec(spec_path).model_copy(update={"mechanism": "identity"})
    started = time.perf_counter()
    make_plan(spec)
    return time.perf_counter() - started


def baseline_numpy_noise(size: int) -> float:
    rng = np.random.default_rng(0)  # baseline timing only, never released
    started = time.perf_counter()
    rng.laplace(size=size)
    return time.perf_counter() - started


def release_stages(spec_path: Path, home: Path) -> list[tuple[str, float, float, str, float]]:
    """(stage, seconds, peak MB, baseline name, baseline seconds) for one in-process release."""
    from dprelease.catalog import release
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import load_spec

    catalog = Catalog(f"sqlite:///{home / 'bench-catalog.db'}")
    rows: list[tuple[str, float, float, str, float]] = []
    spec, seconds, memory = measured(lambda: load_spec(spec_path))
    rows.append(("load spec", seconds, memory, "", 0.0))
    plan, seconds, memory = measured(lambda: make_plan(spec))
    rows.append(("plan", seconds, memory, "identity plan", baseline_identity_plan(spec_path)))
    release_id = release.new_release_id(spec)
    before, seconds, memory = measured(
        lambda: release.register(spec, plan, catalog, release_id=release_id)
    )
    rows.append(("check budget + register", seconds, memory, "", 0.0))
    ingested, seconds, memory = measured(lambda: release.ingest(spec, plan, catalog))
    rows.append(
        (
            "ingest (read, check, count)",
            seconds,
            memory,
            "pyarrow group_by",
            baseline_group_by(spec_path),
        )
    )
    measurement, seconds, memory = measured(
        lambda: release.measure(ingested, spec, plan, catalog, release_id=release_id)
    )
    rows.append(
        (
            "measure (charge + noise)",
            seconds,
            memory,
            "numpy laplace",
            baseline_numpy_noise(plan.strategy.num_queries),
        )
    )
    tables, seconds, memory = measured(lambda: release.reconstruct(spec, plan, measurement))
    rows.append(("reconstruct", seconds, memory, "", 0.0))
    directory = release.release_directory(home / "out", release_id)
    validation, seconds, memory = measured(
        lambda: release.validate(tables, plan, directory=directory)
    )
    rows.append(("validate (GX)", seconds, memory, "", 0.0))
    _, seconds, memory = measured(
        lambda: release.stage(
            spec=spec,
            plan=plan,
            release_id=release_id,
            directory=directory,
            ingested=ingested,
            measurement=measurement,
            tables=tables,
            validation=validation,
            spent_before=before,
            catalog=catalog,
        )
    )
    rows.append(("stage (manifest + report)", seconds, memory, "", 0.0))
    return rows


def plan_only(spec_path: Path) -> list[tuple[str, float, float, str, float]]:
    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import load_spec

    spec = load_spec(spec_path)
    plan, seconds, memory = measured(lambda: make_plan(spec))
    chosen = plan.candidate(plan.chosen)
    rows = [
        (
            f"plan cold ({plan.chosen}, rmse {chosen.rmse:.4g})",
            seconds,
            memory,
            "identity plan",
            baseline_identity_plan(spec_path),
        )
    ]
    _, seconds, memory = measured(lambda: make_plan(spec))
    rows.append(("plan warm (strategy store)", seconds, memory, "identity plan", rows[0][4]))
    return rows


def cli_run(spec_path: Path, *, state: Path) -> float:
    env = dict(os.environ, DPRELEASE_HOME=str(state))
    started = time.perf_counter()
    subprocess.run(
        [str(CLI), "run", str(spec_path), "--out", str(state / "out")],
        check=True,
        env=env,
        capture_output=True,
    )
    return time.perf_counter() - started


def stop_server(state: Path) -> None:
    env = dict(os.environ, DPRELEASE_HOME=str(state))
    subprocess.run([str(CLI), "server", "stop"], env=env, capture_output=True, check=False)


def print_rows(title: str, rows: list[tuple[str, float, float, str, float]]) -> None:
    print(f"\n## {title}")
    print(
        f"{'stage':<44} {'seconds':>8} {'peak MB':>8} {'baseline':>18} {'base s':>8} {'ratio':>7}"
    )
    for name, seconds, memory, base_name, base_seconds in rows:
        ratio = f"{seconds / base_seconds:7.2f}" if base_seconds > 0 else f"{'':>7}"
        base = f"{base_seconds:8.3f}" if base_seconds > 0 else f"{'':>8}"
        print(f"{name:<44} {seconds:8.3f} {memory:8.1f} {base_name:>18} {base} {ratio}")
    print(f"{'total':<44} {sum(r[1] for r in rows):8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--cases", default="adult,rows,plan256,plan1024,planid,lrm")
    parser.add_argument("--skip-cli", action="store_true")
    options = parser.parse_args()
    cases = options.cases.split(",")
    with tempfile.TemporaryDirectory(prefix="dprelease-bench-") as tmp:
        home = Path(tmp)
        os.environ["DPRELEASE_HOME"] = str(home / "state")
        specs = {}
        if "adult" in cases:
            specs["adult"] = adult_spec(home)
            print_rows(
                "run: identity, Adult age × education (1,360 cells)",
                release_stages(specs["adult"], home),
            )
        if "rows" in cases or "count" in cases:
            specs["rows"] = rows_spec(home, options.rows)
        if "rows" in cases:
            print_rows(
                f"run: identity, {options.rows:,} rows × 3 columns (100,000 cells)",
                release_stages(specs["rows"], home),
            )
        if "count" in cases:
            from dprelease.catalog.confidential.source import count_cells
            from dprelease.catalog.spec.load import load_spec

            spec = load_spec(specs["rows"])
            _, seconds, memory = measured(lambda: count_cells(spec))
            print_rows(
                f"count: {options.rows:,} rows",
                [
                    (
                        "count_cells",
                        seconds,
                        memory,
                        "pyarrow group_by",
                        baseline_group_by(specs["rows"]),
                    )
                ],
            )
        for case, n in (("plan256", 256), ("plan1024", 1024), ("plan4096", 4096)):
            if case in cases:
                print_rows(
                    f"plan: all ranges n={n}, Laplace, mechanism: optimized",
                    plan_only(ranges_spec(home, n, mechanism="optimized")),
                )
        if "planid" in cases:
            spec_path = write_spec(
                home,
                "bench-identity-auto",
                {
                    "dataset": {"id": "bench-id", "budget": {"epsilon": 1000}},
                    "domain": {"a": {"min": 0, "max": 84}, "b": {"min": 0, "max": 15}},
                    "workload": [{"name": "cells", "marginal": ["a", "b"]}],
                    "privacy": {"epsilon": 1.0},
                },
            )
            print_rows("plan: identity workload (1,360 cells), auto", plan_only(spec_path))
        if "lrm" in cases:
            print_rows(
                "plan: LRM at the largest size auto allows (prefix n=1024)",
                plan_only(ranges_spec(home, 1024, mechanism="lrm", workload="prefix")),
            )
        if options.skip_cli or "adult" not in specs:
            return
        state = home / "cli-state"
        try:
            cold = cli_run(specs["adult"], state=state)
            warm = [cli_run(specs["adult"], state=state) for _ in range(3)]
        finally:
            stop_server(state)
        print("\n## dprelease run (whole process, as a user sees it), Adult 1,360 cells")
        print(f"{'fresh state home (starts the local server)':<44} {cold:8.2f} s")
        print(f"{'warm (server running; median of 3)':<44} {float(np.median(warm)):8.2f} s")


if __name__ == "__main__":
    main()
