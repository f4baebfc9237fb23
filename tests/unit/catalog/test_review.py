"""Audited review (``catalog.review.decisions``): idempotent approval and normalised reviewer names.

A staged release is built by hand (a table, validation results, a report, a manifest recorded in
the catalog, one ledger charge) so these tests depend only on the catalog and artifacts layers.  The
report renderer is replaced by one that writes the review trail it was given, so each test can see
that the report was re-rendered with the decision.  Crashes are simulated at each step of an
approval; re-running the approval must finish the publication without a second review record.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dprelease.catalog.errors import CatalogError, SpecError, VerificationError
from dprelease.catalog.ledger.names import normalize_reviewer, same_person
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.artifacts import verify
from dprelease.catalog.review import decisions as review_module
from dprelease.catalog.review.decisions import review
from dprelease.catalog.review.policy import OPERATOR_ENV, current_operator, policy_of, record_policy
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.flows.cli.release import bundled_spec
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.privacy.test_stuck_releases import measuring

RELEASE = "rel-1"


class SimulatedCrash(Exception):
    pass


def fake_report(directory: Path, manifest: dict[str, Any], catalog: Catalog) -> None:
    (directory / "report.html").write_text(
        "<html>" + json.dumps(manifest["review"], sort_keys=True) + "</html>"
    )


@dataclass(frozen=True, kw_only=True)
class Staged:
    catalog: Catalog
    directory: Path
    published: Path
    input_path: Path


def build_staged(root: Path, *, release_id: str = RELEASE, url: str | None = None) -> Staged:
    """A staged release under ``root/releases`` whose catalog is ``url`` (``root/catalog.db``)."""
    catalog = Catalog(url or f"sqlite:///{root}/catalog.db")
    catalog.ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=2.0))
    measuring(catalog, release_id)  # registered and charged 0.5
    input_path = root / "input.parquet"
    pq.write_table(pa.table({"age": [1, 2, 3]}), input_path)
    from dprelease.catalog.confidential.source import content_fingerprint

    directory = root / "releases" / release_id
    (directory / "tables").mkdir(parents=True)
    (directory / "validation").mkdir()
    pq.write_table(pa.table({"estimate": [1.0, 2.0]}), directory / "tables" / "t.parquet")
    (directory / "validation" / "results.json").write_text(json.dumps({"success": True}))
    [entry] = [e for e in catalog.ledger_entries("ds") if e.release_id == release_id]
    manifest = {
        "release_id": release_id,
        "dataset_id": "ds",
        "tables": ["t"],
        "input_fingerprint": content_fingerprint((str(input_path),), None, key=catalog.key),
        artifacts.MANIFEST_KEY_ID: catalog.fingerprint_key_id(),
        artifacts.MANIFEST_CHAIN_HEAD: catalog.chain_head("ds").as_dict(),
        "ledger_receipts": [entry.receipt()],
        "review": {"status": "staged", "trail": []},
    }
    fake_report(directory, manifest, catalog)
    digest = artifacts.write_manifest(directory, manifest)
    catalog.update_release(
        release_id, status="staged", directory=str(directory), manifest_sha256=digest
    )
    return Staged(
        catalog=catalog,
        directory=directory,
        published=root / "published" / release_id,
        input_path=input_path,
    )


@pytest.fixture
def staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Staged:
    monkeypatch.setattr(review_module, "write_report", fake_report)
    return build_staged(tmp_path)


def manifest_of(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "manifest.json").read_text())


def record_approval(staged: Staged) -> None:
    staged.catalog.record_review(
        RELEASE,
        decision="approved",
        reviewer="Ada",
        note="looks right",
        published_directory=str(staged.published.resolve()),
    )


def approve(staged: Staged, reviewer: str = "Ada", **kwargs: Any) -> dict[str, Any]:
    return review(
        staged.catalog, RELEASE, approve=True, reviewer=reviewer, note="looks right", **kwargs
    )


def assert_published_once(staged: Staged, reviewer: str = "Ada") -> None:
    record = staged.catalog.release(RELEASE)
    assert record.status == "published"
    assert record.published_directory == str(staged.published.resolve())
    assert [(r.decision, r.reviewer) for r in staged.catalog.reviews(RELEASE)] == [
        ("approved", reviewer)
    ]
    for directory in (staged.directory, staged.published):
        manifest = manifest_of(directory)
        assert manifest["review"]["status"] == "published"
        assert [(t["decision"], t["reviewer"]) for t in manifest["review"]["trail"]] == [
            ("approved", reviewer)
        ]
        assert f'"reviewer": "{reviewer}"' in (directory / "report.html").read_text()
        assert verify(directory, staged.catalog) == []
    assert not list(staged.published.parent.glob(".*partial*"))


# --- the normal paths ------------------------------------------------------------------------------------


def test_staged_release_verifies(staged: Staged) -> None:
    assert verify(staged.directory, staged.catalog) == []


def test_approval_publishes_a_copy(staged: Staged) -> None:
    result = approve(staged)
    assert result == {
        "release_id": RELEASE,
        "status": "published",
        "published_directory": str(staged.published.resolve()),
    }
    assert_published_once(staged)


def test_rejection_keeps_the_release_unpublished(staged: Staged) -> None:
    result = review(staged.catalog, RELEASE, approve=False, reviewer="Bob", note="too noisy")
    assert result == {"release_id": RELEASE, "status": "rejected"}
    assert manifest_of(staged.directory)["review"]["status"] == "rejected"
    assert not staged.published.exists()
    assert staged.catalog.spent("ds") == PrivacyCost(measure="pure", epsilon=0.5)
    assert verify(staged.directory, staged.catalog) == []
    with pytest.raises(CatalogError, match=r"is rejected; only a staged release can be reviewed"):
        approve(staged)


def test_approval_is_refused_before_recording_when_the_target_exists(staged: Staged) -> None:
    staged.published.mkdir(parents=True)
    with pytest.raises(
        CatalogError, match=r"published copy .* already exists; refusing to overwrite"
    ):
        approve(staged)
    assert staged.catalog.release(RELEASE).status == "staged"
    assert staged.catalog.reviews(RELEASE) == []


# --- crashes during an approval, then the same approval again -------------------------------------------


def test_crash_between_approval_and_publication(
    staged: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(directory: Path, destination: Path) -> Path:
        raise SimulatedCrash("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(artifacts, "publish", crash)
        with pytest.raises(SimulatedCrash):
            approve(staged)
    record = staged.catalog.release(RELEASE)
    assert record.status == "approved" and not staged.published.exists()
    with pytest.raises(VerificationError, match=r"is approved but its publication did not finish"):
        verify(staged.directory, staged.catalog)
    result = approve(staged, reviewer="Somebody Else")  # the recorded decision stands
    assert result["status"] == "published"
    assert_published_once(staged)


def test_crash_right_after_the_decision_was_recorded(staged: Staged) -> None:
    """Nothing but the catalog's review record was written; an interrupted copy was left behind."""
    record_approval(staged)  # as the first attempt did before it crashed
    leftover = staged.published.parent / f".{RELEASE}.partial-deadbeef"
    (leftover / "tables").mkdir(parents=True)
    (leftover / "tables" / "t.parquet").write_bytes(b"half a file")
    assert manifest_of(staged.directory)["review"]["trail"] == []
    approve(staged)
    assert_published_once(staged)
    assert not leftover.exists()


