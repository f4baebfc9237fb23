"""Counting on Dask (``engine: dask``, 2 worker processes) against single-process pyarrow.

Generates seeded synthetic hive-partitioned Parquet, file by file (O(rows per file) memory):
``region=R/part-K.parquet`` for 8 regions, 4 columns of 8 bytes each (``region`` int64 partition
key 0..7, ``age`` int64 0..99, ``sex`` int64 0..1, ``hours`` float64 in [0, 100) binned at
0/20/40/60/100), so ``rows × 32`` bytes in memory as Arrow.  Then measures, in the same run:

* ``pyarrow group_by``: ``pyarrow.dataset(dir).to_table(columns).group_by(columns)`` in this
  process (Arrow's own threads), grouping the raw float ``hours`` (about one group per row);
* ``pyarrow binned group_by``: the same with ``hours`` binned by numpy first (groups ≤ cells);
  the faster of the two pyarrow methods is the baseline of ``vs pyarrow``;
* ``count_cells local``: the local counting stage (``catalog.confidential.source.count_cells``);
* ``count_cells dask``: ``catalog.confidential.dask_count.count_cells_dask`` on a ``distributed.LocalCluster``
  of ``--workers`` single-threaded worker processes with ``--worker-memory`` each (the Dask nanny
  kills a worker that goes over), started once before timing.

Throughput is rows per second; ``vs pyarrow`` is throughput / the baseline's (target ≥ 0.8 on data
that fits in memory).  With ``--only-dask`` the in-process methods are skipped: the case whose
data is larger than the workers' memory (e.g. ``--rows 100000000 --worker-memory 2GB``); the peak
RSS of every worker (``ru_maxrss``) is printed, as is every count's agreement with the baseline.

With ``--marginals`` it measures instead the counting stage of issue 28's marginal run: the
measured subsets of all 1–3-way marginals of ``--attributes`` (default 30) attributes × 10 values
(4,525 tables and the total, 10³⁰ cells: no cell vector, no index over the domain) on ``--rows``
(default 1,000,000) rows of ``marginals_scale_bench``'s seeded Markov chain, split into
``--files`` Parquet files.  ``count_marginals`` (engine ``local``) and ``count_marginals_dask``
(a LocalCluster of ``--workers`` single-threaded workers) each run in a fresh spawned process, so
the peak RSS printed is that method's own (the driver's; the workers' apart), and so are the CPU
seconds (the process's and, for Dask, the workers' during the count: less sensitive than wall
time to other load on the machine).  The workers import dprelease before timing, as a
long-lived cluster would have.  The tables of both are checked identical, and their total equal
to the rows.

Usage (from the repository root)::

    .venv/bin/python benchmarks/dask_bench.py --rows 10000000          # fits in memory
    .venv/bin/python benchmarks/dask_bench.py --rows 100000000 --only-dask --repeats 1
    .venv/bin/python benchmarks/dask_bench.py --rows 100000000 --fast-baseline-only --repeats 2
    .venv/bin/python benchmarks/dask_bench.py --marginals                # 4,525 tables, 1M rows
"""

from __future__ import annotations

import argparse
import contextlib
import math
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from count_bench import print_table  # benchmarks/ is on sys.path when run as a script

from dprelease.catalog.confidential import source
from dprelease.catalog.confidential.dask_count import count_cells_dask
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec

SEED = 20261125
REGIONS = 8
COLUMNS = ("region", "age", "sex", "hours")
HOURS_EDGES = [0.0, 20.0, 40.0, 60.0, 100.0]


def write_synthetic(root: Path, *, rows: int, files_per_region: int) -> None:
    """Seeded synthetic data (public randomness only), one file at a time. O(rows)."""
    rng = np.random.default_rng(SEED)
    files = REGIONS * files_per_region
    for index in range(files):
        n = rows // files + (1 if index < rows % files else 0)
        folder = root / f"region={index % REGIONS}"
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.table(
            {
                "age": pa.array(rng.integers(0, 100, n, dtype=np.int64)),
                "sex": pa.array(rng.integers(0, 2, n, dtype=np.int64)),
                "hours": pa.array(rng.uniform(0.0, 100.0, n)),
            }
        )
        pq.write_table(table, folder / f"part-{index // REGIONS}.parquet", row_group_size=1 << 20)


