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

Usage (from the repository root)::

    .venv/bin/python benchmarks/suite_bench.py --baseline b91977f
    .venv/bin/python benchmarks/suite_bench.py --baseline HEAD~3 tests/statistical/test_interval_coverage.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
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
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("selection", nargs="*", default=["tests/statistical"])
    args = parser.parse_args()
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
