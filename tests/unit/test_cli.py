"""CLI behaviour that needs no Prefect: help, plan (text and --json), clear errors and exit codes."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from dprelease.catalog.review import decisions as review_module
from dprelease.catalog.review.policy import OPERATOR_ENV, record_policy
from dprelease.catalog.spec.load import parse_spec
from dprelease.flows.cli import app
from dprelease.flows.cli import budget as budget_cli
from dprelease.flows.cli import review as review_cli
from dprelease.flows.cli.release import bundled_spec
from dprelease.mechanisms import registry
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.unit.catalog.test_review import Staged, build_staged, fake_report, policy_spec

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
    by_name = {c["mechanism"]: c for c in plan["candidates"]}
    assert set(by_name) == set(registry.names(model="central"))  # every candidate, with a reason
    for candidate in plan["candidates"]:
        assert set(candidate) >= {"mechanism", "rmse", "total_variance", "seconds", "status"}
        assert candidate["status"] in ("planned", "unavailable", "skipped", "plan-only")
        assert candidate["rmse"] is not None or candidate["note"]
    scored = [c for c in plan["candidates"] if c["rmse"] is not None]
    assert all(c["rmse"] >= plan["lower_bound_rmse"] for c in scored)
    assert by_name["dawa"]["rmse"] is None and "not available" in by_name["dawa"]["note"]
    assert "at most 4096 cells" in by_name["eigen"]["note"]
    assert "LRM factors the explicit workload matrix" in by_name["lrm"]["note"]
    assert by_name["marginal_space"]["status"] == "unavailable"  # prefix and ranges items
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
    # a user error (issue 13): exit 2 and a hint, no traceback
    assert result.exit_code == 2 and "not in the catalog" in result.output
    assert "what to do: see `dprelease releases`" in result.output


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


# --- failures: short, actionable, no data value (issue 13 item 4) ---------------------------------


def _bad_spec(tmp_path: Path) -> Path:
    spec = yaml.safe_load(bundled_spec().read_text())
    spec["privacy"] = {"epsilon": -1}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    monkeypatch.delenv("DPRELEASE_DEBUG", raising=False)
    return home


def test_a_user_error_is_one_short_block_with_what_to_do(tmp_path: Path, state_home: Path) -> None:
    result = runner.invoke(app, ["run", str(_bad_spec(tmp_path))])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("error: ") and "invalid release spec" in lines[0]
    assert "privacy.epsilon (-1.0) must be a finite number > 0" in result.output
    assert lines[-1].startswith("what to do: fix the spec")
    assert len(lines) <= 5 and "Traceback" not in result.output
    assert not (state_home / "logs").exists()  # a user error writes no log
    assert not (state_home / "server.json").exists()  # refused before any server started


def test_a_long_message_is_cut_to_a_bounded_block(tmp_path: Path, state_home: Path) -> None:
    from dprelease.catalog.errors import SpecError
    from dprelease.flows import errors

    message = "spec.yaml: invalid release spec:\n" + "\n".join(f"  - item {i}" for i in range(40))
    console = _capture_console()
    assert errors.report(SpecError(message), console) == 2
    shown = console.export_text().strip().splitlines()
    assert len(shown) == errors.MAX_MESSAGE_LINES + 1  # the message, cut, then "what to do"
    assert "… and 30 more line(s)" in shown[-2]  # 41 lines, 11 kept


def test_an_internal_error_points_to_a_log_with_the_traceback(
    state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dprelease.catalog.planning.planner

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("planner exploded on value 4242")  # a foreign message: withheld

    monkeypatch.setattr(dprelease.catalog.planning.planner, "make_plan", broken)
    result = runner.invoke(app, ["plan", str(bundled_spec())])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("internal error: RuntimeError; the traceback")
    assert "4242" not in result.output and "Traceback" not in result.output
    logs = list((state_home / "logs").glob("dprelease-*.log"))
    assert len(logs) == 1 and str(logs[0]) in result.output.replace("\n", "")
    text = logs[0].read_text()
    assert "Traceback (most recent call last):" in text
    assert "in broken" in text and 'raise RuntimeError("planner exploded' in text  # the code line
    assert "builtins.RuntimeError: (message withheld" in text
    assert "exploded on value 4242\n" not in text.replace('4242")', "")  # never the message


def test_debug_shows_the_traceback_on_the_terminal(
    state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dprelease.catalog.planning.planner

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(dprelease.catalog.planning.planner, "make_plan", broken)
    result = runner.invoke(app, ["--debug", "plan", str(bundled_spec())])
    assert result.exit_code == 1
    assert (
        "Traceback (most recent call last)" in result.output
        and "RuntimeError: boom" in result.output
    )
    quiet = runner.invoke(app, ["plan", str(bundled_spec())])  # --debug does not stick
    assert quiet.exit_code == 1 and "Traceback" not in quiet.output


def test_debug_shows_a_user_errors_traceback_too(tmp_path: Path, state_home: Path) -> None:
    result = runner.invoke(app, ["--debug", "plan", str(_bad_spec(tmp_path))])
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.output and "what to do:" in result.output


def test_our_messages_are_logged_in_full(state_home: Path) -> None:
    from dprelease.catalog.errors import DprReleaseError
    from dprelease.flows import errors

    class Unexpected(DprReleaseError):
        pass

    try:
        try:
            raise KeyError("4242")  # a foreign exception whose text could be a data value
        except KeyError as inner:
            raise TypeError("plan() takes 1 positional argument but 2 were given") from inner
    except TypeError as exc:
        text = errors.safe_traceback(exc)
    assert "builtins.KeyError: (message withheld" in text and "4242" not in text.split("raise")[0]
    assert "The above exception was the direct cause of:" in text
    assert "builtins.TypeError: plan() takes 1 positional argument but 2 were given" in text
    assert text.index("KeyError") < text.index("builtins.TypeError")  # cause first, like Python
    assert errors.classify(Unexpected("x")) is not None  # every DprReleaseError is a user error


def test_an_unusable_path_is_a_user_error(state_home: Path) -> None:
    from dprelease.flows import errors

    console = _capture_console()
    code = errors.report(PermissionError(13, "Permission denied", "/srv/out"), console)
    assert code == 2
    assert "a path cannot be used: Permission denied: /srv/out" in console.export_text()


def test_ctrl_c_in_a_command_exits_130_without_traceback(
    state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dprelease.catalog.planning.planner

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dprelease.catalog.planning.planner, "make_plan", interrupted)
    result = runner.invoke(app, ["plan", str(bundled_spec())])
    assert result.exit_code == 130
    assert result.output.strip() == "interrupted" and "Traceback" not in result.output


def test_server_stop_refuses_a_server_it_did_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    result = runner.invoke(app, ["server", "stop"])
    assert result.exit_code == 2 and "was not started by dprelease" in result.output
    status = runner.invoke(app, ["server", "status", "--json"])
    assert status.exit_code == 0
    assert json.loads(status.stdout) == {
        "state": "external",
        "url": "http://127.0.0.1:9/api",
        "processes": [],
        "last_used_at": None,
        "stops_after_idle_at": None,
    }


def test_server_status_and_stop_without_a_server(state_home: Path) -> None:
    status = runner.invoke(app, ["server", "status"])
    assert status.exit_code == 0 and status.stdout.startswith("stopped")
    stop = runner.invoke(app, ["server", "stop"])
    assert stop.exit_code == 0 and "no server was running" in stop.stdout


def test_bad_idle_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from dprelease.flows import server

    for bad in ("0", "-5", "soon", "inf", "nan"):
        monkeypatch.setenv("DPRELEASE_SERVER_IDLE_SECONDS", bad)
        with pytest.raises(server.ServerError, match="DPRELEASE_SERVER_IDLE_SECONDS"):
            server.idle_seconds()
    monkeypatch.setenv("DPRELEASE_SERVER_IDLE_SECONDS", "90")
    assert server.idle_seconds() == 90.0


def _capture_console() -> Console:
    return Console(record=True, width=200, file=io.StringIO())


# --- machine-readable reads and full ids (issue 17 items 5 and 6) -----------------------------------

LONG_ID = "adult-demo-monthly-with-a-long-spec-name-20261125T205500Z-0a1b2c"


@pytest.fixture
def staged_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Staged:
    """A staged release (catalog, ledger charge, manifest) in the CLI's $DPRELEASE_HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    monkeypatch.delenv("DPRELEASE_CATALOG_URL", raising=False)
    monkeypatch.setattr(review_module, "write_report", fake_report)
    return build_staged(home, release_id=LONG_ID)


