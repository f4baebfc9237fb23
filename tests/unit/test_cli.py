"""CLI behaviour that needs no Prefect: help, plan (text and --json), clear errors and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app, bundled_spec

runner = CliRunner()


def test_help_explains_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("demo", "run", "plan", "budget", "releases", "review", "verify"):
        assert command in result.output
    assert "privacy" in result.output


def test_plan_json_has_the_contract_keys() -> None:
    result = runner.invoke(app, ["plan", str(bundled_spec()), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert set(plan) >= {"chosen", "lower_bound_rmse", "privacy", "candidates"}
    assert plan["privacy"] == {"epsilon": 1.0}
    names = [c["mechanism"] for c in plan["candidates"]]
    assert names == ["identity", "hierarchical", "wavelet", "optimized", "eigen", "lrm", "dawa"]
    for candidate in plan["candidates"]:
        assert set(candidate) >= {"mechanism", "rmse", "total_variance", "seconds"}
    scored = [c for c in plan["candidates"] if c["rmse"] is not None]
    assert all(c["rmse"] >= plan["lower_bound_rmse"] for c in scored)
    dawa = plan["candidates"][-1]
    assert dawa["rmse"] is None and "not available" in dawa["note"]
    eigen = plan["candidates"][-3]
    assert eigen["rmse"] is None and "at most 4096 cells" in eigen["note"]
    lrm = plan["candidates"][-2]
    assert lrm["rmse"] is None and "LRM factors the explicit workload matrix" in lrm["note"]
    best = min(scored, key=lambda c: c["total_variance"])
    assert plan["chosen"] == best["mechanism"] == "optimized"
    # the per-item union is far better than any single Kronecker product on this workload
    identity = next(c for c in plan["candidates"] if c["mechanism"] == "identity")
    assert best["rmse"] < identity["rmse"] / 10


def test_plan_text_output() -> None:
    result = runner.invoke(app, ["plan", str(bundled_spec())])
    assert result.exit_code == 0, result.output
    assert "SVD lower bound" in result.output and "chosen:" in result.output


def test_plan_all_ranges_rmse_matches_the_closed_form(tmp_path: Path) -> None:
    """rho = 0.5 gives unit noise variance per unit L2 sensitivity: identity on all ranges over
    n cells has rmse^2 = mean range length = (n + 2) / 3."""
    spec = {
        "name": "ranges",
        "dataset": {"id": "r", "budget": {"rho": 10}},
        "domain": {"v": {"min": 1, "max": 64}},
        "workload": [{"name": "all", "all_ranges": ["v"]}],
        "mechanism": "identity",
        "privacy": {"rho": 0.5},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    plan = json.loads(runner.invoke(app, ["plan", str(path), "--json"]).stdout)
    identity = next(c for c in plan["candidates"] if c["mechanism"] == "identity")
    assert identity["rmse"] == pytest.approx(((64 + 2) / 3) ** 0.5, rel=1e-6)
    assert plan["chosen"] == "identity"
    # the SVD bound of ALLRANGE(64) is 10787.15 (seed-eigen.md §9)
    assert plan["lower_bound_rmse"] == pytest.approx((10787.15 / (64 * 65 / 2)) ** 0.5, rel=1e-5)


def test_bad_spec_is_a_clear_error_with_exit_code_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    spec = yaml.safe_load(bundled_spec().read_text())
    spec["privacy"] = {"epsilon": -1}
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert "privacy.epsilon (-1.0) must be a finite number > 0" in result.output
    assert "Traceback" not in result.output


def test_missing_spec_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_verify_of_a_folder_without_manifest_fails(tmp_path: Path) -> None:
    result = runner.invoke(app, ["verify", str(tmp_path)])
    assert result.exit_code == 1 and "has no manifest.json" in result.output


def test_review_of_an_unknown_release_fails() -> None:
    result = runner.invoke(app, ["review", "no-such-release", "--approve", "--reviewer", "Ada"])
    assert result.exit_code == 1 and "not in the catalog" in result.output


@pytest.mark.parametrize(
    ("kind", "n", "hdmm"),
    [("all_ranges", 128, 2.599), ("prefix", 128, 2.312)],
    ids=["all-ranges-128", "prefix-128"],
)
def test_optimized_plan_is_at_or_below_hdmm(tmp_path: Path, kind: str, n: int, hdmm: float) -> None:
    """Issue-4 targets (anchors.md §2): rho = 0.5 is unit noise variance per unit L2 sensitivity."""
    item = {"name": "w", kind: ["v"] if kind == "all_ranges" else "v"}
    spec = {
        "name": "t",
        "dataset": {"id": "t", "budget": {"rho": 10}},
        "domain": {"v": {"min": 1, "max": n}},
        "workload": [item],
        "privacy": {"rho": 0.5},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    plan = json.loads(runner.invoke(app, ["plan", str(path), "--json"]).stdout)
    optimized = next(c for c in plan["candidates"] if c["mechanism"] == "optimized")
    assert plan["chosen"] == "optimized"
    assert plan["lower_bound_rmse"] <= optimized["rmse"] <= hdmm
