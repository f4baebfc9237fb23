"""Counting benchmark: ``catalog.confidential.source.count_cells`` against a bare pyarrow group-by on one file.

Generates a seeded synthetic Parquet file (default 10,000,000 rows x 3 integer columns: ``region``
int8 in 0..49, ``age`` int16 in 0..99, ``sex`` int8 in 0..1, so 10,000 distinct groups) in a
temporary folder, then measures in the same run, best of ``--repeats``:

* ``bare group_by``: ``pyarrow.dataset(file).to_table(columns).group_by(columns)
  .aggregate([([], "count_all")])`` (the baseline of every ratio);
* ``count_cells``: the pipeline's counting stage on a spec with the matching domain (read, schema
  checks, group-by, numpy cell mapping, null/out-of-domain checks on the distinct groups, and the
  ``ProtectedCells`` it returns).

A warm-up call of ``count_cells`` (not timed) warms imports and the page cache, so the timings are
of counting, not of imports or cold disk reads.

Usage (from the repository root)::

    .venv/bin/python benchmarks/count_bench.py                    # 10M rows, best of 3
    .venv/bin/python benchmarks/count_bench.py --rows 1000000     # quicker
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from dprelease.catalog.confidential import source
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec

COLUMNS = ("region", "age", "sex")
SEED = 20261122


def write_synthetic(path: Path, *, rows: int, rng: np.random.Generator) -> None:
    """Seeded synthetic data (public randomness only): O(rows)."""
    table = pa.table(
        {
            "region": pa.array(rng.integers(0, 50, rows, dtype=np.int8)),
            "age": pa.array(rng.integers(0, 100, rows, dtype=np.int16)),
            "sex": pa.array(rng.integers(0, 2, rows, dtype=np.int8)),
        }
    )
    pq.write_table(table, path, row_group_size=1_000_000)


def bench_spec(path: Path) -> ReleaseSpec:
    return parse_spec(
        {
            "name": "count-bench",
            "dataset": {"id": "bench", "source": str(path), "budget": {"epsilon": 1.0}},
            "domain": {
                "region": {"min": 0, "max": 49},
                "age": {"min": 0, "max": 99},
                "sex": {"values": [0, 1]},
            },
            "workload": [{"name": "all", "marginal": list(COLUMNS)}],
            "privacy": {"epsilon": 1.0},
        }
    )


def bare_group_by(path: Path) -> pa.Table:
    table = ds.dataset(str(path), format="parquet").to_table(columns=list(COLUMNS))
    return table.group_by(list(COLUMNS)).aggregate([([], "count_all")])


def timed(function: Callable[[], Any]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def median_rows(
    results: dict[str, list[float]], *, baseline: str, digits: int = 2
) -> list[list[str]]:
    """One row per label: median, range and the median's ratio to the ``baseline`` label's."""
    reference = statistics.median(results[baseline])
    return [
        [label, f"{statistics.median(s):.{digits}f}", f"{min(s):.{digits}f}-{max(s):.{digits}f}",
         f"{statistics.median(s) / reference:.2f}x"]
        for label, s in results.items()
    ]  # fmt: skip


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.rows < 1 or args.repeats < 1:
        raise SystemExit(f"--rows ({args.rows}) and --repeats ({args.repeats}) must be >= 1")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="count-bench-") as folder:
        path = Path(folder) / "synthetic.parquet"
        write_synthetic(path, rows=args.rows, rng=np.random.default_rng(SEED))
        generated = time.perf_counter() - started
        spec = bench_spec(path)
        size_mb = path.stat().st_size / 1e6

        groups = bare_group_by(path).num_rows  # warm-up: page cache
        source.count_cells(spec)  # warm-up (not timed)

        methods: dict[str, Callable[[], Any]] = {
            "bare group_by": lambda: bare_group_by(path),
            "count_cells": lambda: source.count_cells(spec),
        }
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(args.repeats):  # interleaved, so load changes hit every method alike
            for name, function in methods.items():
                times[name].append(timed(function))

    baseline = min(times["bare group_by"])
    print(
        f"{args.rows:,} rows x {len(COLUMNS)} columns, {groups:,} groups, {size_mb:.1f} MB Parquet "
        f"(generated and written in {generated:.2f} s); best of {args.repeats}, after a "
        "warm-up"
    )
    rows = [
        [
            name,
            f"{min(values):.3f}",
            f"{statistics.median(values):.3f}",
            f"{min(values) / baseline:.2f}x",
        ]
        for name, values in times.items()
    ]
    print_table(["method", "best s", "median s", "vs bare"], rows)
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
