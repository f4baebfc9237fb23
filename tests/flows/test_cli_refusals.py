"""``dprelease`` refusals that must be cheap and say what to do (issue 26), in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.flow
ROOT = Path(__file__).resolve().parents[2]

AS_PROGRAM = """
import json, sys
from dprelease.flows.cli import app
sys.argv = ["dprelease", *sys.argv[1:]]
try:
    app()
    code = 0
except SystemExit as exc:
    code = exc.code
loaded = sorted(
    m for m in ("prefect", "great_expectations", "dprelease.catalog.planning.planner")
    if m in sys.modules
)
print(json.dumps({"code": code, "loaded": loaded}))
"""


def _program(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "DPRELEASE_DEBUG")}
    env["DPRELEASE_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-c", AS_PROGRAM, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _verdict(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mechanism", ["identity", "auto"])
def test_a_1e14_cell_identity_workload_is_refused_before_planning_or_prefect(
    tmp_path: Path, mechanism: str
) -> None:
    spec = {
        "name": "huge",
        "dataset": {"id": "huge", "source": "none.parquet", "budget": {"epsilon": 10.0}},
        "domain": {
            "a": {"min": 0, "max": 9999},
            "b": {"min": 0, "max": 9999},
            "c": {"min": 0, "max": 9999},
            "d": {"min": 0, "max": 99},
        },
        "workload": [{"name": "all", "marginal": ["a", "b", "c", "d"]}],
        "mechanism": mechanism,
        "privacy": {"epsilon": 1.0},
    }
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _program(tmp_path / "home", "run", str(path), "--out", str(tmp_path / "out"))
    # Before issue 26 the plan was made (seconds, gigabytes of Gram matrices) inside Prefect.
    assert _verdict(result) == {"code": 2, "loaded": []}, result.stderr
    assert "the output tables would have at least 100,000,000,000,000 rows" in result.stderr
    assert "what to do: fix the spec" in result.stderr
