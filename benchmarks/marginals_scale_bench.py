"""One `dprelease run` of all 1–3-way marginals of many attributes (issue 28's run done-when).

Synthetic data (``--rows``, default 1,000,000, over ``--attributes``, default 30, of 10 values
each) from a seeded Markov chain along the attributes: public randomness, the bench's own data,
so the true marginals may be computed here to measure the error (never done by the product).
The spec asks for every 1-, 2- and 3-way marginal (``marginals`` items) at ρ = 0.5 with
``mechanism: marginal_space`` (at 30 attributes: 4,525 tables, 10³⁰ cells).

Measured, each in the same run:

* ``dprelease run SPEC`` as a whole process on a fresh state home (the shared Prefect server it
  starts is stopped afterwards): wall seconds and the peak RSS of the run process (its waited-for
  children included; the detached server is not);
* the floor of its reading: pyarrow ``group_by`` of every domain column of the same Parquet file,
  in this process (the ratio column is the run over it);
* observed against predicted error: every released cell's estimate against the true marginal,
  mean squared error over all released cells, over the plan's mean predicted variance (the
  manifest's per-table standard errors weighted by table cells) — target within 5 %;
* the report: ``loadEventEnd`` of ``report.html`` in headless Chromium (target < 3,000 ms)
  against a one-paragraph page (the browser's floor).

Usage::

    .venv/bin/python benchmarks/marginals_scale_bench.py                       # 30 attributes
    .venv/bin/python benchmarks/marginals_scale_bench.py --attributes 12 --rows 100000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.flows.chromium import Browser  # noqa: E402

CLI = Path(sys.executable).parent / "dprelease"
VALUES = 10
DEGREES = (1, 2, 3)
STAY = 0.7  # the chance an attribute copies the previous one: correlated, not independent


def write_data(path: Path, *, attributes: int, rows: int, seed: int) -> None:
    """A Markov chain along the attributes, 10 values each (public randomness). O(rows × d)."""
    rng = np.random.default_rng(seed)
    value = rng.integers(0, VALUES, rows)
    columns = {}
    for i in range(attributes):
        fresh = rng.integers(0, VALUES, rows)
        value = np.where(rng.random(rows) < STAY, value, fresh)
        columns[f"a{i:02d}"] = pa.array(value.astype(np.int8))
    pq.write_table(pa.table(columns), path)


def write_spec(folder: Path, data: Path, *, attributes: int, reconstruct: str) -> Path:
    spec = {
        "name": f"scale{attributes}",
        "dataset": {"id": f"scale{attributes}", "source": str(data), "budget": {"rho": 10.0}},
        "domain": {f"a{i:02d}": {"min": 0, "max": VALUES - 1} for i in range(attributes)},
        "workload": [
            {"name": f"way{k}", "marginals": {"attributes": "all", "degree": k}} for k in DEGREES
        ],
        "mechanism": "marginal_space",
        "privacy": {"rho": 0.5},
        "reconstruct": reconstruct,
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def group_by_seconds(data: Path) -> float:
    started = time.perf_counter()
    table = pq.read_table(data)
    table.group_by(table.column_names).aggregate([([], "count_all")])
    return time.perf_counter() - started


def run_release(spec: Path, home: Path) -> tuple[float, float, Path]:
    """(wall seconds, peak RSS MB of the run process, release directory)."""
    env = {**os.environ, "DPRELEASE_HOME": str(home), "PREFECT_HOME": str(home / "prefect")}
    env.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    started = time.perf_counter()
    done = subprocess.run(
        [str(CLI), "run", str(spec), "--out", str(home / "releases")],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    subprocess.run([str(CLI), "server", "stop"], env=env, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"dprelease run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    artifacts = [line for line in done.stdout.splitlines() if line.startswith("artifacts:")]
    return seconds, peak, Path(artifacts[0].split(":", 1)[1].strip())


def observed_over_predicted(directory: Path, data: Path) -> tuple[float, int, int]:
    """(mean squared error / mean predicted variance, tables, cells) over every released cell."""
    manifest = json.loads((directory / "manifest.json").read_text())
    std_errors = manifest["plan"]["item_std_errors"]
    rows = pq.read_table(data)
    codes = {name: rows[name].to_numpy().astype(np.int64) for name in rows.column_names}
    squared, predicted, cells, tables = 0.0, 0.0, 0, 0
    for name, std_error in std_errors.items():
        released = pq.read_table(directory / "tables" / f"{name}.parquet")
        axes = [c for c in released.column_names if c in codes]
        sizes = tuple(VALUES for _ in axes)
        if axes:
            flat = np.ravel_multi_index(tuple(codes[a] for a in axes), sizes)
            truth = np.bincount(flat, minlength=VALUES ** len(axes)).astype(float)
            order = np.ravel_multi_index(
                tuple(released[a].to_numpy().astype(np.int64) for a in axes), sizes
            )
            truth = truth[order]
        else:
            truth = np.array([float(rows.num_rows)])
        estimate = released["estimate"].to_numpy()
        squared += float(np.sum((estimate - truth) ** 2))
        predicted += std_error**2 * estimate.size
        cells += estimate.size
        tables += 1
    return squared / predicted, tables, cells


def report_load_ms(page: Path) -> float:
    with Browser(offline=True) as browser:
        browser.open(page, timeout=300)
        entry = browser.evaluate(
            "JSON.stringify(performance.getEntriesByType('navigation')[0].toJSON())"
        )
        return float(json.loads(entry)["loadEventEnd"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attributes", type=int, default=30)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument(
        "--reconstruct",
        choices=("least_squares", "pgm"),
        default="least_squares",
        help="pgm: consistent, non-negative tables (its error is empirical: the MSE ratio then "
        "compares it with least squares' predicted variance)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dprelease-scale-") as scratch:
        folder = Path(scratch)
        data = folder / "data.parquet"
        write_data(data, attributes=args.attributes, rows=args.rows, seed=args.seed)
        spec = write_spec(folder, data, attributes=args.attributes, reconstruct=args.reconstruct)
        tables = sum(len(list(itertools.combinations(range(args.attributes), k))) for k in DEGREES)
        print(
            f"{args.attributes} attributes × {VALUES} values, {args.rows:,} rows, "
            f"all {'/'.join(map(str, DEGREES))}-way marginals ({tables:,} tables), ρ = 0.5, "
            f"reconstruct: {args.reconstruct}"
        )
        floor = group_by_seconds(data)
        seconds, peak_mb, directory = run_release(spec, folder / "home")
        ratio, released, cells = observed_over_predicted(directory, data)
        blank = folder / "blank.html"
        blank.write_text("<!doctype html><title>blank</title><p>blank</p>")
        floor_ms, load_ms = report_load_ms(blank), report_load_ms(directory / "report.html")
        size_mb = (directory / "report.html").stat().st_size / 2**20
        print(f"{'measure':46s} {'value':>14s} {'baseline':>14s} {'ratio':>8s} target")
        print(
            f"{'dprelease run, wall s (vs pyarrow group_by)':46s} {seconds:14.1f} {floor:14.2f} "
            f"{seconds / floor:8.1f} <= 600 s"
        )
        print(f"{'peak RSS of the run process, MB':46s} {peak_mb:14.0f} {'':14s} {'':8s} <= 8192")
        print(
            f"{'observed MSE / predicted variance':46s} {ratio:14.4f} {1.0:14.4f} {ratio:8.4f} "
            f"within 5% ({released:,} tables, {cells:,} cells)"
        )
        print(
            f"{'report.html load ms (vs a blank page)':46s} {load_ms:14.0f} {floor_ms:14.0f} "
            f"{load_ms / floor_ms:8.1f} < 3000 ({size_mb:.1f} MB)"
        )


if __name__ == "__main__":
    main()
