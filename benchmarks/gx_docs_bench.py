"""Output validation with Data Docs: CPU per release's validation in one long-lived process (the
validation service, a worker), with every Jinja template compiled on every build (what GX's own
views do) and with ``catalog/validation/docs_views.py``'s shared compiled templates.

The baseline empties the shared cache before each build, so each build compiles every template,
as GX's views do; the first build of each kind is a warm-up (GX's import, its first context).
The workload is a small release's: ``--suites`` suites of a 50-row table, two expectations each.
Usage (from the repository root)::

    .venv/bin/python benchmarks/gx_docs_bench.py --builds 8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from count_bench import median_rows, print_table  # benchmarks/ is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dprelease.catalog.validation import docs_views
from dprelease.catalog.validation.gx import Jobs, run_suites_here


def jobs(suites: int, rng: np.random.Generator) -> Jobs:
    frame = pd.DataFrame({"cell": np.arange(50), "estimate": rng.normal(size=50)})
    checks = [
        ("expect_column_values_to_not_be_null", {"column": "estimate"}),
        ("expect_table_row_count_to_equal", {"value": 50}),
    ]
    return [(f"table_{k}", frame, checks) for k in range(suites)]


def cpu_per_build(
    work: Jobs, *, builds: int, before: Callable[[], None], docs: bool
) -> list[float]:
    seconds = []
    for _ in range(builds + 1):  # + the warm-up
        before()
        with tempfile.TemporaryDirectory(prefix="gx-docs-bench-") as folder:
            started = time.process_time()
            run_suites_here(work, docs_dir=Path(folder) if docs else None)
            seconds.append(time.process_time() - started)
    return seconds[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=8)
    parser.add_argument("--suites", type=int, default=2)
    args = parser.parse_args()
    if args.builds < 1 or args.suites < 1:
        raise SystemExit(f"--builds ({args.builds}) and --suites ({args.suites}) must be >= 1")
    work = jobs(args.suites, np.random.default_rng(7))  # public randomness: synthetic figures
    results = {
        "no Data Docs": cpu_per_build(work, builds=args.builds, before=lambda: None, docs=False),
        "Data Docs, templates compiled each build (GX's views)": cpu_per_build(
            work, builds=args.builds, before=docs_views.COMPILED.clear, docs=True
        ),
        "Data Docs, compiled templates shared": cpu_per_build(
            work, builds=args.builds, before=lambda: None, docs=True
        ),
    }
    baseline = "Data Docs, templates compiled each build (GX's views)"
    rows = median_rows(results, baseline=baseline, digits=3)
    print(f"validation of {args.suites} suite(s), CPU s per build, median of {args.builds}")
    print_table(["validation", "CPU s", "range", "vs compiling each build"], rows)


if __name__ == "__main__":
    main()
