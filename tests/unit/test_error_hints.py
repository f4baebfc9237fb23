"""Every error's "what to do" line fits the error (issue 26 item 2)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dprelease.catalog.errors import (
    CatalogError,
    DataError,
    DprReleaseError,
    SpecError,
    StageTimeLimitExceeded,
    ValidationFailedError,
    VerificationError,
)
from dprelease.flows import errors
from dprelease.flows.cli import app
from dprelease.mechanisms.primitives.privacy import BudgetExceededError, PrivacyError

runner = CliRunner()


def reported(exc: BaseException) -> tuple[int, str]:
    out = io.StringIO()
    code = errors.report(exc, Console(file=out, width=400, color_system=None))
    return code, out.getvalue()


def hint_of(text: str) -> str:
    return text.split("what to do: ", 1)[1].strip()


# Each class's hint names the thing its errors are about.
EXPECTED = [
    (SpecError("privacy.epsilon (-1) must be > 0"), ("fix the spec", "dprelease plan SPEC")),
    (DataError("column 'age' is missing"), ("fix the data", "on_out_of_domain: drop")),
    (BudgetExceededError("budget of dataset 'adult' exceeded"), ("dprelease budget DATASET",)),
    (PrivacyError("measures differ"), ("privacy and dataset.budget",)),
    (VerificationError("hash mismatch"), ("do not publish",)),
    (ValidationFailedError("expectation failed"), ("validation results",)),
    (StageTimeLimitExceeded("stage 'plan' exceeded 10 s"), ("DPRELEASE_STAGE_TIMEOUT",)),
    (CatalogError("release 'x' is not in the catalog"), ("dprelease releases",)),
    (DprReleaseError("bad input"), ("fix the input named above",)),
    (FileNotFoundError(2, "No such file or directory", "/no/such"), ("check that the path",)),
]


@pytest.mark.parametrize(("exc", "phrases"), EXPECTED, ids=lambda v: type(v).__name__)
def test_each_error_class_has_a_hint_about_its_own_error(
    exc: BaseException, phrases: tuple[str, ...]
) -> None:
    code, text = reported(exc)
    assert code in (errors.EXIT_USER, errors.EXIT_CHECK_FAILED)
    for phrase in phrases:
        assert phrase in hint_of(text)


def test_no_two_error_classes_share_a_hint() -> None:
    hints = [hint_of(reported(exc)[1]) for exc, _ in EXPECTED]
    assert len(set(hints)) == len(hints)


def test_a_catalog_refusal_does_not_send_the_user_to_the_budget() -> None:
    """The catalog refuses reviews, paths and settings: the budget is rarely the answer."""
    _, text = reported(CatalogError("reviewer 'ada' already approved release 'r1'"))
    assert "dprelease budget" not in hint_of(text)


def test_a_refusal_carries_its_own_title_and_hint() -> None:
    exc = errors.Refused("the thing is missing", title="cannot go", hint="make the thing")
    code, text = reported(exc)
    assert code == errors.EXIT_USER
    assert text.startswith("error: cannot go: the thing is missing")
    assert hint_of(text) == "make the thing"


def test_watch_on_a_missing_folder_names_it_and_says_to_create_it(tmp_path: Path) -> None:
    missing = tmp_path / "landing"
    result = runner.invoke(app, ["watch", str(missing), "--once", "--dry-run"])
    assert result.exit_code == errors.EXIT_USER, result.output
    assert f"the watch folder {str(missing)!r} does not exist" in result.output
    assert f"what to do: create it (mkdir -p {missing})" in result.output
    assert "dprelease budget" not in result.output


def test_watch_on_a_file_says_it_is_not_a_folder(tmp_path: Path) -> None:
    afile = tmp_path / "landing"
    afile.write_text("")
    result = runner.invoke(app, ["watch", str(afile), "--once", "--dry-run"])
    assert result.exit_code == errors.EXIT_USER
    assert f"the watch folder {str(afile)!r} is not a folder" in result.output


def test_watch_on_a_missing_spec_dir_names_it(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["watch", str(tmp_path), "--spec-dir", str(tmp_path / "specs"), "--dry-run"]
    )
    assert result.exit_code == errors.EXIT_USER
    assert "the --spec-dir" in result.output and "mkdir -p" in result.output


def test_watch_with_once_and_max_polls_says_which_to_give(tmp_path: Path) -> None:
    result = runner.invoke(app, ["watch", str(tmp_path), "--once", "--max-polls", "3"])
    assert result.exit_code == errors.EXIT_USER
    assert "what to do: give --once (two polls) or --max-polls N" in result.output
