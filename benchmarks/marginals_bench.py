"""Marginal-space releases of the bundled Adult data (issue 15): time, memory, accuracy, honesty.

Usage (from the repository root)::

    .venv/bin/python benchmarks/marginals_bench.py                  # 2-way and 3-way, 3 repeats
    .venv/bin/python benchmarks/marginals_bench.py --degrees 2 --repeats 5 --mechanism auto

For each degree k, the bundled ``flows/examples/adult-marginals.yaml`` (Adult's 14 attributes,
the private-pgm domain: 6.4·10¹⁷ cells) asks for all k-way marginals (one ``marginals`` item)
at ε = 1, with ``--mechanism`` (default ``marginal_space``; ``auto`` also plans every other
candidate), and one release runs in-process through ``pipeline_bench.release_stages`` (the
pipeline's stage functions, no Prefect: "beyond orchestration").  Stages are timed without
tracemalloc (it slows Python-heavy stages such as GX validation ~4×); memory is the process's
peak RSS so far, the figure the 2 GB target is about.

Accuracy, over ``--repeats`` more releases (each charges ε = 1 to a benchmark-only catalog; the
input is counted once): total squared error of all released tables against the true marginals,
against (a) the plan's predicted total variance and (b) the baseline of measuring each marginal
separately with Laplace noise at ε/K (K tables), both its expected value 2(K/ε)²·cells and one
draw made here.  std_error honesty: mean over cells of ((estimate − truth)/std_error)².  For the degrees in
``--pgm-degrees`` (default 2) each repeat also runs ``reconstruct: pgm`` on the same measurement
and compares its total squared error with least squares clipped at 0, with its smallest cell and
the largest disagreement between two tables' 1-way marginals: pgm's error is empirical, and this
simulation on the public Adult file is where it is measured.  ``--validation-baseline`` also
times one GX suite per table (the pipeline before batching) against the batched validation on
the same released tables.  The true marginals are computed here
from the public example file, for the benchmark only.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import pipeline_bench  # noqa: E402  (a sibling script)

EXAMPLE = ROOT / "flows" / "examples" / "adult-marginals.yaml"
EPSILON = 1.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def timed(function: Callable[[], Any]) -> tuple[Any, float, float]:
    """(value, wall seconds, peak RSS MB so far): ``pipeline_bench.measured`` without tracing."""
    started = time.perf_counter()
    value = function()
    return value, time.perf_counter() - started, peak_rss_mb()


def adult_marginals_spec(home: Path, degree: int, mechanism: str) -> Path:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["dataset"].update(id="bench-adult-marginals", source=str(pipeline_bench.ADULT))
    body["dataset"]["budget"] = {"epsilon": 1000}
    body["workload"] = [{"name": "m", "marginals": {"attributes": "all", "degree": degree}}]
    body.update(mechanism=mechanism, privacy={"epsilon": EPSILON})
    return pipeline_bench.write_spec(home, f"{body.pop('name')}-{degree}way", body)


def true_marginals(workload: Any, names: list[str]) -> dict[str, np.ndarray]:
    """Exact marginal counts of the public example file, per workload item (benchmark only)."""
    from dprelease.mechanisms.marginal_space import axes_of, item_subset

    data = pq.read_table(pipeline_bench.ADULT, columns=names)
    codes = [data[name].to_numpy().astype(np.int64) for name in names]
    shape = workload.domain_shape
    truth = {}
    for item in workload.items:
        axes = axes_of(item_subset(item), len(shape))
        sizes = tuple(shape[a] for a in axes)
        flat = np.ravel_multi_index(tuple(codes[a] for a in axes), sizes)
        truth[item.name] = np.bincount(flat, minlength=math.prod(sizes)).astype(np.float64)
    return truth


def run_case(
    home: Path,
    degree: int,
    *,
    repeats: int,
    mechanism: str,
    pgm: bool,
    validation_baseline: bool = False,
) -> None:
    from dprelease.catalog import release
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import load_spec

    spec_path = adult_marginals_spec(home, degree, mechanism)
    pipeline_bench.measured = timed  # the stage runner's timer, without tracemalloc
    # identity cannot plan 6.4e17 cells (plan-only), so the plan stage has no baseline here
    pipeline_bench.baseline_identity_plan = lambda _path: 0.0
    rows = pipeline_bench.release_stages(spec_path, home)
    run_seconds = sum(row[1] for row in rows)
    peak_rss = peak_rss_mb()
    spec = load_spec(spec_path)
    plan = make_plan(spec)  # the strategy store's copy of the plan just timed
    workload = plan.workload
    k = len(workload.items)
    pipeline_bench.print_rows(
        f"run: all {degree}-way marginals of Adult ({k} tables, {workload.num_queries:,} cells; "
        f"{plan.strategy.num_queries:,} noisy answers over {len(plan.strategy.marginal_subsets)} "
        f"marginals); peak MB = process peak RSS so far",
        rows,
    )
    catalog = Catalog(f"sqlite:///{home / 'bench-catalog.db'}")
    ingested = release.ingest(spec, plan, catalog)
    truth = true_marginals(workload, list(spec.domain))
    cells = sum(t.size for t in truth.values())
    predicted = plan.candidate(plan.chosen).total_variance or math.nan
    errors, honesty, pgm_rows = [], [], []
    for _ in range(repeats):
        release_id = release.new_release_id(spec)
        release.register(spec, plan, catalog, release_id=release_id)
        measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
        tables = release.reconstruct(spec, plan, measurement)
        squared, z2 = 0.0, 0.0
        for name, table in tables.items():
            diff = table["estimate"].to_numpy() - truth[name]
            squared += float(diff @ diff)
            z2 += float(np.sum((diff / table["std_error"].to_numpy()) ** 2))
        errors.append(squared)
        honesty.append(z2 / cells)
        if pgm:
            least_squares = {name: t["estimate"].to_numpy() for name, t in tables.items()}
            pgm_rows.append(pgm_figures(plan, measurement, least_squares, truth))
    rng = np.random.default_rng(2026)  # benchmark-only baseline draw, never released
    separate_expected = 2 * (k / EPSILON) ** 2 * cells
    separate_draw = float(np.sum(rng.laplace(0.0, k / EPSILON, size=cells) ** 2))
    observed = float(np.mean(errors)) if errors else math.nan  # --repeats 0: timing only
    print(f"\n## accuracy, all {degree}-way marginals, epsilon = {EPSILON:g}, {repeats} releases")
    print(f"{'figure':<58} {'value':>14} {'target':>16} {'ratio':>8}")
    table_rows = [
        (
            "run seconds (stages above, no orchestration)",
            run_seconds,
            "<= 60 s (2-way), 300 s (3-way)",
            None,
        ),
        ("peak RSS of the process, MB", peak_rss, "<= 2048 MB", None),
        (
            "separate Laplace at eps/K: expected total sq. error",
            separate_expected,
            "baseline",
            None,
        ),
        (
            "separate Laplace at eps/K: one draw",
            separate_draw,
            "",
            separate_draw / separate_expected,
        ),
        ("plan's predicted total variance", predicted, "", predicted / separate_expected),
        (
            "observed total sq. error (mean of releases)",
            observed,
            "<= 0.5 x baseline",
            observed / separate_expected,
        ),
        ("observed / predicted", observed / predicted, "within 5%", None),
        (
            "mean ((estimate - truth)/std_error)^2, per release",
            float(np.mean(honesty)) if honesty else math.nan,
            "[0.8, 1.25]",
            None,
        ),
    ]
    for name, value, target, ratio in table_rows:
        shown = f"{ratio:8.3f}" if ratio is not None else f"{'':>8}"
        print(f"{name:<58} {value:14.6g} {target:>16} {shown}")
    print(f"{'  per release: total sq. error':<58} " + ", ".join(f"{e:.5g}" for e in errors))
    print(f"{'  per release: mean z^2':<58} " + ", ".join(f"{h:.4f}" for h in honesty))
    if pgm_rows:
        print_pgm(pgm_rows, degree=degree)
    if validation_baseline and repeats:
        compare_validation(tables, plan.item_queries, home / f"validation-{degree}")


def compare_validation(tables: dict[str, Any], expected: dict[str, int], folder: Path) -> None:
    """Batched validation (the pipeline's: one suite over per-table figures) against one GX
    suite per table (the baseline, the pipeline before batching), on the same released tables.
    GX is imported first."""
    from dprelease.catalog.validation import checks as validation
    from dprelease.catalog.validation.gx import run_suites

    run_suites([])  # import GX and build one context outside the timings
    started = time.perf_counter()
    batched = validation.validate_tables(tables, expected_rows=expected, directory=folder / "b")
    batched_seconds = time.perf_counter() - started
    started = time.perf_counter()
    jobs = [
        (
            name,
            table.to_pandas(),
            validation.table_expectations(table, expected_rows=expected[name]),
        )
        for name, table in tables.items()
    ]
    per_table = run_suites(jobs, docs_dir=folder / "p" / "docs")
    per_table_seconds = time.perf_counter() - started
    print(f"\n## validation of {len(tables)} tables: batched suites vs one suite per table")
    print(f"{'figure':<58} {'value':>14} {'target':>16} {'ratio':>8}")
    print(
        f"{'one suite per table (baseline), seconds':<58} {per_table_seconds:14.4g} {'':>16} {1:8.3f}"
    )
    print(
        f"{'batched (1 suite over per-table figures), seconds':<58} {batched_seconds:14.4g} {'':>16} "
        f"{batched_seconds / per_table_seconds:8.3f}"
    )
    agree = batched["success"] == all(summary["success"] for summary in per_table.values())
    print(f"{'both verdicts agree':<58} {agree!s:>14}")


def pgm_figures(
    plan: Any, measurement: Any, least_squares: dict[str, np.ndarray], truth: dict[str, np.ndarray]
) -> dict[str, float]:
    """``reconstruct: pgm`` on the same measurement as least squares: total squared errors of
    least squares, least squares clipped at 0 and pgm; pgm's seconds, smallest cell and largest
    disagreement between two tables' 1-way marginals (the benchmark's truth: public data)."""
    from dprelease.mechanisms.marginal_space import axes_of, item_subset

    workload = plan.workload
    started = time.perf_counter()
    model = measurement.strategy.consistent(measurement.values, workload)
    seconds = time.perf_counter() - started
    shape = workload.domain_shape
    one_way: dict[int, list[np.ndarray]] = {}
    figures = {"least squares": 0.0, "least squares + clip": 0.0, "pgm": 0.0}
    lowest = np.inf
    for item in workload.items:
        axes = axes_of(item_subset(item), len(shape))
        table = model.marginal(item_subset(item))
        lowest = min(lowest, float(table.min()))
        for k, axis in enumerate(axes):
            one_way.setdefault(axis, []).append(
                table.sum(axis=tuple(j for j in range(len(axes)) if j != k))
            )
        exact = truth[item.name]
        figures["least squares"] += float(np.sum((least_squares[item.name] - exact) ** 2))
        figures["least squares + clip"] += float(
            np.sum((np.maximum(least_squares[item.name], 0.0) - exact) ** 2)
        )
        figures["pgm"] += float(np.sum((table.ravel() - exact) ** 2))
    disagreement = max(float(np.max(np.abs(m - ms[0]))) for ms in one_way.values() for m in ms[1:])
    return figures | {
        "seconds": seconds,
        "iterations": float(model.iterations),
        "lowest cell": lowest,
        "1-way disagreement": disagreement,
    }


def print_pgm(rows: list[dict[str, float]], *, degree: int) -> None:
    def mean(key: str) -> float:
        return float(np.mean([row[key] for row in rows]))

    clip = mean("least squares + clip")
    print(f"\n## reconstruct: pgm on the same measurements, all {degree}-way marginals")
    print(f"{'figure':<58} {'value':>14} {'target':>16} {'ratio':>8}")
    table_rows = [
        ("least squares: total sq. error (mean)", mean("least squares"), "", None),
        ("least squares + clip at 0: total sq. error", clip, "baseline", 1.0),
        ("pgm: total sq. error", mean("pgm"), "<= baseline", mean("pgm") / clip),
        ("pgm: smallest cell of any table", min(r["lowest cell"] for r in rows), ">= 0", None),
        (
            "pgm: largest 1-way disagreement between tables",
            max(r["1-way disagreement"] for r in rows),
            "<= 1e-6",
            None,
        ),
        ("pgm: seconds per reconstruction (mean)", mean("seconds"), "", None),
        ("pgm: ADMM iterations (mean)", mean("iterations"), "", None),
    ]
    for name, value, target, ratio in table_rows:
        shown = f"{ratio:8.3f}" if ratio is not None else f"{'':>8}"
        print(f"{name:<58} {value:14.6g} {target:>16} {shown}")
    print(
        f"{'  per release: pgm / (LS + clip)':<58} "
        + ", ".join(f"{r['pgm'] / r['least squares + clip']:.3f}" for r in rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degrees", default="2,3", help="comma-separated marginal degrees")
    parser.add_argument("--repeats", type=int, default=3, help="releases for the accuracy figures")
    parser.add_argument("--mechanism", default="marginal_space", help="the spec's mechanism")
    parser.add_argument(
        "--pgm-degrees",
        default="2",
        help="degrees whose repeats also run reconstruct: pgm on the same measurements",
    )
    parser.add_argument(
        "--validation-baseline",
        action="store_true",
        help="also time one GX suite per table on the same tables (minutes for 364 tables)",
    )
    options = parser.parse_args()
    pgm_degrees = {int(part) for part in options.pgm_degrees.split(",") if part}
    with tempfile.TemporaryDirectory(prefix="dprelease-marginals-bench-") as tmp:
        home = Path(tmp)
        os.environ["DPRELEASE_HOME"] = str(home / "state")
        for degree in (int(part) for part in options.degrees.split(",") if part):
            run_case(
                home,
                degree,
                repeats=options.repeats,
                mechanism=options.mechanism,
                pgm=degree in pgm_degrees,
                validation_baseline=options.validation_baseline,
            )


if __name__ == "__main__":
    main()