def bench_spec(root: Path, address: str | None) -> ReleaseSpec:
    execution = {"engine": "dask", "address": address} if address else {"engine": "local"}
    return parse_spec(
        {
            "name": "dask-bench",
            "dataset": {"id": "bench", "source": str(root), "budget": {"epsilon": 1.0}},
            "domain": {
                "region": {"min": 0, "max": REGIONS - 1},
                "age": {"min": 0, "max": 99},
                "sex": {"values": [0, 1]},
                "hours": {"bins": HOURS_EDGES},
            },
            "workload": [{"name": "all", "marginal": list(COLUMNS)}],
            "privacy": {"epsilon": 1.0},
            "execution": execution,
        }
    )


def pyarrow_group_by(root: Path) -> pa.Table:
    partitioning = ds.partitioning(pa.schema([("region", pa.int64())]), flavor="hive")
    dataset = ds.dataset(str(root), format="parquet", partitioning=partitioning)
    table = dataset.to_table(columns=list(COLUMNS))
    return table.group_by(list(COLUMNS)).aggregate([([], "count_all")])


def pyarrow_binned_group_by(root: Path) -> pa.Table:
    """The stronger baseline: ``hours`` binned with numpy first, then Arrow groups small ints."""
    partitioning = ds.partitioning(pa.schema([("region", pa.int64())]), flavor="hive")
    dataset = ds.dataset(str(root), format="parquet", partitioning=partitioning)
    table = dataset.to_table(columns=list(COLUMNS))
    hours = table["hours"].to_numpy()
    binned = np.clip(np.searchsorted(HOURS_EDGES, hours, side="right") - 1, 0, 3)  # O(rows)
    table = table.set_column(3, "hours", pa.array(binned))
    return table.group_by(list(COLUMNS)).aggregate([([], "count_all")])


