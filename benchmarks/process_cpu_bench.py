"""Where a test selection's CPU goes, by kind of process, at a baseline revision and now.

The suite starts many real processes (Prefect servers and workers, the GX validation service,
``dprelease`` commands, flow runs, Chromium, PostgreSQL); ``suite_bench.py`` counts their CPU only
as the machine's total.  This runs ``pytest -n 0`` on a selection (default: the README's test
command with its own ``-n``), reads every process's CPU time from ``/proc`` once a second, and adds
up, per kind of process (from its command line), the CPU it used while the selection ran.  A
process that lives under a second between two reads is missed, and one that ends loses up to a
second of its last CPU; the ``sampled`` row against ``machine busy`` shows how much that is.

With ``--baseline REV`` it runs the selection at that revision first (a ``git worktree``, as in
``suite_bench.py``), then in the working tree, and prints both columns and their ratio.

Usage (from the repository root)::

    .venv/bin/python benchmarks/process_cpu_bench.py                # the whole suite, -n 3
    .venv/bin/python benchmarks/process_cpu_bench.py tests/flows/test_series_arrival.py
    .venv/bin/python benchmarks/process_cpu_bench.py --baseline HEAD~1 -- \\
        tests/flows/test_operations_e2e.py -k scheduled    # after --: pytest's own options
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from count_bench import print_table  # benchmarks/ is on sys.path when run as a script
from suite_bench import ROOT, baseline_tree, busy_jiffies

from dprelease.catalog.processes import command_line, live_processes

KINDS = (  # (kind, pattern in the command line); the first that matches names the process
    ("flow run", r"prefect\.engine|flow_run_process|run_starter"),
    ("Prefect server", r"server start|uvicorn|prefect\.server"),
    ("server supervisor", r"flows\.server supervise"),
    ("Prefect worker", r"worker start|worker_host"),
    ("GX validation service", r"validation\.service"),
    ("pytest (xdist workers, in-process tests)", r"execnet|exec\(eval\(|-m pytest"),
    ("dprelease commands", r"bin/dprelease |-m dprelease "),
    ("PostgreSQL", r"postgres"),
    ("Chromium", r"chrom"),
    ("Dask", r"dask|distributed"),
    ("other Python (helpers the tests start)", r"python"),
)


def kind_of(command: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, command):
            return kind
    return "other (kernel, system)"


class ProcessSampler:
    """Once a second, every process's CPU ticks and command line, keyed by PID and start time.
    CPU a process had before the first read is not counted.  O(processes) /proc reads a second."""

    def __init__(self) -> None:
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.command: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self, *, initial: bool) -> None:
        for pid, fields in live_processes():
            command = command_line(pid)
            if command is None:
                continue  # gone since its stat was read
            process = f"{pid}:{fields[19]}"  # with the start time: a reused pid is another process
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
            if command:  # the latest: a child read between fork and exec shows its parent's
                self.command[process] = command
            if initial:
                self.first[process] = ticks
            self.last[process] = ticks

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._read(initial=False)

    def __enter__(self) -> ProcessSampler:
        self._read(initial=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read(initial=False)

    def by_kind(self) -> tuple[Counter[str], Counter[str]]:
        """(CPU seconds, process count) per kind; processes that used no CPU are left out."""
        ticks = os.sysconf("SC_CLK_TCK")
        cpu: Counter[str] = Counter()
        count: Counter[str] = Counter()
        for process, last in self.last.items():
            used = last - self.first.get(process, 0)
            if used > 0:
                kind = kind_of(self.command.get(process, ""))
                cpu[kind] += used / ticks
                count[kind] += 1
        return cpu, count


@dataclass(frozen=True)
class Measurement:
    wall: float
    busy: float  # the machine's busy CPU seconds over the run (/proc/stat)
    cpu: Counter[str]  # CPU seconds per kind of process
    count: Counter[str]  # processes per kind
    passed: bool


def measure(root: Path, selection: list[str], *, pythonpath: str | None) -> Measurement:
    """One pytest run of ``selection`` inside ``root``, its processes sampled each second."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-n", "0", *selection] if selection else []
    busy_before, started = busy_jiffies(), time.perf_counter()
    with ProcessSampler() as sampler:
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, check=False
        )
    wall = time.perf_counter() - started
    busy = (busy_jiffies() - busy_before) / os.sysconf("SC_CLK_TCK")
    if done.returncode != 0:
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        print(f"{root}: pytest exit {done.returncode}", *failed, sep="\n", file=sys.stderr)
    cpu, count = sampler.by_kind()
    return Measurement(wall, busy, cpu, count, done.returncode == 0)


def table(runs: dict[str, Measurement]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: per kind of process, then the totals; a ratio column with a baseline."""
    now = runs["now"]
    kinds = sorted({k for run in runs.values() for k in run.cpu}, key=lambda k: -now.cpu[k])
    lines: list[tuple[str, dict[str, tuple[str, float]]]] = [
        (kind, {label: (str(run.count[kind]), run.cpu[kind]) for label, run in runs.items()})
        for kind in kinds
    ]
    lines.append(("sampled", {label: ("", sum(run.cpu.values())) for label, run in runs.items()}))
    lines.append(("machine busy", {label: ("", run.busy) for label, run in runs.items()}))
    lines.append(("wall s", {label: ("", run.wall) for label, run in runs.items()}))
    headers = ["process kind"] + [
        f"{label} {what}" for label in runs for what in ("procs", "CPU s")
    ]
    rows = []
    for name, values in lines:
        row = [name] + [v for label in runs for v in (values[label][0], f"{values[label][1]:.1f}")]
        if "baseline" in runs:
            before, after = values["baseline"][1], values["now"][1]
            row.append(f"{after / before:.2f}x" if before else "new")
        rows.append(row)
    passed = ["passed"] + [v for run in runs.values() for v in ("", "yes" if run.passed else "NO")]
    rows.append(passed + ([""] if "baseline" in runs else []))
    if "baseline" in runs:
        headers.append("now vs baseline")
    return headers, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision to compare against")
    parser.add_argument(
        "selection", nargs="*", help="pytest selection (run with -n 0); default: the whole suite"
    )
    args = parser.parse_args()
    runs: dict[str, Measurement] = {}
    against = ""
    if args.baseline is not None:
        with baseline_tree(args.baseline) as (commit, tree, path):
            runs["baseline"] = measure(tree, args.selection, pythonpath=path)
        against = f"; baseline {args.baseline} ({commit[:10]})"
    runs["now"] = measure(ROOT, args.selection, pythonpath=None)
    print(f"selection: {' '.join(args.selection) or 'the README test command'}{against}")
    print_table(*table(runs))


if __name__ == "__main__":
    main()
