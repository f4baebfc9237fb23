"""`dprelease plan` of all ranges (Laplace, ``mechanism: optimized``) against HDMM, side by side.

Each row is one whole process (what a user waits for): its wall seconds, its CPU seconds (user +
sys, from ``getrusage`` of the finished child), for ours the seconds of planning work the plan
table reports (``plan s``: without imports and start-up), and the rmse at ε = √2 (unit noise
variance per unit L1 sensitivity, HDMM's README normalisation).  Ours is ``dprelease plan`` on a
fresh state home (cold: nothing in the strategy store) and again warm; HDMM is
``PIdentity(n/16, n).optimize(AllRange(n))`` from a checkout given with ``--hdmm-src`` (its ``src``
directory; HDMM is AGPL and not bundled: the benchmark only runs it), once with the machine's BLAS
threads and once with one thread.

Usage::

    .venv/bin/python benchmarks/hdmm_side_by_side.py --sizes 256,1024 --hdmm-src /tmp/hdmm/src
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = Path(sys.executable).parent / "dprelease"

HDMM_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from hdmm import templates, workload
n = int(sys.argv[2])
w = workload.AllRange(n)
t = templates.PIdentity(n // 16, n)
t.optimize(w)
a = t.strategy().dense_matrix()
sensitivity = np.abs(a).sum(axis=0).max()
total = np.trace(w.gram().dense_matrix() @ np.linalg.pinv(a.T @ a)) * sensitivity**2
print("rmse", np.sqrt(total / (n * (n + 1) / 2)))
"""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, its stdout) of one finished process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


Row = tuple[str, float, float, float, float]
"""(process, wall s, CPU s, rmse, planning work s: the plan table's seconds, NaN for HDMM)."""


def ours(n: int, home: Path, time_budget: float | None) -> list[Row]:
    spec = home / f"ranges-{n}.yaml"
    spec.write_text(
        f"name: ranges-{n}\n"
        f"dataset: {{id: bench-{n}, budget: {{epsilon: 1000}}}}\n"
        f"domain: {{v: {{min: 0, max: {n - 1}}}}}\n"
        "workload: [{name: w, all_ranges: [v]}]\n"
        "mechanism: optimized\n"
        "privacy: {epsilon: 1.0}\n"
    )
    env = dict(os.environ, DPRELEASE_HOME=str(home / f"state-{n}"))
    rows = []
    for label in ("cold", "warm"):
        budget = [] if time_budget is None else ["--time-budget", str(time_budget)]
        wall, cpu, out = timed([str(CLI), "plan", str(spec), *budget], env)
        # the plan table prints rmse at the spec's ε = 1 (ε = √2 divides it by √2) and, in its
        # fifth column, the seconds of planning work (without imports and start-up)
        match = re.search(r"\* optimized\s*│\s*([0-9.]+)(?:\s*│[^│]*){2}│\s*([0-9.]+)", out)
        rmse = float(match.group(1)) / 2**0.5 if match else float("nan")
        work = float(match.group(2)) if match else float("nan")
        rows.append((f"dprelease plan ({label})", wall, cpu, rmse, work))
    return rows


def hdmm(n: int, source: Path, script: Path) -> list[Row]:
    rows = []
    for label, threads in (("machine BLAS threads", None), ("1 BLAS thread", "1")):
        env = dict(os.environ)
        if threads is not None:
            env.update(OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
        wall, cpu, out = timed([sys.executable, str(script), str(source), str(n)], env)
        rows.append((f"HDMM PIdentity ({label})", wall, cpu, float(out.split()[-1]), float("nan")))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="256,1024")
    parser.add_argument("--hdmm-src", type=Path, help="HDMM checkout's src directory (optional)")
    parser.add_argument(
        "--time-budget", type=float, help="passed to `dprelease plan --time-budget` (seconds)"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dprelease-hdmm-") as tmp:
        home = Path(tmp)
        script = home / "hdmm_pidentity.py"
        script.write_text(HDMM_SCRIPT)
        for n in (int(s) for s in options.sizes.split(",")):
            rows = ours(n, home, options.time_budget)
            if options.hdmm_src is not None:
                rows += hdmm(n, options.hdmm_src, script)
            base = rows[2][2] if len(rows) > 2 else float("nan")
            print(
                f"\n## all ranges n={n}, Laplace (ratio = CPU s / HDMM's CPU s, its BLAS threads)"
            )
            print(
                f"{'process':<40} {'wall s':>8} {'CPU s':>8} {'plan s':>8} {'rmse':>8} {'ratio':>7}"
            )
            for name, wall, cpu, rmse, work in rows:
                print(
                    f"{name:<40} {wall:8.2f} {cpu:8.2f} {work:8.2f} {rmse:8.4f} {cpu / base:7.2f}"
                )


if __name__ == "__main__":
    main()