def true_cells(result: source.CountResult) -> np.ndarray:
    return vars(result.cells)["_ProtectedCells__cells"]  # benchmark on public synthetic data


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@contextlib.contextmanager
def local_cluster(args: argparse.Namespace) -> Iterator[tuple[Any, Any]]:
    """A LocalCluster of ``args.workers`` one-thread worker processes and a client of it."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            memory_limit=args.worker_memory,
            processes=True,
            dashboard_address=":0",  # a free port on host: never a clash with another run
            host="127.0.0.1",
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield cluster, client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, help="default 10,000,000 (--marginals: 1,000,000)")
    parser.add_argument("--files-per-region", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-memory", default="2GB")
    parser.add_argument("--repeats", type=int, help="default 3 (--marginals: 1)")
    parser.add_argument("--only-dask", action="store_true", help="skip the in-process methods")
    parser.add_argument(
        "--fast-baseline-only",
        action="store_true",
        help="of the in-process methods run only the binned pyarrow baseline (large --rows)",
    )
    parser.add_argument("--data-dir", type=Path, help="keep/reuse the generated data here")
    parser.add_argument(
        "--marginals",
        action="store_true",
        help="count the measured marginals of all 1-3-way tables (local vs dask); --rows "
        "defaults to 1,000,000 and --repeats to 1 then",
    )
    parser.add_argument("--attributes", type=int, default=30, help="with --marginals")
    parser.add_argument("--files", type=int, default=4, help="with --marginals")
    args = parser.parse_args()
    if args.marginals:
        marginals_main(args)
        return
    args.rows = 10_000_000 if args.rows is None else args.rows
    args.repeats = 3 if args.repeats is None else args.repeats
    if min(args.rows, args.files_per_region, args.workers, args.repeats) < 1:
        raise SystemExit("--rows, --files-per-region, --workers and --repeats must be >= 1")

    from dask.utils import parse_bytes

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dask-bench-") as scratch:
        root = args.data_dir or Path(scratch) / "data"
        complete = root / "_COMPLETE"  # written last: a half-written folder is never reused
        if complete.exists() and complete.read_text() == f"{args.rows} {args.files_per_region}":
            generated = "reused"
        else:
            if root.exists():
                shutil.rmtree(root)
            seconds, _ = timed(
                lambda: write_synthetic(
                    root, rows=args.rows, files_per_region=args.files_per_region
                )
            )
            complete.write_text(f"{args.rows} {args.files_per_region}")
            generated = f"generated in {seconds:.1f} s"
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in root.rglob("*.parquet"))
        disk_mb = sum(p.stat().st_size for p in root.rglob("*.parquet")) / 1e6
        arrow_gb = rows * 8 * len(COLUMNS) / 1e9
        cluster_gb = args.workers * parse_bytes(args.worker_memory) / 1e9
        print(
            f"{rows:,} rows x {len(COLUMNS)} columns, {REGIONS * args.files_per_region} files, "
            f"{disk_mb:.0f} MB Parquet ({generated}); {arrow_gb:.1f} GB as Arrow vs "
            f"{args.workers} workers x {args.worker_memory} = {cluster_gb:.1f} GB"
        )
        with local_cluster(args) as (cluster, client):
            dask_spec = bench_spec(root, cluster.scheduler_address)
            local_spec = bench_spec(root, None)
            methods: dict[str, Callable[[], Any]] = {}
            if not args.only_dask:
                if not args.fast_baseline_only:
                    methods["pyarrow group_by"] = lambda: pyarrow_group_by(root)
                methods["pyarrow binned group_by"] = lambda: pyarrow_binned_group_by(root)
                if not args.fast_baseline_only:
                    methods["count_cells local"] = lambda: source.count_cells(local_spec)
            methods["count_cells dask"] = lambda: count_cells_dask(dask_spec, client=client)
            for function in methods.values():
                if args.repeats > 1:
                    function()  # warm-up: imports, page cache, worker imports (not timed)
            times: dict[str, list[float]] = {name: [] for name in methods}
            results: dict[str, Any] = {}
            for _ in range(args.repeats):  # interleaved, so load changes hit every method alike
                for name, function in methods.items():
                    seconds, results[name] = timed(function)
                    times[name].append(seconds)
            worker_peaks = client.run(peak_rss_mb)

        dask_cells = true_cells(results["count_cells dask"])
        if not math.isclose(dask_cells.sum(), rows):
            raise SystemExit("count_cells dask did not count every row")
        if not args.only_dask:
            if "count_cells local" in results:
                np.testing.assert_array_equal(dask_cells, true_cells(results["count_cells local"]))
            if results["pyarrow binned group_by"]["count_all"].to_numpy().sum() != rows:
                raise SystemExit("the pyarrow baseline did not count every row")

    baselines = [name for name in times if name.startswith("pyarrow") or args.only_dask]
    baseline = min(min(times[name]) for name in baselines)  # the faster pyarrow method
    print(f"best of {args.repeats}{', after a warm-up' if args.repeats > 1 else ''}; counts agree")
    print_table(
        [
            "method",
            "best s",
            "median s",
            "Mrows/s",
            "vs pyarrow" if not args.only_dask else "ratio",
        ],
        [
            [
                name,
                f"{min(values):.2f}",
                f"{statistics.median(values):.2f}",
                f"{rows / min(values) / 1e6:.1f}",
                f"{baseline / min(values):.2f}x",
            ]
            for name, values in times.items()
        ],
    )
    peaks = ", ".join(f"{mb:.0f}" for mb in worker_peaks.values())
    print(
        f"peak RSS: workers {peaks} MB (limit {args.worker_memory} each); driver {peak_rss_mb():.0f} MB"
    )
    print(f"total {time.perf_counter() - started:.1f} s")


def write_wide(root: Path, *, attributes: int, rows: int, files: int) -> Path:
    """``marginals_scale_bench``'s seeded data (public randomness) in ``files`` row slices."""
    from marginals_scale_bench import write_data

    root.mkdir(parents=True)
    whole = root.parent / "whole.parquet"
    write_data(whole, attributes=attributes, rows=rows, seed=SEED)
    table = pq.read_table(whole)
    whole.unlink()
    for index, start in enumerate(range(0, rows, math.ceil(rows / files))):
        part = table.slice(start, math.ceil(rows / files))
        pq.write_table(part, root / f"part-{index}.parquet", row_group_size=1 << 20)
    return root


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def count_in_fresh_process(
    spec_path: str, subsets: list[tuple[int, ...]], output_rows: int, address: str | None
) -> tuple[float, float, float, dict[tuple[int, ...], np.ndarray]]:
    """(wall s, CPU s, peak RSS MB of this process, the true tables): in a spawned process."""
    from dprelease.catalog.confidential.dask_count import count_marginals_dask
    from dprelease.catalog.confidential.marginal_source import count_marginals
    from dprelease.catalog.engine import Execution
    from dprelease.catalog.spec.load import load_spec

    spec = load_spec(spec_path)
    started, cpu = time.perf_counter(), cpu_seconds()
    if address is None:
        counted = count_marginals(spec, subsets=subsets, output_rows=output_rows)
    else:
        from distributed import Client

        spec = spec.model_copy(update={"execution": Execution(engine="dask", address=address)})
        with Client(address, set_as_default=False) as client:
            counted = count_marginals_dask(
                spec, subsets=subsets, output_rows=output_rows, client=client
            )
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    tables = dict(vars(counted.marginals)["_ProtectedMarginals__tables"])  # public synthetic data
    return seconds, cpu, peak_rss_mb(), {axes: np.array(t) for axes, t in tables.items()}


