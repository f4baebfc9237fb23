"""What a dataset has spent, in total and per partition, and the refusal of a charge over its cap.

Partitions (parallel composition): a dataset may declare that its partitions (its files, or the
cells of one domain column) hold disjoint sets of people (``dataset.partitions`` in the spec,
recorded as ``datasets.partitioned_by``).  A charge then names the partitions the release reads
and appends one entry per partition, each with the full cost; an entry without a partition is a
whole-dataset charge and counts against every partition.  What a partition has spent is the
whole-dataset charges plus its own; what the dataset has spent (the most any one person has lost,
under the declared assumption) is the whole-dataset charges plus the largest partition's.  Every
partition has the dataset's cap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dprelease.catalog.errors import BudgetExceededError, CatalogError
from dprelease.catalog.ledger.schema import ledger
from dprelease.mechanisms.primitives.privacy import PrivacyCost

MAX_PARTITIONS_PER_RELEASE = 1000  # one ledger entry each, written in one transaction


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    seq: int
    receipt_id: str
    dataset_id: str
    release_id: str
    label: str
    cost: PrivacyCost
    created_at: str
    prev_hash: str | None = None
    entry_hash: str | None = None
    kind: str = "charge"
    partition: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> LedgerEntry:
        fields = row._asdict()
        cost = PrivacyCost(
            **{name: fields.pop(name) for name in ("measure", "epsilon", "rho", "delta")}
        )
        kind, partition = fields.pop("entry_kind"), fields.pop("partition_key")
        return cls(cost=cost, kind=kind, partition=partition, **fields)

    def receipt(self) -> dict[str, Any]:
        """What a manifest records of this charge (``artifacts.verify`` compares every field)."""
        receipt = {
            "receipt_id": self.receipt_id,
            "label": self.label,
            "cost": self.cost.as_dict(),
            "paid_by_release": self.release_id,
            "seq": self.seq,
            "entry_hash": self.entry_hash,
        }
        if self.partition is not None:
            receipt["partition"] = self.partition
        return receipt


@dataclass(frozen=True, kw_only=True)
class PartitionSpending:
    """What one partition of a partitioned dataset has spent (its own charges plus every
    whole-dataset charge) and has left of the dataset's cap.  Public."""

    partition: str
    spent: PrivacyCost
    remaining: PrivacyCost
    entries: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "spent": self.spent.as_dict(),
            "remaining": self.remaining.as_dict(),
            "entries": self.entries,
        }


@dataclass(frozen=True, kw_only=True)
class Spending:
    """A dataset's charges summed per partition: ``whole`` (entries without a partition, which
    count against every partition) and ``parts`` (each partition's own entries)."""

    measure: str
    whole: PrivacyCost
    parts: dict[str, PrivacyCost]
    counts: dict[str, int]

    @classmethod
    def read(cls, conn: Connection, dataset_id: str, measure: str) -> Spending:
        """One GROUP BY over the dataset's entries. O(entries)."""
        rows = conn.execute(
            sa.select(
                ledger.c.partition_key,
                sa.func.coalesce(sa.func.sum(ledger.c.epsilon), 0.0),
                sa.func.coalesce(sa.func.sum(ledger.c.rho), 0.0),
                sa.func.coalesce(sa.func.sum(ledger.c.delta), 0.0),
                sa.func.count(),
            )
            .where(ledger.c.dataset_id == dataset_id, ledger.c.entry_kind == "charge")
            .group_by(ledger.c.partition_key)
        ).all()
        whole = PrivacyCost.zero(measure)
        parts: dict[str, PrivacyCost] = {}
        counts: dict[str, int] = {}
        for key, epsilon, rho, delta, count in rows:
            cost = PrivacyCost(
                measure=measure, epsilon=float(epsilon), rho=float(rho), delta=float(delta)
            )
            if key is None:
                whole = cost
            else:
                parts[key], counts[key] = cost, int(count)
        return cls(measure=measure, whole=whole, parts=parts, counts=counts)

    def worst(self, partitions: tuple[str, ...] | None) -> tuple[str | None, PrivacyCost]:
        """The partition that has spent the most among ``partitions`` (all charged ones when None)
        and the most any of them spent, whole-dataset charges included (None and ``whole`` when
        there is none).  Each component is the largest of any partition's, so a check against it
        is a check against every one.  O(partitions)."""
        names = sorted(self.parts) if partitions is None else list(partitions)
        zero = PrivacyCost.zero(self.measure)
        costs = [self.parts.get(name, zero) for name in names]
        if not costs:
            return None, self.whole
        top = PrivacyCost(
            measure=self.measure,
            epsilon=max(c.epsilon for c in costs),
            rho=max(c.rho for c in costs),
            delta=max(c.delta for c in costs),
        )
        largest = max(range(len(costs)), key=lambda k: (costs[k].epsilon, costs[k].rho))
        return names[largest], self.whole + top

    def check(
        self,
        dataset_id: str,
        charged: PrivacyCost,
        cap: PrivacyCost,
        partitions: tuple[str, ...] | None,
    ) -> None:
        partition, spent = self.worst(partitions)
        if (spent + charged).exceeds(cap):
            raise _over_budget(
                dataset_id, charged, spent, cap, partition=partition if partitions else None
            )