def invoke_json(*args: str, exit_code: int = 0) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout)


def test_releases_json_has_every_field_and_the_full_id(staged_home: Staged) -> None:
    listed = invoke_json("releases", "--json")["releases"]
    assert [r["id"] for r in listed] == [LONG_ID]
    record = listed[0]
    assert (record["dataset_id"], record["status"]) == ("ds", "staged")
    assert record["directory"] == str(staged_home.directory)
    assert record["manifest_sha256"] == staged_home.catalog.release(LONG_ID).manifest_sha256
    assert invoke_json("releases", "--json", "--status", "published") == {"releases": []}


@pytest.mark.parametrize("width", [60, 100, 200])
def test_releases_table_never_shortens_a_release_id(
    staged_home: Staged, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    monkeypatch.setattr(budget_cli, "stdout", Console(width=width, soft_wrap=True))
    result = runner.invoke(app, ["releases"])
    assert result.exit_code == 0, result.output
    assert LONG_ID in result.stdout and "…" not in result.stdout.split("dataset")[0]
    budget = runner.invoke(app, ["budget", "ds"])
    assert budget.exit_code == 0 and LONG_ID in budget.stdout


def test_budget_json_has_cap_spent_remaining_and_the_timeline(staged_home: Staged) -> None:
    staged_home.catalog.charge(
        "ds", PrivacyCost(measure="pure", epsilon=0.25), release_id="r2", label="x"
    )
    [dataset] = invoke_json("budget", "--json")["datasets"]
    assert dataset["dataset_id"] == "ds"
    assert dataset["cap"]["epsilon"] == 2.0
    assert dataset["spent"]["epsilon"] == pytest.approx(0.75)
    assert dataset["remaining"]["epsilon"] == pytest.approx(1.25)
    timeline = dataset["ledger"]
    assert [(e["release_id"], e["label"]) for e in timeline] == [(LONG_ID, "measure"), ("r2", "x")]
    assert [e["cumulative"]["epsilon"] for e in timeline] == pytest.approx([0.5, 0.75])
    assert timeline[-1]["remaining"]["epsilon"] == pytest.approx(1.25)
    assert all(e["receipt_id"].startswith("rcpt-") for e in timeline)
    assert invoke_json("budget", "ds", "--json")["datasets"] == [dataset]
    unknown = runner.invoke(app, ["budget", "nope", "--json"])
    assert unknown.exit_code == 2 and "dataset 'nope' is not in the catalog" in unknown.output


def test_verify_json_reports_ok_or_every_problem(staged_home: Staged) -> None:
    directory = str(staged_home.directory)
    assert invoke_json("verify", directory, "--json") == {
        "release_dir": directory,
        "ok": True,
        "problems": [],
    }
    (staged_home.directory / "tables" / "t.parquet").write_bytes(b"not the released table")
    (staged_home.directory / "extra.txt").write_text("smuggled")
    report = invoke_json("verify", directory, "--json", exit_code=1)
    assert report["ok"] is False
    assert any(p.startswith("artifact tables/t.parquet was modified") for p in report["problems"])
    assert "unexpected file extra.txt is not in the manifest" in report["problems"]


def test_verify_json_of_a_folder_without_manifest(tmp_path: Path, staged_home: Staged) -> None:
    report = invoke_json("verify", str(tmp_path), "--json", exit_code=1)
    assert report["ok"] is False and "has no manifest.json" in report["problems"][0]


def test_two_approvers_through_the_cli_with_json_status(
    staged_home: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OPERATOR_ENV, "Olga")
    record_policy(staged_home.catalog, release_id=LONG_ID, spec=policy_spec(approvers=2))
    status = invoke_json("review", LONG_ID, "--json")
    assert (status["status"], status["operator"], status["approvals_missing"]) == (
        "staged",
        "Olga",
        2,
    )

    own = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "olga"])
    assert own.exit_code == 2 and "ran release" in own.output and "may not approve it" in own.output

    first = invoke_json(
        "review", LONG_ID, "--approve", "--reviewer", "Ada", "--note", "ok", "--json"
    )
    assert (first["status"], first["approvers"], first["approvals_missing"]) == (
        "staged",
        ["Ada"],
        1,
    )
    text = runner.invoke(app, ["review", LONG_ID])
    assert "approvals: 1 of 2 required; 1 missing" in text.stdout
    assert (
        "approved by Ada — ok" in text.stdout and "ran by:    Olga (may not approve)" in text.stdout
    )

    second = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "Bob"])
    assert second.exit_code == 0 and f"{LONG_ID}: published" in second.stdout

    shown = invoke_json("show", LONG_ID, "--json")
    assert shown["release"]["id"] == LONG_ID and shown["release"]["status"] == "published"
    assert [(t["decision"], t["reviewer"]) for t in shown["review"]["trail"]] == [
        ("approved", "Ada"),
        ("approved", "Bob"),
    ]
    assert [r["label"] for r in shown["receipts"]] == ["measure"]
    assert shown["receipts"][0]["charge"]["epsilon"] == 0.5
    paths = shown["paths"]
    assert paths["directory"] == str(staged_home.directory)
    assert paths["table t"] == str(staged_home.directory / "tables" / "t.parquet")
    assert paths["published_directory"] == str(staged_home.published.resolve())
    assert shown["manifest_problem"] is None


