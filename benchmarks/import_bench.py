"""Import benchmark: CPU to import dprelease's entry modules in a fresh process, at a baseline
revision and now.

Every deployed flow run, ``dprelease`` command and validation service is a new Python process, so
what its entry module imports is paid each time (issue 27: the suite is CPU-bound).  Per module,
the median over ``--repeats`` fresh interpreters of ``time.process_time()`` around the import:

* ``baseline``: the repository at ``--baseline`` (a ``git worktree`` imported as ``dprelease``
  ahead of the editable install), its source compiled on every import as where
  ``PYTHONDONTWRITEBYTECODE=1`` and nothing compiled it;
* ``now``: the working tree as ``install.sh`` leaves it (``compileall`` of the editable source;
  run ``install.sh`` or ``python -m compileall flows tasks catalog mechanisms`` first).

``prefect.engine`` is imported before the clock starts when the module is run by a flow-run
process (it is already loaded there).  Usage (from the repository root)::

    .venv/bin/python benchmarks/import_bench.py --baseline d71e78f
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from count_bench import print_table  # benchmarks/ is on sys.path when run as a script
from suite_bench import ROOT, baseline_tree

# (entry module, modules loaded before the clock starts, what runs it)
ENTRIES = (
    ("dprelease.flows.deployed_release", "prefect.engine", "each deployed flow run"),
    ("dprelease.flows.deployed_release", "", "the same, prefect included"),
    ("dprelease.catalog.review.decisions", "", "dprelease review"),
    ("dprelease.catalog.show", "", "dprelease show / budget / verify"),
    ("dprelease.flows.deployments", "", "dprelease deploy"),
)
HEAVY = ("scipy.optimize", "scipy.special", "pyarrow.dataset", "pandas")
_PROBE = """
import importlib, json, sys, time
if sys.argv[2]:
    importlib.import_module(sys.argv[2])
started = time.process_time()
importlib.import_module(sys.argv[1])
cpu = time.process_time() - started
print(json.dumps([cpu, [name for name in sys.argv[3].split(",") if name in sys.modules]]))
"""


def import_cpu(
    module: str, preload: str, *, pythonpath: str | None, repeats: int
) -> tuple[float, list[str]]:
    """(median CPU s, heavy modules loaded) of importing ``module`` in ``repeats`` new processes."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    samples, heavy = [], []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, module, preload, ",".join(HEAVY)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        cpu, heavy = json.loads(done.stdout.strip().splitlines()[-1])
        samples.append(cpu)
    return statistics.median(samples), heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"--repeats ({args.repeats}) must be >= 1")
    rows = []
    with baseline_tree(args.baseline) as (commit, _tree, path):
        for module, preload, runner in ENTRIES:
            before, heavy_before = import_cpu(
                module, preload, pythonpath=path, repeats=args.repeats
            )
            after, heavy_after = import_cpu(module, preload, pythonpath=None, repeats=args.repeats)
            rows.append(
                [
                    module.removeprefix("dprelease."),
                    f"+{preload}" if preload else "-",
                    runner,
                    f"{before:.2f}",
                    f"{after:.2f}",
                    f"{after / before:.2f}x",
                    ",".join(heavy_before) or "-",
                    ",".join(heavy_after) or "-",
                ]
            )
    print(f"baseline {args.baseline} ({commit[:10]}); median CPU s of {args.repeats} processes")
    headers = ["module", "preloaded", "run by", "baseline s", "now s", "now/baseline"]
    print_table([*headers, "heavy (baseline)", "heavy (now)"], rows)


if __name__ == "__main__":
    main()
