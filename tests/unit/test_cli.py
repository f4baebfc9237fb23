"""CLI behaviour that needs no Prefect: help, plan (text and --json), clear errors and exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from flows.cli import app, bundled_spec
from mechanisms import registry

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
    from catalog.errors import SpecError
    from flows import errors

    message = "spec.yaml: invalid release spec:\n" + "\n".join(f"  - item {i}" for i in range(40))
    console = _capture_console()
    assert errors.report(SpecError(message), console) == 2
    shown = console.export_text().strip().splitlines()
    assert len(shown) == errors.MAX_MESSAGE_LINES + 1  # the message, cut, then "what to do"
    assert "… and 30 more line(s)" in shown[-2]  # 41 lines, 11 kept


def test_an_internal_error_points_to_a_log_with_the_traceback(
    state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import catalog.planning

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("planner exploded on value 4242")  # a foreign message: withheld

    monkeypatch.setattr(catalog.planning, "make_plan", broken)
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
    import catalog.planning

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(catalog.planning, "make_plan", broken)
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
    from catalog.errors import DprReleaseError
    from flows import errors

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
    from flows import errors

    console = _capture_console()
    code = errors.report(PermissionError(13, "Permission denied", "/srv/out"), console)
    assert code == 2
    assert "a path cannot be used: Permission denied: /srv/out" in console.export_text()


def test_ctrl_c_in_a_command_exits_130_without_traceback(
    state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import catalog.planning

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(catalog.planning, "make_plan", interrupted)
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
    from flows import server

    for bad in ("0", "-5", "soon", "inf", "nan"):
        monkeypatch.setenv("DPRELEASE_SERVER_IDLE_SECONDS", bad)
        with pytest.raises(server.ServerError, match="DPRELEASE_SERVER_IDLE_SECONDS"):
            server.idle_seconds()
    monkeypatch.setenv("DPRELEASE_SERVER_IDLE_SECONDS", "90")
    assert server.idle_seconds() == 90.0


def _capture_console() -> Console:
    return Console(record=True, width=200, file=io.StringIO())
