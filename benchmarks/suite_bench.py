"""Test-suite benchmark: CPU and wall time of a test selection at a baseline revision and now.

Issue 27 asks for a faster suite with the same tests.  This measures a selection (default: the
statistical tests, the suite's pure-CPU share) twice in one run, one pytest process at a time and
serially (``-n 0``), so the two figures share the machine's state:

* ``baseline``: the repository at ``--baseline`` (a ``git worktree`` in a temporary folder, imported
  as ``dprelease`` ahead of the editable install through ``PYTHONPATH``), with ITS tests;
* ``now``: the working tree.

CPU is the pytest process's user + system time including the processes it waited for
(``RUSAGE_CHILDREN``); a test that starts daemons (servers) is not fully counted, so the default
selection has none.  Each row also says whether the selection passed.

With ``--workers N,M,...`` it compares instead the README's test command (or a selection) run
with ``-n N``, ``-n M``, ... in the working tree, one after the other: wall time, the machine's
busy CPU over the run (``/proc/stat``, so servers and flow runs count) and the most memory in use
(``MemTotal - MemAvailable``, sampled each second).  It takes as long as the suite, per row.

Usage (from the repository root)::

    .venv/bin/python benchmarks/suite_bench.py --baseline b91977f
    .venv/bin/python benchmarks/suite_bench.py --baseline HEAD~3 tests/statistical/test_interval_coverage.py
    .venv/bin/python benchmarks/suite_bench.py --workers 3,4
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from count_bench import print_table  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def run_selection(
    root: Path, selection: list[str], *, pythonpath: str | None
) -> tuple[float, float, bool]:
    """(wall s, CPU s, passed) of one ``pytest -n 0`` run of ``selection`` inside ``root``."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *selection],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode == 0


def busy_jiffies() -> int:
    """Busy time of all CPUs since boot, in clock ticks (``/proc/stat``: all but idle, iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def memory_in_use_mb() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 1024


def run_with_workers(workers: int, selection: list[str]) -> tuple[float, float, float, bool]:
    """(wall s, machine busy CPU s, most memory in use MB, passed) of ``pytest -n workers``."""
    peak = [memory_in_use_mb()]
    done_event = threading.Event()

    def sample() -> None:
        while not done_event.wait(1.0):
            peak.append(memory_in_use_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    ticks = os.sysconf("SC_CLK_TCK")
    before, started = busy_jiffies(), time.perf_counter()
    sampler.start()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                str(workers),
                *selection,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        done_event.set()
        sampler.join()
    wall = time.perf_counter() - started
    if done.returncode != 0:  # what failed, from pytest's short summary
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        print(f"-n {workers}: exit {done.returncode}", *failed, sep="\n", file=sys.stderr)
    return wall, (busy_jiffies() - before) / ticks, max(peak), done.returncode == 0


def compare_workers(counts: list[int], selection: list[str]) -> None:
    rows, first = [], None
    for workers in counts:
        wall, cpu, memory, passed = run_with_workers(workers, selection)
        first = first or wall
        rows.append(
            [f"-n {workers}", f"{wall:.1f}", f"{cpu:.0f}", f"{memory:.0f}",
             "yes" if passed else "NO", f"{wall / first:.2f}x"]
        )  # fmt: skip
    print(f"selection: {' '.join(selection) or 'the README test command'}; one run each")
    headers = ["workers", "wall s", "busy CPU s", "memory in use MB", "passed", "wall vs first"]
    print_table(headers, rows)


@contextlib.contextmanager
def baseline_tree(baseline: str) -> Iterator[tuple[str, Path, str]]:
    """``(commit, worktree, PYTHONPATH)`` of revision ``baseline``: a detached ``git worktree`` in
    a temporary folder, importable as ``dprelease`` ahead of the editable install; removed after."""
    revision = subprocess.run(
        ["git", "rev-parse", "--verify", f"{baseline}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if revision.returncode != 0:
        raise SystemExit(f"--baseline {baseline!r} is not a commit of this repository")
    commit = revision.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(tree), commit],
            cwd=ROOT,
            check=True,
        )
        try:
            # the package is the repository root: a link named dprelease makes the worktree importable
            imports = Path(scratch) / "imports"
            imports.mkdir()
            (imports / "dprelease").symlink_to(tree)
            yield commit, tree, f"{imports}{os.pathsep}{tree}"
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision to compare against")
    parser.add_argument(
        "--workers", help="comma-separated pytest -n counts to compare instead, e.g. 3,4"
    )
    parser.add_argument(
        "selection", nargs="*", help="default: tests/statistical; all with --workers"
    )
    args = parser.parse_args()
    if args.workers is not None:
        counts = args.workers.split(",")
        if not all(c.strip().isdigit() for c in counts):
            raise SystemExit(f"--workers ({args.workers!r}) must be comma-separated counts >= 0")
        compare_workers([int(c) for c in counts], args.selection)
        return
    if args.baseline is None:
        raise SystemExit("--baseline is required (or --workers)")
    args.selection = args.selection or ["tests/statistical"]
    rows = []
    results = {}
    with baseline_tree(args.baseline) as (commit, tree, path):
        for label, root, pythonpath in (("baseline", tree, path), ("now", ROOT, None)):
            wall, cpu, passed = run_selection(root, args.selection, pythonpath=pythonpath)
            results[label] = (wall, cpu)
            rows.append([label, f"{wall:.1f}", f"{cpu:.1f}", "yes" if passed else "NO"])
    for row, label in zip(rows, ("baseline", "now"), strict=True):
        row.append(f"{results[label][1] / results['baseline'][1]:.2f}x")
    print(f"selection: {' '.join(args.selection)}; baseline {args.baseline} ({commit[:10]})")
    print_table(["tree", "wall s", "CPU s", "passed", "CPU vs baseline"], rows)


if __name__ == "__main__":
    main()