def test_the_first_of_two_approvals_says_how_many_are_in_and_missing(
    staged_home: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 3: the approval that does not decide says "1 of 2" and what is missing."""
    monkeypatch.setenv(OPERATOR_ENV, "Olga")
    record_policy(staged_home.catalog, release_id=LONG_ID, spec=policy_spec(approvers=3))
    first = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "Ada"])
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines() == [
        f"{LONG_ID}: staged",
        "approval 1 of 3 recorded (Ada); the release stays staged until 2 more approvers approve",
    ]
    second = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "Bob"])
    assert second.stdout.splitlines()[-1] == (
        "approval 2 of 3 recorded (Ada, Bob); the release stays staged until 1 more approver "
        "approves"
    )
    third = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "Cleo"])
    assert third.exit_code == 0 and "recorded (" not in third.stdout
    assert f"{LONG_ID}: published" in third.stdout


def test_without_a_review_section_the_operator_may_not_approve_through_the_cli(
    staged_home: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 4: the default policy excludes the person who ran the release."""
    monkeypatch.setenv(OPERATOR_ENV, "Olga")
    spec = parse_spec(yaml.safe_load(bundled_spec().read_text()))
    assert spec.review is None
    record_policy(staged_home.catalog, release_id=LONG_ID, spec=spec)
    own = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "olga"])
    assert own.exit_code == 2 and "may not approve it" in own.output
    assert "allow_self_approval: true" in own.output
    other = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "Ada"])
    assert other.exit_code == 0 and f"{LONG_ID}: published" in other.stdout