def running_spend(entries: list[LedgerEntry], measure: str) -> list[PrivacyCost]:
    """The spend after each entry (in ``seq`` order, of one dataset): for a partition's entry what
    that partition has spent, for any other entry what the dataset has spent (the whole-dataset
    charges plus the largest partition's); without partitions, the running sum.  Skipped entries
    charge nothing.  O(entries × partitions)."""
    whole, parts = PrivacyCost.zero(measure), {}
    result = []
    for entry in entries:
        if entry.kind == "charge" and entry.partition is None:
            whole = whole + entry.cost
        elif entry.kind == "charge":
            parts[entry.partition] = parts.get(entry.partition, PrivacyCost.zero(measure)) + (
                entry.cost
            )
        spending = Spending(measure=measure, whole=whole, parts=dict(parts), counts={})
        result.append(spending.worst(None if entry.partition is None else (entry.partition,))[1])
    return result


def check_partitions(partitions: tuple[str, ...] | None) -> None:
    if partitions is None:
        return
    if not partitions:
        raise CatalogError("partitions must name at least one partition (None: the whole dataset)")
    if len(set(partitions)) != len(partitions):
        raise CatalogError(f"partitions {list(partitions)[:10]} name a partition twice")
    if len(partitions) > MAX_PARTITIONS_PER_RELEASE:
        raise CatalogError(
            f"a release reads {len(partitions)} partitions; at most "
            f"{MAX_PARTITIONS_PER_RELEASE} are charged by partition (declare coarser partitions, "
            "or drop dataset.partitions to charge the whole dataset once)"
        )
    for name in partitions:
        if not isinstance(name, str) or not name or len(name) > 256:
            raise CatalogError(
                f"partition {name!r} must be a non-empty name of at most 256 characters"
            )


def cap_from_row(row: Any) -> PrivacyCost:
    return PrivacyCost(
        measure=row.measure, epsilon=row.cap_epsilon, rho=row.cap_rho, delta=row.cap_delta
    )


def _over_budget(
    dataset_id: str,
    requested: PrivacyCost,
    spent: PrivacyCost,
    cap: PrivacyCost,
    *,
    partition: str | None = None,
) -> BudgetExceededError:
    where = f"dataset {dataset_id!r}" + (f" partition {partition!r}" if partition else "")
    return BudgetExceededError(
        f"privacy budget of {where} would be exceeded: requested "
        f"{requested.describe()}, spent {spent.describe()}, cap {cap.describe()} "
        f"(remaining {spent.remaining(cap).describe()})"
    )