def test_crash_after_the_copy_before_the_status(
    staged: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Catalog.update_release

    def crash_on_publish(self: Catalog, release_id: str, **values: Any) -> None:
        if values.get("status") == "published":
            raise SimulatedCrash("killed")
        original(self, release_id, **values)

    with monkeypatch.context() as patch:
        patch.setattr(Catalog, "update_release", crash_on_publish)
        with pytest.raises(SimulatedCrash):
            approve(staged)
    assert staged.catalog.release(RELEASE).status == "approved"
    assert staged.published.is_dir()  # the complete copy is there
    approve(staged)
    assert_published_once(staged)


def test_approving_a_published_release_again_changes_nothing(staged: Staged) -> None:
    first = approve(staged)
    manifest = (staged.published / "manifest.json").read_bytes()
    assert approve(staged, reviewer="Bob") == first
    assert (staged.published / "manifest.json").read_bytes() == manifest
    assert_published_once(staged)


def test_approved_release_cannot_be_rejected(staged: Staged) -> None:
    staged.catalog.record_review(RELEASE, decision="approved", reviewer="Ada", note="")
    with pytest.raises(
        CatalogError, match=r"release 'rel-1' is approved; an approved release cannot be rejected"
    ):
        review(staged.catalog, RELEASE, approve=False, reviewer="Bob", note="")
    assert len(staged.catalog.reviews(RELEASE)) == 1


def test_resumed_approval_keeps_its_publication_target(staged: Staged, tmp_path: Path) -> None:
    record_approval(staged)  # as the first attempt did before it crashed
    with pytest.raises(
        CatalogError,
        match=r"was approved for publication to .*published; re-run without --publish-dir",
    ):
        approve(staged, publish_dir=tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()
    approve(staged, publish_dir=staged.published.parent)  # the same place is fine
    assert_published_once(staged)


def test_crash_during_a_rejection_is_finished_by_rejecting_again(staged: Staged) -> None:
    staged.catalog.record_review(RELEASE, decision="rejected", reviewer="Bob", note="no")
    assert manifest_of(staged.directory)["review"]["status"] == "staged"
    review(staged.catalog, RELEASE, approve=False, reviewer="Bob", note="no")
    review(staged.catalog, RELEASE, approve=False, reviewer="Bob", note="no")
    manifest = manifest_of(staged.directory)
    assert manifest["review"]["status"] == "rejected"
    assert [t["decision"] for t in manifest["review"]["trail"]] == ["rejected"]
    assert len(staged.catalog.reviews(RELEASE)) == 1
    assert verify(staged.directory, staged.catalog) == []


def test_approval_without_a_review_record_is_reported(staged: Staged) -> None:
    staged.catalog.update_release(RELEASE, status="approved")  # edited outside dprelease
    with pytest.raises(
        CatalogError, match=r"is approved but the catalog holds no such review record"
    ):
        approve(staged)


# --- reviewer names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "recorded"),
    [("Ada", "Ada"), ("  Ada Lovelace\t", "Ada Lovelace"), ("Ａｄａ", "Ada"), ("ﬁona", "fiona")],
    ids=["plain", "padded", "fullwidth", "ligature"],
)
def test_reviewer_name_is_nfkc_normalised(staged: Staged, given: str, recorded: str) -> None:
    approve(staged, reviewer=given)
    assert_published_once(staged, reviewer=recorded)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "\u200b",
            r"reviewer '\\u200b' must be printable text: character U\+200B \(ZERO WIDTH SPACE\) at position 0 is not printable",
        ),
        (
            "Ada\u202eecilA",
            r"character U\+202E \(RIGHT-TO-LEFT OVERRIDE\) at position 3 is not printable",
        ),
        ("Ada\nLovelace", r"character U\+000A \(unnamed\) at position 3 is not printable"),
        ("", r"reviewer must name a person \(got an empty string\)"),
        ("\u3000 ", r"reviewer must name a person"),
        ("A" * 129, r"reviewer must be at most 128 characters \(got 129\)"),
    ],
    ids=["zero-width-space", "bidi-override", "newline", "empty", "ideographic-space", "too-long"],
)
def test_unprintable_or_empty_reviewer_is_refused(staged: Staged, given: str, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        approve(staged, reviewer=given)
    assert staged.catalog.release(RELEASE).status == "staged"
    assert staged.catalog.reviews(RELEASE) == []
    assert not staged.published.exists()


def test_catalog_refuses_an_unprintable_reviewer_too(staged: Staged) -> None:
    with pytest.raises(CatalogError, match=r"U\+200B"):
        staged.catalog.record_review(RELEASE, decision="approved", reviewer="\u200b", note="")
    assert staged.catalog.reviews(RELEASE) == []


def test_published_copy_is_complete_or_absent(
    staged: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real_copytree = shutil.copytree

    def failing_copy(source: Path, target: Path) -> None:
        calls.append(target)
        real_copytree(source / "tables", Path(target) / "tables")
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(artifacts.shutil, "copytree", failing_copy)
        with pytest.raises(CatalogError, match=r"publishing rel-1 to .* failed: disk full"):
            approve(staged)
    assert calls and not staged.published.exists()
    assert not list(staged.published.parent.glob(".*"))  # the partial copy was removed
    approve(staged)
    assert_published_once(staged)


# --- separation of duties: a spec's review policy (issue 17 item 5) -----------------------------------


def policy_spec(**review: Any) -> ReleaseSpec:
    data = yaml.safe_load(bundled_spec().read_text())
    data["review"] = review
    return parse_spec(data)


@pytest.fixture
def two_approvers(staged: Staged, monkeypatch: pytest.MonkeyPatch) -> Staged:
    """``staged``, registered by operator Olga under a spec that needs two approvals."""
    monkeypatch.setenv(OPERATOR_ENV, "Olga")
    record_policy(staged.catalog, release_id=RELEASE, spec=policy_spec(approvers=2))
    return staged


def test_two_distinct_approvers_publish_and_the_trail_shows_both(two_approvers: Staged) -> None:
    staged = two_approvers
    first = approve(staged, reviewer="Ada")
    assert first == {
        "release_id": RELEASE,
        "status": "staged",
        "approvals": ["Ada"],
        "required_approvals": 2,
    }
    assert not staged.published.exists()
    review_section = manifest_of(staged.directory)["review"]
    assert review_section["status"] == "staged"
    assert (review_section["required_approvals"], review_section["operator"]) == (2, "Olga")
    assert [(t["decision"], t["reviewer"]) for t in review_section["trail"]] == [
        ("approved", "Ada")
    ]
    assert verify(staged.directory, staged.catalog) == []  # the new manifest hash is recorded

    second = approve(staged, reviewer="Bob")
    assert second["status"] == "published"
    for directory in (staged.directory, staged.published):
        section = manifest_of(directory)["review"]
        assert section["status"] == "published"
        assert [(t["decision"], t["reviewer"]) for t in section["trail"]] == [
            ("approved", "Ada"),
            ("approved", "Bob"),
        ]
        assert verify(directory, staged.catalog) == []
    assert review_module.status(staged.catalog, RELEASE)["approvals_missing"] == 0


@pytest.mark.parametrize("again", ["Ada", "  ada ", "ADA", "Ａｄａ"])
def test_one_reviewer_cannot_approve_twice(two_approvers: Staged, again: str) -> None:
    approve(two_approvers, reviewer="Ada")
    with pytest.raises(
        CatalogError,
        match=r"reviewer '.*' already approved release 'rel-1'; it needs 2 approvals by distinct",
    ):
        approve(two_approvers, reviewer=again)
    assert two_approvers.catalog.release(RELEASE).status == "staged"
    assert len(two_approvers.catalog.reviews(RELEASE)) == 1


@pytest.mark.parametrize("name", ["Olga", " olga", "OLGA"])
def test_the_operator_may_not_approve(two_approvers: Staged, name: str) -> None:
    with pytest.raises(
        CatalogError,
        match=r"reviewer '.*' ran release 'rel-1' \(operator 'Olga'\) and may not approve it: "
        r"it needs 2 approval\(s\) by someone other than the person who ran it",
    ):
        approve(two_approvers, reviewer=name)
    assert two_approvers.catalog.reviews(RELEASE) == []
    approve(two_approvers, reviewer="Ada")
    with pytest.raises(CatalogError, match=r"ran release 'rel-1'"):
        approve(two_approvers, reviewer=name)  # not as the second approver either
    assert two_approvers.catalog.release(RELEASE).status == "staged"


def test_one_rejection_decides_and_the_operator_may_withdraw(two_approvers: Staged) -> None:
    approve(two_approvers, reviewer="Ada")
    result = review(
        two_approvers.catalog, RELEASE, approve=False, reviewer="Olga", note="withdrawn"
    )
    assert result == {"release_id": RELEASE, "status": "rejected"}
    trail = manifest_of(two_approvers.directory)["review"]["trail"]
    assert [(t["decision"], t["reviewer"], t["note"]) for t in trail] == [
        ("approved", "Ada", "looks right"),
        ("rejected", "Olga", "withdrawn"),
    ]
    assert verify(two_approvers.directory, two_approvers.catalog) == []


def test_status_says_who_approved_and_what_is_missing(two_approvers: Staged) -> None:
    approve(two_approvers, reviewer="Ada")
    current = review_module.status(two_approvers.catalog, RELEASE)
    assert {k: v for k, v in current.items() if k not in ("trail", "signed")} == {
        "release_id": RELEASE,
        "status": "staged",
        "operator": "Olga",
        "operator_excluded": True,
        "required_approvals": 2,
        "approvers": ["Ada"],
        "approvals_missing": 1,
        "notify": None,
        "notified_at": None,
        "notify_error": None,
    }
    assert [t["reviewer"] for t in current["trail"]] == ["Ada"]
    assert [(t["reviewer"], t["key_id"]) for t in current["signed"]] == [("Ada", None)]


def test_a_release_without_a_policy_needs_one_approval_by_anyone(staged: Staged) -> None:
    policy = policy_of(staged.catalog, RELEASE)
    assert (policy.required_approvals, policy.exclude_operator, policy.operator) == (1, False, None)


def test_a_spec_without_review_needs_one_approval_by_someone_else(
    staged: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: without ``review:`` the operator may no longer approve their own release (before,
    this test approved as the operator and expected ``published``)."""
    monkeypatch.setenv(OPERATOR_ENV, "Ada")
    spec = parse_spec(yaml.safe_load(bundled_spec().read_text()))
    assert spec.review is None
    policy = record_policy(staged.catalog, release_id=RELEASE, spec=spec)
    assert (policy.required_approvals, policy.exclude_operator) == (1, True)
    with pytest.raises(CatalogError) as refused:
        approve(staged, reviewer="ada")
    assert str(refused.value) == (
        f"reviewer 'ada' ran release {RELEASE!r} (operator 'Ada') and may not approve it: it "
        "needs 1 approval(s) by someone other than the person who ran it; ask another reviewer "
        "(a one-person setup sets review: {allow_self_approval: true} in the spec, for releases "
        "run after that)"
    )
    assert staged.catalog.reviews(RELEASE) == []  # refused before anything was recorded
    assert approve(staged, reviewer="Bob")["status"] == "published"


def test_allow_self_approval_lets_the_operator_approve(
    staged: Staged, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OPERATOR_ENV, "Ada")
    spec = policy_spec(allow_self_approval=True)
    policy = record_policy(staged.catalog, release_id=RELEASE, spec=spec)
    assert (policy.required_approvals, policy.exclude_operator) == (1, False)
    assert approve(staged, reviewer="Ada")["status"] == "published"


def test_allow_self_approval_must_be_a_boolean() -> None:
    with pytest.raises(SpecError, match=r"allow_self_approval"):
        policy_spec(allow_self_approval="yes")


def test_allow_self_approval_left_at_its_default_changes_no_spec_hash() -> None:
    assert policy_spec(approvers=2).fingerprint() == (
        policy_spec(approvers=2, allow_self_approval=False).fingerprint()
    )
    assert policy_spec().fingerprint() != policy_spec(allow_self_approval=True).fingerprint()
    assert "allow_self_approval" not in policy_spec(approvers=2).canonical_json()


def test_operator_is_the_declared_name_else_the_login(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPERATOR_ENV, "  Olga  Operator ")
    assert current_operator() == "Olga  Operator"
    monkeypatch.setenv(OPERATOR_ENV, " ")
    monkeypatch.setattr(getpass, "getuser", lambda: "olga")
    assert current_operator() == "olga"

    def no_login() -> str:
        raise KeyError("getpwuid(): uid not found: 4242")

    monkeypatch.setattr(getpass, "getuser", no_login)
    assert current_operator() == f"uid-{os.getuid()}"
    monkeypatch.setenv(OPERATOR_ENV, "Ol\u200bga")
    with pytest.raises(CatalogError, match=r"DPRELEASE_OPERATOR: reviewer 'Ol\\u200bga' must be"):
        current_operator()


def test_required_approvals_below_one_is_refused(staged: Staged) -> None:
    with pytest.raises(CatalogError, match=r"required_approvals \(0\) must be >= 1"):
        staged.catalog.record_review(
            RELEASE, decision="approved", reviewer="Ada", note="", required_approvals=0
        )
    assert staged.catalog.reviews(RELEASE) == []


@pytest.mark.parametrize(
    ("review_section", "message"),
    [
        ({"approvers": 0}, r"review\.approvers: Input should be greater than or equal to 1"),
        ({"approvers": 6}, r"review\.approvers: Input should be less than or equal to 5"),
        ({"approvers": True}, r"review\.approvers: .*a boolean"),
        (
            {"notify": "Reviewers"},
            r"review\.notify: notify \('Reviewers'\) must name a saved Prefect block as "
            r"BLOCK_TYPE/BLOCK_NAME",
        ),
        ({"notify": "custom-webhook/"}, r"review\.notify: notify \('custom-webhook/'\)"),
        ({"quorum": 2}, r"review\.quorum: Extra inputs are not permitted"),
    ],
    ids=["zero", "six", "boolean", "uppercase-block", "no-block-name", "unknown-key"],
)
def test_invalid_review_section_is_refused(review_section: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        policy_spec(**review_section)


def test_valid_review_section() -> None:
    spec = policy_spec(approvers=2, notify="custom-webhook/dprelease-reviewers")
    assert spec.review is not None
    assert (spec.review.approvers, spec.review.notify) == (2, "custom-webhook/dprelease-reviewers")


# --- names that look alike must be alike ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kind"),
    [
        ("Ada\u034f", r"U\+034F \(COMBINING GRAPHEME JOINER\) at position 3 .*default-ignorable"),
        ("A\u3164da", r"U\+1160 \(HANGUL JUNGSEONG FILLER\) at position 1 .*invisible"),
        ("Ada\ufe0f", r"U\+FE0F \(VARIATION SELECTOR-16\) .*default-ignorable"),
        ("A\u2800da", r"U\+2800 \(BRAILLE PATTERN BLANK\) .*a blank symbol: invisible"),
        ("Ada\u2028Bob", r"U\+2028 \(LINE SEPARATOR\) .*a line separator"),
        ("Ada\u200dBob", r"U\+200D \(ZERO WIDTH JOINER\) .*a format character: invisible"),
        ("Ada\x07", r"U\+0007 \(unnamed\) .*a control character"),
        ("Ada\ue000", r"U\+E000 \(unnamed\) .*a private-use character"),
        ("Ada\U000e0041", r"U\+E0041 \(TAG LATIN CAPITAL LETTER A\) .*format"),
    ],
    ids=[
        "cgj",
        "hangul-filler",
        "variation-selector",
        "braille-blank",
        "line-separator",
        "zwj",
        "bell",
        "private-use",
        "tag",
    ],
)
def test_invisible_characters_in_a_name_are_refused(given: str, kind: str) -> None:
    with pytest.raises(CatalogError, match=r"must be printable text: character " + kind):
        normalize_reviewer(given)


def test_same_person_ignores_case_and_spacing_only() -> None:
    assert same_person("Ada Lovelace", "ada  LOVELACE")
    assert not same_person("Ada", "Adam")
    assert not same_person("Ada", "\u0410da")  # Cyrillic A: a different name (see the report)


def test_the_catalog_refuses_a_second_approval_by_the_same_reviewer_itself(staged: Staged) -> None:
    """The atomic check in ``Catalog.record_review``, behind ``check_reviewer``'s early one."""
    staged.catalog.record_review(
        RELEASE, decision="approved", reviewer="Ada", note="", required_approvals=2
    )
    assert staged.catalog.release(RELEASE).status == "staged"
    with pytest.raises(CatalogError, match=r"reviewer 'ada' already approved release 'rel-1'"):
        staged.catalog.record_review(
            RELEASE, decision="approved", reviewer="ada", note="", required_approvals=2
        )
    staged.catalog.record_review(
        RELEASE, decision="approved", reviewer="Bob", note="", required_approvals=2
    )
    assert staged.catalog.release(RELEASE).status == "approved"
