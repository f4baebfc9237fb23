"""A deployed release's flow-run process: CPU and wall time per run with Prefect's default
command (a workspace supervisor, then the engine) and with dprelease's (``flows/
flow_run_process.py``: a session of its own, then the engine).

A real ``prefect server`` and a process worker started as ``deploy/start-worker.sh`` starts it
(``tests/flows/test_operations.py: serve``), one tiny deployment whose job variable ``command``
is switched between the two; runs alternate between them.  CPU: the flow-run process's user +
system time, read as the growth of the worker's reaped-children time (``/proc/<worker>/stat``
fields 16-17) once the run is final and its process gone (Linux).  Wall: from the run's creation
to its final state.  Each run releases, pauses for review and ends after its 1 s review timeout,
the same in both; the first run of each kind is a warm-up.  Usage (from the repository root)::

    .venv/bin/python benchmarks/flow_run_start_bench.py --runs 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from count_bench import print_table  # benchmarks/ is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the migrated Prefect database install.sh leaves, as dprelease itself finds it
os.environ.setdefault(
    "DPRELEASE_CACHE_DIR",
    str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dprelease"),
)

from dprelease.flows.flow_run_process import COMMAND
from tests.flows.test_operations import Operations, _spec, _write_tiny_parquet, serve

RUN_TIMEOUT = 240.0
VARIANTS: dict[str, dict[str, str]] = {
    "Prefect's default (supervisor, then engine)": {},
    "dprelease's command": {"command": COMMAND},
}


def _worker_pid() -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and b"worker start" in line:
                return int(entry.name)
    raise SystemExit("no process worker among this process's children")


def _reaped_children_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime + cstime


def _has_children(pid: int) -> bool:
    return any(
        entry.name.isdigit()
        and (entry / "stat").exists()
        and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid)
        and b"validation.service" not in (entry / "cmdline").read_bytes()
        for entry in Path("/proc").iterdir()
    )


def one_run(ops: Operations, deployment_id: object, worker: int) -> tuple[float, float]:
    """(CPU s, wall s) of one run of the deployment."""
    before = _reaped_children_seconds(worker)
    started = time.monotonic()
    with ops.api() as client:
        run = client.create_flow_run_from_deployment(deployment_id)
        while not client.read_flow_run(run.id).state.is_final():
            if time.monotonic() - started > RUN_TIMEOUT:
                raise SystemExit(f"run {run.name} not final after {RUN_TIMEOUT:.0f} s")
            time.sleep(0.2)
    wall = time.monotonic() - started
    while _has_children(worker):  # the process is reaped: its CPU is in the worker's cutime
        time.sleep(0.1)
    return _reaped_children_seconds(worker) - before, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    if args.runs < 1:
        raise SystemExit(f"--runs ({args.runs}) must be >= 1")
    from prefect.client.schemas.actions import DeploymentUpdate

    with tempfile.TemporaryDirectory(prefix="flow-run-start-bench-") as folder:
        base = Path(folder)
        data = base / "data" / "tiny.parquet"
        _write_tiny_parquet(data, seed=7)
        spec = _spec("start-bench", "start-bench", data, cap=1000.0)
        (base / "specs").mkdir()
        spec_path = base / "specs" / "start-bench.yaml"
        spec_path.write_text(yaml.safe_dump(spec))
        deploy = [str(base / "specs")]
        results: dict[str, list[tuple[float, float]]] = {label: [] for label in VARIANTS}
        with serve(
            base, specs={"bench": spec_path}, landing=base, deploy=deploy, review_timeout=1
        ) as ops:
            worker = _worker_pid()
            with ops.api() as client:
                deployment = client.read_deployment_by_name("release-deployment/start-bench")
            for round_ in range(args.runs + 1):
                for label, job_variables in VARIANTS.items():
                    with ops.api() as client:
                        client.update_deployment(
                            deployment.id,
                            DeploymentUpdate(job_variables=job_variables),
                        )
                    measured = one_run(ops, deployment.id, worker)
                    if round_ > 0:  # round 0: warm-up
                        results[label].append(measured)
    baseline = statistics.median(cpu for cpu, _ in results[next(iter(VARIANTS))])
    rows = [
        [label, f"{statistics.median(c for c, _ in runs):.2f}",
         f"{min(c for c, _ in runs):.2f}-{max(c for c, _ in runs):.2f}",
         f"{statistics.median(w for _, w in runs):.2f}",
         f"{statistics.median(c for c, _ in runs) / baseline:.2f}x"]
        for label, runs in results.items()
    ]  # fmt: skip
    print(f"deployed flow run, median of {args.runs} per command (alternating)")
    print_table(["command", "CPU s", "range", "wall s", "CPU vs default"], rows)


if __name__ == "__main__":
    main()
