"""A deployed release's flow-run process: CPU and wall time per run with Prefect's default
command (a workspace supervisor, then the engine), with dprelease's (``flows/flow_run_process.py``:
a session of its own, then the engine), and with dprelease's command asking the worker's run
starter (``flows/run_starter.py``) to fork the run from a process that imported everything once.

A real ``prefect server`` and a process worker started as ``deploy/start-worker.sh`` starts it
(``tests/flows/test_operations.py: serve``), one tiny deployment.  Two stacks run one after the
other: one with ``DPRELEASE_RUN_STARTER=off``, where runs alternate between the first two commands
(the deployment's job variable ``command`` is switched), then one with the starter.  CPU: what the
run costs in processes the worker started, read once the run is final and reaped (Linux): growth
of the worker's reaped-children time (``/proc/<worker>/stat`` fields 16-17) plus, with the
starter, the starter's own and reaped-children time (fields 14-17).  Wall: from the run's creation
to its final state.  Each run releases, pauses for review and ends after its 1 s review timeout,
the same in all; the first run of each kind is a warm-up.  The server's CPU is not counted.
Usage (from the repository root)::

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
from dprelease.flows.run_starter import SWITCH_ENV
from tests.flows.test_operations import Operations, _spec, _write_tiny_parquet, serve

RUN_TIMEOUT = 240.0
DEFAULT = "Prefect's default (supervisor, then engine)"
FRESH = "dprelease's command, starter off"
FORKED = "dprelease's command, run starter"
STACKS: dict[str, dict[str, dict[str, str]]] = {  # starter switch -> label -> job variables
    "off": {DEFAULT: {}, FRESH: {"command": COMMAND}},
    "on": {FORKED: {"command": COMMAND}},
}


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(pid: int, *, marker: bytes | None = None) -> list[int]:
    """Children of ``pid`` (whose command line holds ``marker``, when given)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) != pid:
                    continue
                if marker is None or marker in _cmdline(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _worker_pid() -> int:
    found = _children(os.getpid(), marker=b"worker start")
    if not found:
        raise SystemExit("no process worker among this process's children")
    return found[0]


def _seconds(pid: int, *, own: bool) -> float:
    fields = _stat(pid)  # utime stime cutime cstime are fields 14-17 (index 11-14 here)
    counted = fields[11:15] if own else fields[13:15]
    return sum(int(v) for v in counted) / os.sysconf("SC_CLK_TCK")


def _run_processes(worker: int, starter: int | None) -> list[int]:
    services = (b"validation.service", b"run_starter")
    runs = [p for p in _children(worker) if not any(s in _cmdline(p) for s in services)]
    return runs + (_children(starter) if starter is not None else [])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def one_run(
    ops: Operations, deployment_id: object, worker: int, starter: int | None
) -> tuple[float, float]:
    """(CPU s, wall s) of one run of the deployment."""

    def spent() -> float:
        starter_part = 0.0 if starter is None else _seconds(starter, own=True)
        return _seconds(worker, own=False) + starter_part

    before = spent()
    started = time.monotonic()
    with ops.api() as client:
        run = client.create_flow_run_from_deployment(deployment_id)
        while not client.read_flow_run(run.id).state.is_final():
            if time.monotonic() - started > RUN_TIMEOUT:
                raise SystemExit(f"run {run.name} not final after {RUN_TIMEOUT:.0f} s")
            time.sleep(0.2)
    wall = time.monotonic() - started
    while _run_processes(worker, starter):  # reaped: their CPU is in their parent's times
        time.sleep(0.1)
    return spent() - before, wall


def measure(runs: int, switch: str) -> dict[str, list[tuple[float, float]]]:
    from prefect.client.schemas.actions import DeploymentUpdate

    variants = STACKS[switch]
    results: dict[str, list[tuple[float, float]]] = {label: [] for label in variants}
    with tempfile.TemporaryDirectory(prefix="flow-run-start-bench-") as folder:
        base = Path(folder)
        data = base / "data" / "tiny.parquet"
        _write_tiny_parquet(data, seed=7)
        spec = _spec("start-bench", "start-bench", data, cap=1000.0)
        (base / "specs").mkdir()
        spec_path = base / "specs" / "start-bench.yaml"
        spec_path.write_text(yaml.safe_dump(spec))
        with serve(
            base, specs={"bench": spec_path}, landing=base, deploy=[str(base / "specs")],
            review_timeout=1, worker_env={SWITCH_ENV: switch},
        ) as ops:  # fmt: skip
            worker = _worker_pid()
            deadline = time.monotonic() + RUN_TIMEOUT  # the launcher imports, then spawns it
            while not (starters := _children(worker, marker=b"run_starter")) and switch == "on":
                if time.monotonic() > deadline:
                    raise SystemExit(f"no run starter after {RUN_TIMEOUT:.0f} s")
                time.sleep(0.2)
            starter = starters[0] if starters else None
            with ops.api() as client:
                deployment = client.read_deployment_by_name("release-deployment/start-bench")
            for round_ in range(runs + 1):
                for label, job_variables in variants.items():
                    with ops.api() as client:
                        client.update_deployment(
                            deployment.id, DeploymentUpdate(job_variables=job_variables)
                        )
                    measured = one_run(ops, deployment.id, worker, starter)
                    if round_ > 0:  # round 0: warm-up
                        results[label].append(measured)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    if args.runs < 1:
        raise SystemExit(f"--runs ({args.runs}) must be >= 1")
    results = {**measure(args.runs, "off"), **measure(args.runs, "on")}
    baseline = statistics.median(cpu for cpu, _ in results[DEFAULT])
    rows = [
        [label, f"{statistics.median(c for c, _ in runs):.2f}",
         f"{min(c for c, _ in runs):.2f}-{max(c for c, _ in runs):.2f}",
         f"{statistics.median(w for _, w in runs):.2f}",
         f"{statistics.median(c for c, _ in runs) / baseline:.2f}x"]
        for label, runs in results.items()
    ]  # fmt: skip
    print(f"deployed flow run, median of {args.runs} per command")
    print_table(["command", "CPU s", "range", "wall s", "CPU vs default"], rows)


if __name__ == "__main__":
    main()
