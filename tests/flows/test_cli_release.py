"""The CLI end to end: run a spec, see it in the catalog and the ledger, verify, reject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dprelease.flows.cli import app
from tests.flows.conftest import write_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]
runner = CliRunner()


def test_run_review_reject_budget_and_verify(tmp_path: Path, tiny_dataset: Path) -> None:
    spec_path = write_spec(tmp_path, tiny_dataset, mechanism="hierarchical")
    result = runner.invoke(app, ["run", str(spec_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    release_id = result.stdout.split("release id:")[1].split()[0]
    directory = tmp_path / "out" / release_id
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["mechanism"]["name"] == "hierarchical"
    assert manifest["mechanism"]["noise"]["sampler"].startswith("opendp")

    listed = runner.invoke(app, ["releases", "--status", "staged"])
    assert release_id in listed.stdout
    assert runner.invoke(app, ["verify", str(directory)]).exit_code == 0

    dataset_id = manifest["dataset_id"]
    before = runner.invoke(app, ["budget", dataset_id]).stdout
    rejected = runner.invoke(
        app, ["review", release_id, "--reject", "--reviewer", "Grace", "--note", "too coarse"]
    )
    assert rejected.exit_code == 0 and "rejected" in rejected.stdout
    after = runner.invoke(app, ["budget", dataset_id]).stdout
    assert "spent epsilon=1" in before and "spent epsilon=1" in after  # rejection refunds nothing
    again = runner.invoke(app, ["review", release_id, "--approve", "--reviewer", "Grace"])
    # a refused review is a user error: exit 2 with what to do (issue 13)
    assert again.exit_code == 2 and "only a staged release can be reviewed" in again.output
    assert runner.invoke(app, ["verify", str(directory)]).exit_code == 0

    manifest_path = directory / "manifest.json"
    manifest_path.write_text(manifest_path.read_text().replace('"hierarchical"', '"identity"', 1))
    tampered = runner.invoke(app, ["verify", str(directory)])
    assert tampered.exit_code == 1 and "manifest.json was modified" in tampered.output


def test_a_command_runs_its_flow_without_heartbeats(
    tmp_path: Path, tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flow run inside `run`/`demo` sends no Prefect heartbeats (joining their thread cost
    ~0.5-1 s per command); the setting is changed for that flow only."""
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    import dprelease.flows.release_flow

    seen: dict[str, object] = {}

    def record_settings(**_: object) -> None:
        seen["heartbeat"] = get_current_settings().flows.heartbeat_frequency
        raise RuntimeError("stopped by the test")

    monkeypatch.setattr(dprelease.flows.release_flow, "run_release", record_settings)
    spec_path = write_spec(tmp_path, tiny_dataset, mechanism="identity")
    # the harness runs its flows without heartbeats: this test restores Prefect's default
    with temporary_settings(restore_defaults={PREFECT_FLOWS_HEARTBEAT_FREQUENCY}):
        default = get_current_settings().flows.heartbeat_frequency
        result = runner.invoke(app, ["run", str(spec_path), "--out", str(tmp_path / "out")])
        after = get_current_settings().flows.heartbeat_frequency
    assert result.exit_code != 0 and "internal error: RuntimeError" in result.output
    assert seen == {"heartbeat": None}
    assert default is not None and after == default
