"""A series on a PostgreSQL catalog with database roles (``dprelease catalog roles``): each period
runs under the operator's login (the plan and period records, per-partition charges), is
published under the reviewer's, and the auditor's read-only login verifies it (including the
series checks: the recorded plan, the charges, the rows re-derived from the recorded
measurements), shows it and reads the series budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dprelease.catalog.review import decisions
from dprelease.flows.cli import app
from tests.privacy.test_postgres_roles import RoleCatalog, role_catalog  # noqa: F401
from tests.unit.catalog.test_series_report import run_period, series_spec, write_period

runner = CliRunner()


def test_a_series_runs_as_operator_is_published_by_a_reviewer_and_audited_read_only(
    role_catalog: RoleCatalog,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    spec = series_spec(data, horizon=2)
    published = []
    for period in (1, 2):
        write_period(data, period)
        with role_catalog.connected("operator") as operator:
            staged = run_period(spec, operator, tmp_path / "out")
        with role_catalog.connected("reviewer") as reviewer:
            outcome = decisions.review(
                reviewer,
                staged.name,
                approve=True,
                reviewer="Ada",
                note="ok",
                publish_dir=tmp_path / "published",
            )
        assert outcome["status"] == "published"
        published.append(outcome["published_directory"])
    with role_catalog.monkeypatch.context() as patch:
        patch.setenv("PGUSER", role_catalog.logins["auditor"])
        patch.setenv("DPRELEASE_CATALOG_URL", role_catalog.url)
        verified = [runner.invoke(app, ["verify", d, "--json"]) for d in published]
        shown = runner.invoke(app, ["show", Path(published[1]).name, "--json"])
        budget = runner.invoke(app, ["budget", "monthly", "--json"])
    for result in (*verified, shown, budget):
        assert result.exit_code == 0, result.output
    assert all(json.loads(v.stdout)["ok"] for v in verified)
    series = json.loads(shown.stdout)["series"]
    assert (series["period"], series["horizon"]) == (2, 2)
    (planned,) = json.loads(budget.stdout)["datasets"][0]["series"]
    assert [r["partition"] for r in planned["periods"]] == ["2026-01.parquet", "2026-02.parquet"]
    assert all(0 < r["spent_rho"] <= r["planned_rho"] * (1 + 1e-9) for r in planned["periods"])