def test_review_refuses_half_a_command(staged_home: Staged) -> None:
    no_reviewer = runner.invoke(app, ["review", LONG_ID, "--approve"])
    assert no_reviewer.exit_code == 2 and "--reviewer NAME is required" in no_reviewer.output
    no_decision = runner.invoke(app, ["review", LONG_ID, "--reviewer", "Ada"])
    assert no_decision.exit_code == 2 and "add --approve or --reject" in no_decision.output
    assert staged_home.catalog.reviews(LONG_ID) == []


def test_show_text_names_spec_status_charges_and_paths(staged_home: Staged) -> None:
    result = runner.invoke(app, ["show", LONG_ID])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"{LONG_ID}: staged" in out
    assert "rcpt-" in out and "measure" in out
    assert str(staged_home.directory / "report.html") in out
    assert "no decision yet" in out


def test_show_flags_a_manifest_edited_after_the_catalog_recorded_it(staged_home: Staged) -> None:
    manifest = staged_home.directory / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"ds"', '"other"'))
    shown = invoke_json("show", LONG_ID, "--json")
    assert "differs from the manifest the catalog recorded" in shown["manifest_problem"]


def test_show_reads_a_manifest_written_before_model_and_reason(staged_home: Staged) -> None:
    manifest_path = staged_home.directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["mechanism"] = {"name": "identity"}  # no "model", no "reason"
    manifest_path.write_text(json.dumps(manifest))
    result = runner.invoke(app, ["show", LONG_ID])
    assert result.exit_code == 0, result.output
    assert "mechanism:  identity (central)" in result.stdout


def test_show_of_an_unknown_release_is_a_user_error(staged_home: Staged) -> None:
    result = runner.invoke(app, ["show", "no-such-release", "--json"])
    assert result.exit_code == 2 and "not in the catalog" in result.output
    assert result.stdout.strip() == "" or not result.stdout.lstrip().startswith("{")


def test_a_refused_reviewer_never_resumes_a_paused_run(
    staged_home: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dprelease.catalog.watch_state import ReviewRuns

    monkeypatch.setenv(OPERATOR_ENV, "Olga")
    record_policy(staged_home.catalog, release_id=LONG_ID, spec=policy_spec(approvers=2))
    ReviewRuns(staged_home.catalog.url).record(
        release_id=LONG_ID, flow_run_id=str(uuid.uuid4()), api_url="http://127.0.0.1:9/api"
    )

    def resumed(*args: Any, **kwargs: Any) -> bool:
        raise AssertionError("the paused run was resumed with a refused decision")

    monkeypatch.setattr(review_cli, "_resume_paused_run", resumed)
    own = runner.invoke(app, ["review", LONG_ID, "--approve", "--reviewer", "Olga"])
    assert own.exit_code == 2 and "may not approve it" in own.output
    assert staged_home.catalog.reviews(LONG_ID) == []