def marginals_main(args: argparse.Namespace) -> None:
    """``--marginals``: local against Dask counting of the measured marginal tables."""
    import importlib
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from marginals_scale_bench import write_spec

    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import load_spec

    rows = 1_000_000 if args.rows is None else args.rows
    repeats = 1 if args.repeats is None else args.repeats
    if min(rows, args.attributes, args.files, args.workers, repeats) < 1:
        raise SystemExit("--rows, --attributes, --files, --workers and --repeats must be >= 1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dask-marginals-bench-") as scratch:
        root = write_wide(
            Path(scratch) / "data", attributes=args.attributes, rows=rows, files=args.files
        )
        spec_path = write_spec(
            Path(scratch), root, attributes=args.attributes, reconstruct="least_squares"
        )
        spec = load_spec(spec_path)
        plan = make_plan(spec)
        subsets = list(plan.strategy.marginal_subsets)
        cells = sum(math.prod(spec.domain_shape[a] for a in axes) for axes in subsets)
        print(
            f"{rows:,} rows x {args.attributes} attributes x 10 values ({spec.num_cells:.0e} "
            f"cells) in {args.files} files; {len(subsets):,} measured tables, {cells:,} cells"
        )
        context = multiprocessing.get_context("spawn")
        times: dict[str, list[float]] = {"local": [], "dask": []}
        cpus: dict[str, list[float]] = {"local": [], "dask": []}
        peaks: dict[str, float] = {"local": 0.0, "dask": 0.0}
        tables: dict[str, dict[tuple[int, ...], np.ndarray]] = {}
        with local_cluster(args) as (cluster, client):
            client.run(importlib.import_module, "dprelease.catalog.confidential.dask_count")
            for _ in range(repeats):  # interleaved, each in a fresh process
                for name, address in (("local", None), ("dask", cluster.scheduler_address)):
                    before = sum(client.run(cpu_seconds).values())
                    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                        seconds, cpu, peak, tables[name] = pool.submit(
                            count_in_fresh_process,
                            str(spec_path),
                            subsets,
                            plan.num_queries,
                            address,
                        ).result()
                    times[name].append(seconds)
                    cpus[name].append(cpu + sum(client.run(cpu_seconds).values()) - before)
                    peaks[name] = max(peaks[name], peak)
            worker_peaks = client.run(peak_rss_mb)
    local, dask = tables["local"], tables["dask"]
    if list(local) != list(dask) or not all(np.array_equal(local[k], dask[k]) for k in local):
        raise SystemExit("count_marginals_dask and count_marginals disagree")
    if local[()] != rows:
        raise SystemExit("count_marginals did not count every row")
    print(f"best of {repeats}; the {len(local):,} tables of both are identical")
    base = min(times["local"])
    workers = ", ".join(f"{mb:.0f}" for mb in worker_peaks.values())
    print_table(
        [
            "method",
            "best wall s",
            "vs local",
            "CPU s (+workers)",
            "peak RSS MB (driver)",
            "workers' peak RSS MB",
        ],
        [
            [
                f"count_marginals {name}",
                f"{min(values):.1f}",
                f"{min(values) / base:.2f}x",
                f"{min(cpus[name]):.1f}",
                f"{peaks[name]:.0f}",
                workers if name == "dask" else "",
            ]
            for name, values in times.items()
        ],
    )
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
