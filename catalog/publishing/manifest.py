"""The release manifest: one pydantic model, written by the stage step, read by verify and the report.

Everything in it is public: the spec, fingerprints (the input's is keyed), the mechanism and its
public parameters, the noise it added, the privacy cost, ledger receipts and the review trail.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")
    omitted_when_none: ClassVar[tuple[str, ...]] = ()
    """Fields left out when None: manifests without them (unpartitioned) read as before."""

    @model_serializer(mode="wrap")
    def _without_omitted(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in self.omitted_when_none}


class NoiseRecord(_Record):
    kind: str
    scale: float
    sensitivity: float
    size: int
    sampler: str


class MechanismRecord(_Record):
    name: str
    model: str = "central"
    reason: str
    parameters: dict[str, Any]
    noise: NoiseRecord
    details: dict[str, Any] = {}
    """Mechanism-specific public facts (e.g. a released partition and whether it was reused)."""


class PrivacyRecord(_Record):
    requested: dict[str, float]
    charged: dict[str, float]
    receipts_in_budget_measure: list[dict[str, float]]
    model: str | None = None
    allow_large_delta: bool = False


class BudgetRecord(_Record):
    cap: dict[str, float]
    before: dict[str, float]
    after: dict[str, float]
    remaining: dict[str, float]


class ReceiptRecord(_Record):
    receipt_id: str
    label: str
    cost: dict[str, float]
    paid_by_release: str
    seq: int | None = None
    entry_hash: str | None = None
    partition: str | None = None
    """The partition this entry charged (a partitioned dataset); absent: the whole dataset."""
    omitted_when_none = ("partition",)


class ValidationRecord(_Record):
    success: bool
    results: str


class ReviewEntry(_Record):
    decision: str
    reviewer: str
    note: str
    at: str


class ReviewState(_Record):
    status: str
    required_approvals: int = 1
    """Distinct approvals the release needs (the spec's ``review.approvers``)."""
    operator: str | None = None
    """Who ran the release (``catalog.review.policy``); written with the first decision."""
    trail: list[ReviewEntry] = []
    signatures: list[dict[str, Any]] | None = None
    """Per decision: the key that signed it and in which role, None when unsigned
    (``catalog.review.signatures``); absent while no decision is signed."""
    omitted_when_none = ("signatures",)


class Manifest(_Record):
    release_id: str
    name: str
    dataset_id: str
    created_at: str
    spec: dict[str, Any]
    spec_fingerprint: str
    workload_fingerprint: str
    input_fingerprint: str
    input_fingerprint_key_id: str | None = None
    """Id of the catalog key the (HMAC) input fingerprint was computed with."""
    input_files: list[str]
    code_version: dict[str, str | None]
    privacy_unit: str
    mechanism: MechanismRecord
    privacy: PrivacyRecord
    budget: BudgetRecord
    ledger_receipts: list[ReceiptRecord]
    partitions: dict[str, Any] | None = None
    """A partitioned dataset: ``by``, ``column``, the declared ``assumption`` in words and the
    partitions this release was ``charged`` to (``catalog.partitions``)."""
    ledger_chain_head: dict[str, Any] | None = None
    """The dataset's last ledger entry (seq, entry_hash) after this release's charges."""
    plan: dict[str, Any]
    tables: list[str]
    table_uncertainty: dict[str, str] = {}
    """Per table: what its ``std_error`` covers (e.g. ``noise`` or ``noise+bias``)."""
    derived_tables: dict[str, dict[str, Any]] = {}
    """Per derived table (mean, sum, quantiles): statistic, column, groups, support table, binning
    error per record and how its uncertainty is computed (``catalog.publishing.tables.derived_descriptions``)."""
    validation: ValidationRecord
    review: ReviewState
    artifacts: dict[str, str] = {}
    """sha256 of every artifact file, by path inside the release (added when the manifest is written)."""
    omitted_when_none = ("partitions",)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
