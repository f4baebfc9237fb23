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
draw made here.  std_error honesty: mean over cells of ((estimate − truth)/std_error)².  The
true marginals are computed here from the public example file, for the benchmark only.
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
    from mechanisms.marginal_space import axes_of, item_subset

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


def run_case(home: Path, degree: int, *, repeats: int, mechanism: str) -> None:
    from catalog import release
    from catalog.ledger import Catalog
    from catalog.planning import make_plan
    from catalog.spec import load_spec

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
    errors, honesty = [], []
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
    rng = np.random.default_rng(2026)  # benchmark-only baseline draw, never released
    separate_expected = 2 * (k / EPSILON) ** 2 * cells
    separate_draw = float(np.sum(rng.laplace(0.0, k / EPSILON, size=cells) ** 2))
    observed = float(np.mean(errors))
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
            float(np.mean(honesty)),
            "[0.8, 1.25]",
            None,
        ),
    ]
    for name, value, target, ratio in table_rows:
        shown = f"{ratio:8.3f}" if ratio is not None else f"{'':>8}"
        print(f"{name:<58} {value:14.6g} {target:>16} {shown}")
    print(f"{'  per release: total sq. error':<58} " + ", ".join(f"{e:.5g}" for e in errors))
    print(f"{'  per release: mean z^2':<58} " + ", ".join(f"{h:.4f}" for h in honesty))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degrees", default="2,3", help="comma-separated marginal degrees")
    parser.add_argument("--repeats", type=int, default=3, help="releases for the accuracy figures")
    parser.add_argument("--mechanism", default="marginal_space", help="the spec's mechanism")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dprelease-marginals-bench-") as tmp:
        home = Path(tmp)
        os.environ["DPRELEASE_HOME"] = str(home / "state")
        for degree in (int(part) for part in options.degrees.split(",") if part):
            run_case(home, degree, repeats=options.repeats, mechanism=options.mechanism)


if __name__ == "__main__":
    main()
