"""Review that fits an agency (issue 17 item 5), end to end against a real Prefect server.

A webhook HTTP server on 127.0.0.1, started by the test, stands for the reviewers' chat or ticket
system.  ``deploy/setup-notifications.sh`` saves the Custom Webhook notification block on the
Prefect server; a spec with ``review: {approvers: 2, notify: ...}`` is run by operator Olga; the
webhook must receive exactly one notice with public facts only; Olga may not approve, one reviewer
may not approve twice, two others publish; the trail shows every decision.  A webhook that fails
leaves the release staged with the error recorded, and ``dprelease notify send`` delivers later.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dprelease.flows.cli import app
from tests.flows.conftest import write_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Webhook:
    """What the local webhook server received; ``status`` is what it answers."""

    url: str
    status: int = 200
    received: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            hook.received.append(
                {
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "json": json.loads(self.rfile.read(length)),
                }
            )
            self.send_response(hook.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hook.url = f"http://127.0.0.1:{server.server_port}/hooks/reviewers"
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def save_block_with_the_deploy_script(tmp_path: Path, url: str) -> str:
    """Run deploy/setup-notifications.sh against the test's Prefect server; the block's name."""
    from prefect.settings import PREFECT_API_URL

    name = f"reviewers-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "DPRELEASE_HOME": str(tmp_path / "deploy-home"),
        "DPRELEASE_VENV": str(Path(sys.executable).parent.parent),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "setup-notifications.sh"), name, url, "X-Token: s3cret"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"saved custom-webhook/{name}" in done.stdout
    return name


def run_release(tmp_path: Path, spec_path: Path) -> tuple[str, str]:
    result = runner.invoke(app, ["run", str(spec_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    return result.stdout.split("release id:")[1].split()[0], result.output


def test_staged_release_notifies_and_needs_two_approvers_other_than_the_operator(
    tmp_path: Path, tiny_dataset: Path, webhook: Webhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = save_block_with_the_deploy_script(tmp_path, webhook.url)
    monkeypatch.setenv("DPRELEASE_OPERATOR", "Olga")
    spec_path = write_spec(
        tmp_path,
        tiny_dataset,
        mechanism="identity",
        review={"approvers": 2, "notify": f"custom-webhook/{block}"},
    )
    release_id, output = run_release(tmp_path, spec_path)
    assert "review:     2 approval(s) by distinct reviewers, not Olga (who ran it)" in output
    assert f"notified:   reviewers, through custom-webhook/{block}" in output

    [notice] = webhook.received
    assert notice["path"] == "/hooks/reviewers"
    assert notice["headers"]["x-token"] == "s3cret"  # kept as a block secret, sent as a header
    assert notice["json"]["subject"] == f"dprelease: release {release_id} awaits review"
    assert notice["json"]["source"] == "dprelease reviewers"
    shown = json.loads(runner.invoke(app, ["show", release_id, "--json"]).stdout)
    dataset_id = shown["release"]["dataset_id"]
    report = Path(shown["paths"]["report"])
    assert report.is_file()
    # Exactly these public facts and nothing else: no count, no released value.
    assert notice["json"]["body"].splitlines() == [
        f"release: {release_id}",
        f"dataset: {dataset_id}",
        "spec: tiny",
        "privacy budget spent (whatever the decision): epsilon=1",
        "approvals needed: 2 (distinct reviewers, not Olga, who ran it)",
        f"report: {report}",
        f"decide: dprelease review {release_id} --approve|--reject --reviewer NAME",
    ]

    own = runner.invoke(app, ["review", release_id, "--approve", "--reviewer", "olga"])
    assert own.exit_code == 2 and "may not approve it" in own.output
    first = runner.invoke(app, ["review", release_id, "--approve", "--reviewer", "Ada"])
    assert first.exit_code == 0 and f"{release_id}: staged" in first.stdout
    assert (
        "approval 1 of 2 recorded (Ada); the release stays staged until 1 more approver approves"
        in first.stdout
    )
    twice = runner.invoke(app, ["review", release_id, "--approve", "--reviewer", "ADA"])
    assert twice.exit_code == 2 and "already approved" in twice.output
    second = runner.invoke(
        app, ["review", release_id, "--approve", "--reviewer", "Bob", "--note", "fine", "--json"]
    )
    assert second.exit_code == 0, second.output
    decided = json.loads(second.stdout)
    assert decided["status"] == "published" and decided["approvals_missing"] == 0
    assert [(t["decision"], t["reviewer"], t["note"]) for t in decided["trail"]] == [
        ("approved", "Ada", ""),
        ("approved", "Bob", "fine"),
    ]
    published = Path(
        json.loads(runner.invoke(app, ["show", release_id, "--json"]).stdout)["paths"][
            "published_directory"
        ]
    )
    manifest = json.loads((published / "manifest.json").read_text())
    assert manifest["review"]["operator"] == "Olga"
    assert [t["reviewer"] for t in manifest["review"]["trail"]] == ["Ada", "Bob"]
    verified = json.loads(runner.invoke(app, ["verify", str(published), "--json"]).stdout)
    assert verified == {"release_dir": str(published), "ok": True, "problems": []}
    assert len(webhook.received) == 1  # decisions are not broadcast


def test_a_failed_notice_is_recorded_and_sent_again(
    tmp_path: Path, tiny_dataset: Path, webhook: Webhook
) -> None:
    block = save_block_with_the_deploy_script(tmp_path, webhook.url)
    webhook.status = 503
    spec_path = write_spec(
        tmp_path, tiny_dataset, mechanism="identity", review={"notify": f"custom-webhook/{block}"}
    )
    release_id, output = run_release(tmp_path, spec_path)  # the release itself succeeds
    assert "warning: reviewers were not notified" in output and "503" in output
    status = json.loads(runner.invoke(app, ["review", release_id, "--json"]).stdout)
    assert status["status"] == "staged" and status["notified_at"] is None
    assert "503" in status["notify_error"]
    assert (
        webhook.url not in status["notify_error"] and webhook.url not in output
    )  # may hold a token

    webhook.status = 200
    again = runner.invoke(app, ["notify", "send", release_id])
    assert again.exit_code == 0, again.output
    assert len(webhook.received) == 2
    assert webhook.received[0]["json"] == webhook.received[1]["json"]
    status = json.loads(runner.invoke(app, ["review", release_id, "--json"]).stdout)
    assert status["notify_error"] is None and status["notified_at"] is not None

    shown = runner.invoke(app, ["show", release_id])
    assert shown.exit_code == 0, shown.output
    assert f"{release_id}: staged" in shown.stdout
    assert "  mechanism:  identity (central)" in shown.stdout
    assert "  charged:    epsilon=1" in shown.stdout and "ledger #" in shown.stdout
    assert f"  notifies:  custom-webhook/{block}" in shown.stdout
    assert "report.html" in shown.stdout and "table a_by_b:" in shown.stdout


def test_a_block_that_is_not_saved_is_named_in_the_error(
    tmp_path: Path, tiny_dataset: Path
) -> None:
    spec_path = write_spec(
        tmp_path,
        tiny_dataset,
        mechanism="identity",
        review={"notify": "custom-webhook/nobody-here"},
    )
    release_id, output = run_release(tmp_path, spec_path)
    assert "not saved on this Prefect server" in output
    resend = runner.invoke(app, ["notify", "send", release_id])
    assert resend.exit_code == 2
    assert "custom-webhook/nobody-here" in resend.output and "not saved" in resend.output
