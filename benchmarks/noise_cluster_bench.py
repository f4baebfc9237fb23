"""Noise on a Dask cluster: throughput with 1 vs 2 workers, and a large identity measurement.

Usage: .venv/bin/python benchmarks/noise_cluster_bench.py [--values N] [--cells M] [--shard S]

Targets (issue 16, on the 2-core machine, same run):
* noise throughput scales >= 1.7x from 1 to 2 workers;
* a 10^8-cell identity measurement end to end <= 6 min, peak memory per process <= 6 GB.

Part 1 times the choke point (``ProtectedCells.measure``: charge, ``A·x``, shards scattered, noised
by the vetted sampler on the workers, gathered, checked) on a warm ``LocalCluster`` of 1 and then 2
single-threaded worker processes, against baselines measured in the same run: numpy's unvetted
Laplace draw and the ``local`` engine's in-process OpenDP sampler (1 thread and all cores).

Part 2 runs the measure stage's ``engine: dask`` path end to end for ``--cells`` cells: the
LocalCluster sized to the machine is started (``catalog.engine.open_cluster``), the cells are
noised through it, the cluster is closed.  Peak memory is each process's ``VmHWM`` from
``/proc/<pid>/status`` (reset through ``/proc/self/clear_refs`` after the warm-up); a LocalCluster's
scheduler lives in the client process, so the client row includes it.  When ``--cells`` is below
10^8 the 10^8 figures are EXTRAPOLATED linearly and labelled so: time scales with the cells; for
memory the growth over the warm process is scaled, which over-states it (a worker's per-shard
working memory does not grow with the cells).

The machine is shared: wall times include other people's load (the load average is printed).  Each
row therefore also gives CPU seconds per process (``/proc/self/stat``) and an ESTIMATE of the wall
time on idle cores (client CPU + the busiest worker's CPU), labelled as an estimate.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from distributed import Client, LocalCluster

from dprelease.catalog.confidential.choke_point import ProtectedCells, ShardMapper
from dprelease.catalog.confidential.distributed_noise import DaskShardMapper, noise_cluster, sharded
from dprelease.catalog.engine import Execution
from dprelease.mechanisms.primitives.noise import OpenDPSampler
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.strategies import build_kron_strategy

TARGET = 100_000_000
PURE = PrivacyCost(measure="pure", epsilon=1.0)


class _Accountant:
    """Counts charges (the ledger's own cost, O(1) per charge, is measured elsewhere)."""

    def __init__(self) -> None:
        self.charges = 0

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        self.charges += 1
        return f"bench-{self.charges}"

    def holds(self, receipt_id: str) -> bool:
        return True


def peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``), MiB."""
    return _status_kib("VmHWM") / 1024


def rss_mib() -> float:
    """This process's resident memory now (``VmRSS``), MiB."""
    return _status_kib("VmRSS") / 1024


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux ``clear_refs`` value 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def _status_kib(field: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(f"{field}:"):
                return float(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def load_average() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def cpu_seconds() -> float:
    """CPU time (user + system, all threads) this process has used, from ``/proc/self/stat``."""
    with open("/proc/self/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Timing:
    """Wall seconds, and CPU seconds of this process and of each worker, for one run."""

    wall: float
    client_cpu: float
    worker_cpu: tuple[float, ...] = ()

    @property
    def uncontended(self) -> float:
        """Wall time on idle cores, estimated from CPU time: this process's work plus the busiest
        worker's (an upper bound: it ignores their overlap)."""
        return self.client_cpu + max(self.worker_cpu, default=0.0)


def timed(function: Callable[[], object], client: Client | None = None) -> Timing:
    workers_before = client.run(cpu_seconds) if client is not None else {}
    cpu, started = cpu_seconds(), time.perf_counter()
    function()
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    after = client.run(cpu_seconds) if client is not None else {}
    return Timing(wall, cpu, tuple(after[w] - workers_before[w] for w in sorted(after)))


def identity_measurement(cells: np.ndarray, mapper: ShardMapper | None, *, shard: int) -> None:
    """One identity measurement through the choke point (locally when ``mapper`` is None)."""
    strategy = build_kron_strategy("identity", attribute_roles=[(cells.size, "categorical")])
    protected = ProtectedCells(cells, domain_shape=(cells.size,), contribution_bound=1)
    if mapper is not None:
        protected = protected.with_shard_mapper(mapper, shard_size=shard)
    protected.measure(strategy, target=PURE, accountant=_Accountant(), label="bench")


def throughput(values: int, shard: int) -> list[tuple[str, Timing]]:
    cells = np.zeros(values)
    rng = np.random.default_rng(1)  # baseline only: numpy noise is NOT floating-point safe
    rows = [
        ("numpy laplace (unvetted baseline)", timed(lambda: cells + rng.laplace(0, 1, values))),
        (
            "local OpenDP, 1 thread",
            timed(lambda: OpenDPSampler(threads=1).add_laplace(cells, scale=1.0)),
        ),
        (
            f"local OpenDP, {os.cpu_count()} threads (engine: local)",
            timed(lambda: identity_measurement(cells, None, shard=shard)),
        ),
    ]
    for workers in (1, 2):
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                host="127.0.0.1",
            ) as cluster,
            Client(cluster) as client,
        ):
            mapper = DaskShardMapper(client)
            identity_measurement(np.zeros(2 * workers), mapper, shard=1)  # warm-up: imports
            timing = timed(lambda m=mapper: identity_measurement(cells, m, shard=shard), client)
            rows.append((f"dask, {workers} worker(s) (engine: dask)", timing))
    return rows


def end_to_end(cells_count: int) -> tuple[float, Timing, dict[str, tuple[float, float]], bool]:
    """Seconds from cluster start to cluster close; the measurement's timing; (RSS before the
    data, peak RSS) in MiB per process.  The measure stage's dask path: ``noise_cluster`` and
    ``sharded`` with the production shard size, as ``catalog.release.measure`` runs them."""
    client_base = rss_mib()
    cells = np.empty(cells_count)  # synthetic counts 0..5, drawn in place (no temporary)
    np.random.default_rng(2).random(out=cells)
    np.floor(np.multiply(cells, 6, out=cells), out=cells)
    reset = reset_peak_rss()
    memory: dict[str, tuple[float, float]] = {}
    started = time.perf_counter()
    with noise_cluster(Execution(engine="dask")) as mapper:
        if not isinstance(mapper, DaskShardMapper):
            raise RuntimeError("engine: dask gave no Dask shard mapper")
        client = mapper.client
        identity_measurement(np.zeros(8), mapper, shard=1)  # warm-up: imports on the workers
        client.run(reset_peak_rss)
        client.run_on_scheduler(reset_peak_rss)
        bases = client.run(rss_mib)
        scheduler_base = client.run_on_scheduler(rss_mib)
        strategy = build_kron_strategy("identity", attribute_roles=[(cells_count, "categorical")])
        protected = ProtectedCells(cells, domain_shape=(cells_count,), contribution_bound=1)
        timing = timed(
            lambda: sharded(protected, mapper).measure(
                strategy, target=PURE, accountant=_Accountant(), label="bench"
            ),
            client,
        )
        for address, peak in sorted(client.run(peak_rss_mib).items()):
            memory[f"worker {address}"] = (bases[address], peak)
        if client.run_on_scheduler(os.getpid) != os.getpid():  # a LocalCluster's is in-process
            memory["scheduler"] = (scheduler_base, client.run_on_scheduler(peak_rss_mib))
    elapsed = time.perf_counter() - started
    memory["client (measure stage; LocalCluster scheduler)"] = (client_base, peak_rss_mib())
    return elapsed, timing, memory, reset


def report_throughput(values: int, shard: int) -> None:
    rows = throughput(values, shard)
    numpy_s, one, two = rows[0][1].wall, rows[3][1], rows[4][1]
    print(f"\n1. Laplace noise for {values:,} values ({shard:,} per shard)")
    print(
        f"{'path':<46} {'wall s':>8} {'values/s':>11} {'vs numpy':>9} {'cpu s':>7} "
        f"{'worker cpu s':>14} {'idle-core est s':>16}"
    )
    for name, t in rows:
        workers = "/".join(f"{c:.1f}" for c in t.worker_cpu) or "-"
        print(
            f"{name:<46} {t.wall:>8.2f} {values / t.wall:>11,.0f} "
            f"{t.wall / numpy_s:>8.0f}x {t.client_cpu:>7.1f} {workers:>14} {t.uncontended:>16.2f}"
        )
    print(
        f"scaling 1 -> 2 workers (target >= 1.7x): measured wall {one.wall / two.wall:.2f}x; "
        f"ESTIMATED on idle cores from CPU time {one.uncontended / two.uncontended:.2f}x"
    )


def report_end_to_end(cells: int) -> None:
    elapsed, timing, memory, reset = end_to_end(cells)
    scale = TARGET / cells
    label = "measured" if scale == 1 else f"EXTRAPOLATED x{scale:g}, linear"
    print(f"\n2. identity measurement of {cells:,} cells, engine: dask, end to end")
    print(
        f"   cluster start .. close {elapsed:.1f} s; the measurement (charge, A·x, scatter, noise "
        f"on workers, gather, checks) {timing.wall:.1f} s wall, client {timing.client_cpu:.1f} "
        f"CPU s, workers {'/'.join(f'{c:.1f}' for c in timing.worker_cpu)} CPU s"
    )
    print(f"{'process':<48} {'base MiB':>9} {'peak MiB':>9} {'10^8 peak MiB':>14}")
    at_target = {}
    for process, (base, peak) in memory.items():
        at_target[process] = base + (peak - base) * scale  # the data-dependent part scales
        print(f"{process:<48} {base:>9,.0f} {peak:>9,.0f} {at_target[process]:>14,.0f}")
    fixed = elapsed - timing.wall
    print(
        f"10^8 cells (target <= 360 s, <= 6 GB per process): {fixed + timing.wall * scale:.0f} s "
        f"wall ({label}); {fixed + timing.uncontended * scale:.0f} s on idle cores (ESTIMATED "
        f"from CPU time, {label}); largest peak {max(at_target.values()) / 1024:.2f} GiB ({label})"
        + ("" if reset else "; peak RSS could not be reset, peaks include earlier work")
    )


def main() -> None:
    warnings.filterwarnings("ignore", message="Port .* is already in use")
    logging.getLogger("distributed").setLevel(logging.CRITICAL)  # shutdown chatter only
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--values", type=int, default=2_000_000, help="values for part 1")
    parser.add_argument("--cells", type=int, default=10_000_000, help="cells for part 2")
    parser.add_argument("--shard", type=int, default=1 << 18, help="answers per shard, part 1")
    parser.add_argument("--parts", choices=("1", "2", "12"), default="12", help="which parts")
    args = parser.parse_args()
    print(f"cpu_count={os.cpu_count()}  load average at start: {load_average()}")
    if "1" in args.parts:
        report_throughput(args.values, args.shard)
    if "2" in args.parts:
        report_end_to_end(args.cells)
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
