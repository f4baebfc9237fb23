"""Predicted against measured peak memory of whole ``dprelease run`` processes.

Usage:
    .venv/bin/python benchmarks/memory_bench.py                 # big spec at 6M rows + the others
    .venv/bin/python benchmarks/memory_bench.py --rows 600000   # quicker: big spec at 600k rows
    .venv/bin/python benchmarks/memory_bench.py --cases demo,marginals

Cases: ``big`` (integer columns a 0..999 and b 0..99, workload marginal [a, b] and all_ranges [a],
epsilon 1; rows generated with a seeded Generator), ``demo`` and ``marginals`` (the bundled
flows/examples specs), ``adult`` and ``rows`` (pipeline_bench's identity cases).

Each case is one fresh ``dprelease run`` subprocess on one state home (the local Prefect server is
started by the first run and then reused, so it is never counted); its peak is the child's
``ru_maxrss`` from ``os.wait4``.  The prediction is ``dprelease plan --json``'s ``memory`` (the
largest stage, the process's imports included).  The ratio predicted / measured must lie in
[0.5, 2].
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "flows" / "examples"
CLI = Path(sys.executable).parent / "dprelease"
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline_bench import (  # noqa: E402
    adult_spec,
    rows_spec,
    write_random_parquet,
    write_spec,
)


def big_spec(home: Path, rows: int) -> Path:
    path = home / f"big-{rows}.parquet"
    columns = {"a": (1000, pa.int64()), "b": (100, pa.int64())}
    write_random_parquet(path, rows, columns, seed=20261128)
    return write_spec(
        home,
        f"big-{rows}",
        {
            "dataset": {"id": f"big-{rows}", "source": str(path), "budget": {"epsilon": 1000}},
            "domain": {"a": {"min": 0, "max": 999}, "b": {"min": 0, "max": 99}},
            "workload": [
                {"name": "ab", "marginal": ["a", "b"]},
                {"name": "ra", "all_ranges": ["a"]},
            ],
            "privacy": {"epsilon": 1.0},
        },
    )


def example_spec(home: Path, name: str) -> Path:
    """A bundled example with a budget large enough for repeated runs in this state home."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    body["dataset"]["source"] = str(EXAMPLES / body["dataset"]["source"])
    body["dataset"]["budget"] = {"epsilon": 1000.0}
    body.pop("name")
    return write_spec(home, Path(name).stem, body)


def predicted(spec: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [str(CLI), "plan", str(spec), "--json"], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)["memory"]


def measured_peak(spec: Path, out: Path, env: dict[str, str]) -> tuple[int, float]:
    """(exit code, peak RSS bytes) of one fresh ``dprelease run`` process."""
    with open(os.devnull, "wb") as devnull:
        child = subprocess.Popen(
            [str(CLI), "run", str(spec), "--out", str(out)],
            env=env,
            stdout=devnull,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        stderr = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        sys.stderr.write(stderr[-2000:])
    return child.returncode, usage.ru_maxrss * 1024.0  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6_000_000, help="rows of the big spec")
    parser.add_argument("--cases", default="big,demo,marginals,adult,rows")
    args = parser.parse_args()
    cases = args.cases.split(",")
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        home = Path(tmp)
        env = dict(os.environ, DPRELEASE_HOME=str(home / "state"))
        env.pop("DPRELEASE_MEMORY_LIMIT", None)  # measure, do not refuse
        builders = {
            "big": lambda: big_spec(home, args.rows),
            "demo": lambda: example_spec(home, "adult-demo.yaml"),
            "marginals": lambda: example_spec(home, "adult-marginals.yaml"),
            "adult": lambda: adult_spec(home),
            "rows": lambda: rows_spec(home, 1_000_000),
        }
        print(f"{'case':<12} {'stage':<12} {'predicted MB':>13} {'measured MB':>12} {'ratio':>6}")
        try:
            for case in cases:
                spec = builders[case]()
                memory = predicted(spec, env)
                code, peak = measured_peak(spec, home / "releases", env)
                ratio = memory["peak_bytes"] / peak
                flag = "" if 0.5 <= ratio <= 2 and code == 0 else "  <-- outside [0.5, 2]"
                if code != 0:
                    flag = f"  (run exit {code})"
                label = case if case != "big" else f"big {args.rows:,}"
                print(
                    f"{label:<12} {memory['peak_stage']:<12} "
                    f"{memory['peak_bytes'] / 1e6:>13,.0f} {peak / 1e6:>12,.0f} {ratio:>6.2f}{flag}",
                    flush=True,
                )
        finally:
            subprocess.run([str(CLI), "server", "stop"], env=env, capture_output=True, check=False)


if __name__ == "__main__":
    main()
