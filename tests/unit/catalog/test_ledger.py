"""The catalog and its privacy ledger (``catalog.ledger``): charges add up to a hard cap; a refused
charge names requested, spent and cap and writes nothing; costs convert only soundly; dataset
registration is idempotent; the ledger is append-only and a rejected review refunds nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dprelease.catalog import ledger as ledger_package
from dprelease.catalog.errors import BudgetExceededError, CatalogError, MeasureMismatchError
from dprelease.catalog.ledger.budget import DatasetAccountant
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost


def pure(epsilon: float) -> PrivacyCost:
    return PrivacyCost(measure="pure", epsilon=epsilon)


def zcdp(rho: float) -> PrivacyCost:
    return PrivacyCost(measure="zcdp", rho=rho)


def approx(epsilon: float, delta: float) -> PrivacyCost:
    return PrivacyCost(measure="approx", epsilon=epsilon, delta=delta)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(f"sqlite:///{tmp_path}/c.db")


def test_charges_add_up(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=pure(5.0))
    costs = [0.5, 1.25, 2.0]
    receipts = [
        catalog.charge("ds", pure(c), release_id=f"r{k}", label=f"step {k}")
        for k, c in enumerate(costs)
    ]
    assert catalog.spent("ds") == pure(sum(costs))
    entries = catalog.ledger_entries("ds")
    assert [e.receipt_id for e in entries] == receipts
    assert len(set(receipts)) == 3
    assert [e.cost for e in entries] == [pure(c) for c in costs]
    assert [e.release_id for e in entries] == ["r0", "r1", "r2"]
    assert [e.label for e in entries] == ["step 0", "step 1", "step 2"]
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    assert catalog.spent("ds").remaining(catalog.cap("ds")) == pure(1.25)


def test_spending_exactly_the_cap_is_allowed(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=pure(1.0))
    for k in range(10):
        catalog.charge("ds", pure(0.1), release_id=f"r{k}", label="tenth")
    assert catalog.spent("ds").epsilon == pytest.approx(1.0)
    with pytest.raises(BudgetExceededError):
        catalog.charge("ds", pure(1e-6), release_id="more", label="over")


def test_charge_over_the_cap_names_requested_spent_and_cap(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=pure(1.0))
    catalog.charge("ds", pure(0.6), release_id="r1", label="first")
    message = (
        "privacy budget of dataset 'ds' would be exceeded: requested epsilon=0.6, "
        "spent epsilon=0.6, cap epsilon=1 (remaining epsilon=0.4)"
    )
    with pytest.raises(BudgetExceededError, match=re.escape(message)):
        catalog.charge("ds", pure(0.6), release_id="r2", label="second")
    with pytest.raises(BudgetExceededError, match=re.escape(message)):
        catalog.check_budget("ds", pure(0.6))


def test_refused_charge_writes_nothing(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=pure(1.0))
    catalog.charge("ds", pure(0.9), release_id="r1", label="first")
    before = catalog.ledger_entries()
    for attempt in (pure(0.2), zcdp(0.01)):
        with pytest.raises((BudgetExceededError, MeasureMismatchError)):
            catalog.charge("ds", attempt, release_id="r2", label="refused")
    assert catalog.ledger_entries() == before
    assert catalog.spent("ds") == pure(0.9)


def test_check_budget_reads_only(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=zcdp(1.0))
    assert catalog.check_budget("ds", pure(1.0)) == zcdp(0.5)  # returned in the cap's measure
    assert catalog.ledger_entries() == []
    assert catalog.spent("ds") == zcdp(0.0)


def test_pure_cost_converts_to_a_rho_budget(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=zcdp(1.0))
    catalog.charge("ds", pure(1.0), release_id="r1", label="laplace")  # rho = 1^2 / 2
    catalog.charge("ds", zcdp(0.25), release_id="r2", label="gaussian")
    assert [e.cost for e in catalog.ledger_entries("ds")] == [zcdp(0.5), zcdp(0.25)]
    assert catalog.spent("ds") == zcdp(0.75)
    with pytest.raises(
        BudgetExceededError,
        match=re.escape("requested rho=0.32, spent rho=0.75, cap rho=1 (remaining rho=0.25)"),
    ):
        catalog.charge("ds", pure(0.8), release_id="r3", label="laplace")  # 0.8^2 / 2 = 0.32


def test_pure_cost_converts_to_an_approx_budget(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=approx(2.0, 1e-6))
    catalog.charge("ds", pure(0.5), release_id="r1", label="laplace")
    catalog.charge("ds", approx(0.5, 4e-7), release_id="r2", label="gaussian")
    assert catalog.spent("ds") == approx(1.0, 4e-7)
    with pytest.raises(BudgetExceededError, match=r"requested epsilon=0\.5, delta=7e-07"):
        catalog.charge("ds", approx(0.5, 7e-7), release_id="r3", label="delta over")


@pytest.mark.parametrize(
    ("cap", "cost", "message"),
    [
        pytest.param(
            pure(5.0),
            zcdp(0.1),
            r"a zcdp cost \(rho=0\.1\) cannot be charged to a pure budget",
            id="zcdp-on-pure",
        ),
        pytest.param(
            pure(5.0),
            approx(0.1, 1e-9),
            r"a approx cost \(epsilon=0\.1, delta=1e-09\) cannot be charged to a pure budget",
            id="approx-on-pure",
        ),
        pytest.param(
            zcdp(5.0),
            approx(0.1, 1e-9),
            r"cannot be charged to a zcdp budget",
            id="approx-on-zcdp",
        ),
        pytest.param(
            approx(5.0, 1e-6),
            zcdp(0.1),
            r"cannot be charged to a approx budget",
            id="zcdp-on-approx",
        ),
    ],
)
def test_unsound_conversions_are_refused(
    catalog: Catalog, cap: PrivacyCost, cost: PrivacyCost, message: str
) -> None:
    catalog.ensure_dataset("ds", cap=cap)
    with pytest.raises(MeasureMismatchError, match=message):
        catalog.charge("ds", cost, release_id="r", label="x")
    with pytest.raises(MeasureMismatchError, match=message):
        catalog.check_budget("ds", cost)
    assert catalog.ledger_entries() == []


def test_budgets_are_per_dataset(catalog: Catalog) -> None:
    catalog.ensure_dataset("a", cap=pure(1.0))
    catalog.ensure_dataset("b", cap=pure(1.0))
    catalog.charge("a", pure(1.0), release_id="ra", label="all of a")
    catalog.charge("b", pure(0.25), release_id="rb", label="some of b")
    assert catalog.spent("a") == pure(1.0)
    assert catalog.spent("b") == pure(0.25)
    assert [e.release_id for e in catalog.ledger_entries("b")] == ["rb"]
    assert len(catalog.ledger_entries()) == 2


def test_registration_is_idempotent(catalog: Catalog) -> None:
    assert catalog.ensure_dataset("ds", cap=pure(5.0)) == pure(5.0)
    catalog.charge("ds", pure(1.0), release_id="r", label="x")
    assert catalog.ensure_dataset("ds", cap=pure(5.0)) == pure(5.0)
    assert catalog.dataset_ids() == ["ds"]
    assert catalog.spent("ds") == pure(1.0)  # re-registration does not reset the ledger


@pytest.mark.parametrize(
    ("other", "shown"),
    [
        pytest.param(pure(6.0), "{'epsilon': 6.0}", id="larger-cap"),
        pytest.param(pure(4.0), "{'epsilon': 4.0}", id="smaller-cap"),
        pytest.param(zcdp(5.0), "{'rho': 5.0}", id="other-measure"),
    ],
)
def test_registration_with_another_cap_is_refused(
    catalog: Catalog, other: PrivacyCost, shown: str
) -> None:
    catalog.ensure_dataset("ds", cap=pure(5.0))
    message = (
        f"dataset 'ds' is registered with budget {{'epsilon': 5.0}}, but the spec says {shown}; "
        "a lifetime cap cannot be changed by a spec"
    )
    with pytest.raises(CatalogError, match=re.escape(message)):
        catalog.ensure_dataset("ds", cap=other)
    assert catalog.cap("ds") == pure(5.0)


def test_catalog_persists_across_connections(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    first = Catalog(url)
    first.ensure_dataset("ds", cap=pure(2.0))
    receipt = first.charge("ds", pure(1.5), release_id="r", label="x")
    second = Catalog(url)
    assert second.spent("ds") == pure(1.5)
    assert [e.receipt_id for e in second.ledger_entries()] == [receipt]
    with pytest.raises(BudgetExceededError):
        second.charge("ds", pure(1.0), release_id="r2", label="y")


def test_unknown_dataset(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match=r"dataset 'nope' is not in the catalog"):
        catalog.charge("nope", pure(0.1), release_id="r", label="x")
    with pytest.raises(CatalogError, match=r"dataset 'nope' is not in the catalog"):
        catalog.charge_each("nope", {None: pure(0.1)}, release_id="r", label="x")
    with pytest.raises(CatalogError, match=r"dataset 'nope' is not in the catalog"):
        catalog.spent("nope")
    with pytest.raises(CatalogError, match=r"dataset 'nope' is not in the catalog"):
        catalog.check_budget("nope", pure(0.1))
    assert catalog.ledger_entries() == []


def test_dataset_accountant_charges_the_ledger_and_keeps_receipts(catalog: Catalog) -> None:
    catalog.ensure_dataset("ds", cap=pure(1.0))
    accountant = DatasetAccountant(catalog, dataset_id="ds", release_id="rel-1")
    receipt = accountant.charge(pure(0.4), label="measure")
    assert accountant.receipts == [receipt]
    [entry] = catalog.ledger_entries("ds")
    assert (entry.receipt_id, entry.release_id, entry.label) == (receipt, "rel-1", "measure")
    with pytest.raises(BudgetExceededError):
        accountant.charge(pure(0.7), label="too much")
    assert accountant.receipts == [receipt]


# --- append-only, no refunds, reviews ----------------------------------------------------------


def test_ledger_has_no_update_or_delete_api() -> None:
    public = [name for name in dir(Catalog) if not name.startswith("_")]
    forbidden = re.compile(
        r"delete|remove|refund|undo|revert|cancel|drop|clear|reset|update_ledger"
    )
    assert [name for name in public if forbidden.search(name)] == []
    modules = sorted(Path(ledger_package.__file__).parent.glob("*.py"))
    assert len(modules) > 1
    source = "\n".join(module.read_text() for module in modules)
    # the only statements on the ledger table, in every module of the ledger, are inserts and selects
    assert re.findall(r"\bledger\.(update|delete)\(", source) == []
    assert set(re.findall(r"\bledger\.(\w+)\(", source)) == {"insert"}


def staged_release(catalog: Catalog, release_id: str = "rel-1") -> str:
    catalog.ensure_dataset("ds", cap=pure(2.0))
    catalog.create_release(
        release_id=release_id,
        name="demo",
        dataset_id="ds",
        spec_fingerprint="f" * 64,
        mechanism="identity",
    )
    catalog.charge("ds", pure(1.0), release_id=release_id, label="measure")
    catalog.update_release(release_id, status="staged", manifest_sha256="0" * 64)
    return release_id


def test_rejected_review_keeps_the_budget_spent(catalog: Catalog) -> None:
    release_id = staged_release(catalog)
    before = catalog.ledger_entries()
    review = catalog.record_review(
        release_id, decision="rejected", reviewer="Ada", note="too noisy"
    )
    assert review.decision == "rejected"
    assert catalog.release(release_id).status == "rejected"
    assert catalog.spent("ds") == pure(1.0)
    # the charge stays; the decision is anchored by one zero-cost entry after it
    *kept, anchor = catalog.ledger_entries()
    assert kept == before and anchor.kind == "decision" and anchor.release_id == release_id
    assert anchor.cost == pure(0.0)
    assert [(r.decision, r.reviewer, r.note) for r in catalog.reviews(release_id)] == [
        ("rejected", "Ada", "too noisy")
    ]


def test_failed_release_keeps_the_budget_spent(catalog: Catalog) -> None:
    release_id = staged_release(catalog)
    catalog.update_release(release_id, status="failed")
    assert catalog.spent("ds") == pure(1.0)
    assert len(catalog.ledger_entries()) == 1


@pytest.mark.parametrize("status", ["measuring", "failed", "approved", "rejected", "published"])
def test_only_a_staged_release_can_be_reviewed(catalog: Catalog, status: str) -> None:
    release_id = staged_release(catalog)
    catalog.update_release(release_id, status=status)
    with pytest.raises(
        CatalogError,
        match=rf"release 'rel-1' is {status}; only a staged release can be reviewed",
    ):
        catalog.record_review(release_id, decision="approved", reviewer="Ada", note="")
    assert catalog.reviews(release_id) == []
    assert catalog.release(release_id).status == status


def test_second_review_is_refused(catalog: Catalog) -> None:
    release_id = staged_release(catalog)
    catalog.record_review(release_id, decision="approved", reviewer="Ada", note="ok")
    with pytest.raises(CatalogError, match=r"is approved; only a staged release can be reviewed"):
        catalog.record_review(release_id, decision="rejected", reviewer="Bob", note="late")
    assert len(catalog.reviews(release_id)) == 1


@pytest.mark.parametrize("reviewer", ["", "   "], ids=["empty", "blank"])
def test_empty_reviewer_is_refused(catalog: Catalog, reviewer: str) -> None:
    release_id = staged_release(catalog)
    with pytest.raises(CatalogError, match=r"reviewer must name a person"):
        catalog.record_review(release_id, decision="approved", reviewer=reviewer, note="")
    assert catalog.release(release_id).status == "staged"


def test_review_decision_must_be_approved_or_rejected(catalog: Catalog) -> None:
    release_id = staged_release(catalog)
    with pytest.raises(CatalogError, match=r"decision 'maybe' must be 'approved' or 'rejected'"):
        catalog.record_review(release_id, decision="maybe", reviewer="Ada", note="")


def test_review_of_unknown_release(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match=r"release 'ghost' is not in the catalog"):
        catalog.record_review("ghost", decision="approved", reviewer="Ada", note="")


def test_release_status_and_existence_are_checked(catalog: Catalog) -> None:
    release_id = staged_release(catalog)
    with pytest.raises(CatalogError, match=r"status 'done' must be one of"):
        catalog.update_release(release_id, status="done")
    with pytest.raises(CatalogError, match=r"release 'ghost' is not in the catalog"):
        catalog.update_release("ghost", status="failed")
    with pytest.raises(CatalogError, match=r"release 'ghost' is not in the catalog"):
        catalog.release("ghost")
    assert [r.id for r in catalog.releases(dataset_id="ds", status="staged")] == [release_id]
