"""The validated release spec (cross-field rules, fingerprints) and the workload it implies:
``marginals`` items expanded, derived items' support queries, each item's table size."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from dprelease.catalog.engine import Execution
from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.domain import (
    Attribute,
    IntegerRange,
    NumericBins,
    Strict,
    parse_attribute,
)
from dprelease.catalog.spec.limits import (
    MAX_EXPANDED_MARGINAL_ROWS,
    MAX_EXPANDED_MARGINALS,
    MAX_MARGINAL_PLAN_CELLS,
    MAX_PLAN_CELLS,
    check_large_delta,
    check_privacy_dict,
)
from dprelease.catalog.spec.sections import (
    ID_PATTERN,
    Accuracy,
    DatasetSection,
    Postprocess,
    PrivacyUnit,
    ReviewPolicy,
    Schedule,
    WorkloadItemSpec,
)
from dprelease.catalog.spec.series import SeriesSection, check_series, period_column_partition
from dprelease.mechanisms import registry
from dprelease.mechanisms.derived import BinnedColumn, support_item
from dprelease.mechanisms.primitives.privacy import PrivacyCost, cost_from_dict
from dprelease.mechanisms.primitives.protocol import Objective
from dprelease.mechanisms.primitives.workload import WorkloadItem, magnitude

MARGINAL_KINDS = frozenset({"marginal", "marginals", "total"})
"""Item kinds whose every factor is Identity or Total: a workload of only these is planned from
per-attribute sizes and measured subsets, never a cell index (no product-domain limit)."""


class ReleaseSpec(Strict):
    """A validated release spec.  Build it with :func:`load_spec` or :func:`parse_spec`."""

    name: str = Field(pattern=ID_PATTERN)
    dataset: DatasetSection
    privacy_unit: PrivacyUnit = PrivacyUnit(rows_per_person=1)
    domain: dict[str, Attribute]
    workload: list[WorkloadItemSpec]
    mechanism: str = "auto"
    mechanism_options: dict[str, Any] = Field(default_factory=dict)
    privacy: dict[str, float] | None = None
    accuracy: Accuracy | None = None
    """Accuracy targets instead of ``privacy``: the plan finds the smallest privacy level that
    meets them (:meth:`with_privacy` gives the planned spec)."""
    on_out_of_domain: Literal["error", "drop"] = "error"
    postprocess: Postprocess = Postprocess()
    objective: Objective = "total_variance"
    """What the plan minimises: the sum of every released cell's variance, or the largest variance
    of any released cell (``auto`` picks by it; ``marginal_space`` and ``optimized`` optimise their
    subset-space weights for it on workloads of marginals)."""
    reconstruct: Literal["least_squares", "pgm", "auto"] = "least_squares"
    """``pgm``: consistent, non-negative tables (marginal-space plans; :mod:`catalog.planning.estimators`);
    ``auto``: ``pgm`` where the plan supports it, least squares otherwise."""
    model: Literal["central", "local"] = "central"
    """``local``: users randomise on their devices with a published strategy (``dprelease ldp``);
    ``privacy.epsilon`` is then the per-user ε and ``dataset.source`` holds their responses."""
    schedule: Schedule | None = None
    trigger: Literal["arrival"] | None = None
    review: ReviewPolicy | None = None
    """Separation of duties and reviewer notification; without it one reviewer decides, who is
    not the person who ran the release."""
    allow_large_delta: bool = False
    """Accept ``delta`` above 1e-3 in ``privacy`` and ``dataset.budget`` (shown in manifest/report)."""
    execution: Execution = Execution()
    """Where the run counts and noises: ``{engine: local | dask, address: tcp://…}`` (CLI wins)."""
    on_unchanged: Literal["skip", "release"] = "skip"
    """A scheduled or triggered run whose input and spec equal those of the last release of the
    series (same ``name`` and dataset id): ``skip`` charges nothing and records a ``skipped``
    ledger entry; ``release`` releases again (and pays again)."""
    series: SeriesSection | None = None
    """One release per period over a declared horizon (:mod:`catalog.spec.series`)."""

    @model_validator(mode="after")
    def _check_series(self) -> ReleaseSpec:
        check_series(self)
        return self

    @model_validator(mode="after")
    def _check_partitions(self) -> ReleaseSpec:
        partitions = self.dataset.partitions
        if partitions is None:
            return self
        if self.model == "local":
            raise ValueError(
                "dataset.partitions applies to central releases; a local-model (model: local) "
                "collection is charged as a whole"
            )
        if (
            partitions.by == "column"
            and partitions.column not in self.domain
            and partitions.column != period_column_partition(self)  # a series' periods
        ):
            raise ValueError(
                f"dataset.partitions.column ({partitions.column!r}) must be an attribute of the "
                f"domain (the partitions are its public cells, never values read from the data); "
                f"the domain has {sorted(self.domain)}"
            )
        return self

    @field_validator("domain", mode="before")
    @classmethod
    def _parse_domain(cls, raw: Any) -> dict[str, Attribute]:
        if not isinstance(raw, dict) or not raw:
            raise ValueError("domain must be a non-empty mapping of attribute name to kind")
        return {str(name): parse_attribute(str(name), value) for name, value in raw.items()}

    @field_validator("privacy")
    @classmethod
    def _check_privacy(cls, privacy: dict[str, float] | None) -> dict[str, float] | None:
        return None if privacy is None else check_privacy_dict(privacy, field="privacy")

    @model_validator(mode="after")
    def _check_privacy_or_accuracy(self) -> ReleaseSpec:
        if (self.privacy is None) == (self.accuracy is None):
            raise ValueError(
                "give exactly one of privacy (a privacy level, e.g. {rho: 0.5}) and accuracy "
                "(targets, e.g. {max_std_error: 50}: the smallest privacy level meeting them)"
            )
        targeted = [
            (item.name, field)
            for item in self.workload
            for field in ("max_std_error", "max_half_width")
            if getattr(item, field) is not None
        ]
        if self.accuracy is None:
            if targeted:
                raise ValueError(
                    f"workload item {targeted[0][0]!r}: {targeted[0][1]} needs an accuracy "
                    "section (accuracy: {noise: gaussian} instead of privacy)"
                )
            return self
        half_widths = [name for name, field in targeted if field == "max_half_width"]
        if self.accuracy.noise == "laplace" and (half_widths or self.accuracy.max_half_width):
            raise ValueError(
                "max_half_width targets need accuracy.noise: gaussian (a Laplace release's "
                "intervals are not all of one shape): give max_std_error instead"
            )
        if self.model != "central":
            raise ValueError("accuracy targets apply to central releases (model: central)")
        if "objective" in self.model_fields_set and self.objective != "max_variance":
            raise ValueError(
                f"objective ({self.objective!r}) must be max_variance or left out with accuracy "
                "targets: a target bounds every cell of its table"
            )
        for item in self.workload:
            if item.derived_column is not None:
                raise ValueError(
                    f"workload item {item.name!r}: accuracy targets apply to count tables, not "
                    f"derived statistics ({item.kind})"
                )
            if (
                self.accuracy.std_error(
                    std_error=item.max_std_error, half_width=item.max_half_width
                )
                is None
            ):
                raise ValueError(
                    f"workload item {item.name!r} has no target: give it max_std_error, or "
                    "give accuracy.max_std_error for every table (or max_half_width)"
                )
        return self

    @model_validator(mode="after")
    def _check_weights(self) -> ReleaseSpec:
        """Item weights weigh total variances: refused where nothing sums them."""
        weighted = [item.name for item in self.workload if item.weight is not None]
        if not weighted:
            return self
        where = f"workload item {weighted[0]!r}: weight"
        if self.accuracy is not None:
            raise ValueError(
                f"{where} applies to objective: total_variance; accuracy targets bound every "
                "cell of each table and weigh nothing (give a table a tighter target instead)"
            )
        if self.objective != "total_variance":
            raise ValueError(
                f"{where} applies to objective: total_variance; objective {self.objective!r} "
                "minimises the largest cell variance and weighs nothing"
            )
        if self.model != "central":
            raise ValueError(
                f"{where} applies to central releases (model: central); a local-model "
                "strategy is optimised for the unweighted workload"
            )
        return self

    @field_validator("mechanism")
    @classmethod
    def _check_mechanism(cls, mechanism: str) -> str:
        if mechanism != registry.AUTO and mechanism not in registry.names():
            raise ValueError(
                f"unknown mechanism {mechanism!r}; choose one of "
                f"{', '.join((registry.AUTO, *registry.names()))}"
            )
        return mechanism

    @field_validator("workload")
    @classmethod
    def _check_workload(cls, items: list[WorkloadItemSpec]) -> list[WorkloadItemSpec]:
        if not items:
            raise ValueError("workload must have at least one item")
        names = [item.name for item in items]
        if duplicates := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"workload item names must be unique; repeated: {duplicates}")
        return items

    @model_validator(mode="after")
    def _cross_checks(self) -> ReleaseSpec:
        for k, item in enumerate(self.workload):
            where = f"workload[{k}] ({item.name!r})"
            for attribute in item.referenced_attributes():
                if attribute not in self.domain:
                    raise ValueError(
                        f"{where}: unknown attribute {attribute!r}; the domain has {sorted(self.domain)}"
                    )
            if item.kind in ("prefix", "all_ranges", "ranges"):
                for attribute in item.referenced_attributes():
                    if not self.domain[attribute].ordered:
                        raise ValueError(
                            f"{where}: {item.kind} needs an ordered attribute, but {attribute!r} is "
                            "categorical (give it ordered: true, or use a marginal)"
                        )
            for attribute, pairs in (item.ranges or {}).items():
                if not pairs:
                    raise ValueError(f"{where}: ranges for {attribute!r} must not be empty")
                for pair in pairs:
                    if len(pair) != 2:
                        raise ValueError(f"{where}: range {pair} must be [low, high]")
                    try:
                        lo = self.domain[attribute].value_to_cell(pair[0], edge="low")
                        hi = self.domain[attribute].value_to_cell(pair[1], edge="high")
                    except ValueError as exc:
                        raise ValueError(f"{where}: range {pair} on {attribute!r}: {exc}") from None
                    if lo > hi:
                        raise ValueError(f"{where}: range {pair} on {attribute!r} has low > high")
            if item.derived_column is not None:
                try:
                    derived_column(self, item)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
        if self.privacy_unit.person_column in self.domain:
            raise ValueError(
                f"privacy_unit.person_column ({self.privacy_unit.person_column!r}) must not be a domain attribute"
            )
        registry.check_options(
            requested=self.mechanism, model=self.model, options=self.mechanism_options
        )
        if self.model == "local" and self.privacy is not None:
            if set(self.privacy) != {"epsilon"}:
                raise ValueError(
                    f"model: local needs privacy {{epsilon}} (the per-user epsilon); got {self.privacy}"
                )
            if (
                self.privacy_unit.person_column is not None
                or (self.privacy_unit.rows_per_person or 1) != 1
            ):
                raise ValueError(
                    "model: local needs privacy_unit {rows_per_person: 1} (one response per user)"
                )
        return self

    @model_validator(mode="after")
    def _check_sizes_and_delta(self) -> ReleaseSpec:
        check_large_delta(self.privacy or {}, field="privacy", allowed=self.allow_large_delta)
        check_large_delta(
            self.dataset.budget, field="dataset.budget", allowed=self.allow_large_delta
        )
        cells = self.num_cells
        if self.all_marginals:
            if cells > MAX_MARGINAL_PLAN_CELLS:
                raise ValueError(
                    f"domain has {magnitude(cells)} cells (the product of its "
                    f"{len(self.domain)} attribute sizes); a workload of marginals supports at "
                    f"most {MAX_MARGINAL_PLAN_CELLS:.0e} (sums of products of sizes are float64): "
                    "use fewer attributes or wider bins"
                )
        elif cells > MAX_PLAN_CELLS:
            raise ValueError(
                f"domain has {magnitude(cells)} cells ({' × '.join(map(str, self.domain_shape))}); "
                f"at most {MAX_PLAN_CELLS:.0e} are supported (cell indices are 64-bit integers; "
                "a workload of only marginal, marginals and total items has no such limit)"
            )
        for k, item in enumerate(self.workload):
            for attribute, pairs in (item.ranges or {}).items():
                if any(isinstance(v, bool) for pair in pairs for v in pair):
                    raise ValueError(
                        f"workload[{k}] ({item.name!r}): ranges for {attribute!r} ({pairs}) hold a "
                        "boolean; range bounds are numbers or category values, never true/false"
                    )
        return self

    @model_validator(mode="after")
    def _check_marginals_items(self) -> ReleaseSpec:
        """``marginals`` items: degree within the attributes, bounded table count and released
        rows (from the sizes, before any table is listed), unique names. O(tables + items)."""
        names = [item.name for item in self.workload if item.marginals is None]
        sizes = {name: attribute.size for name, attribute in self.domain.items()}
        for k, item in enumerate(self.workload):
            if item.marginals is None:
                continue
            where = f"workload[{k}] ({item.name!r})"
            chosen = _marginals_attributes(self, item)
            degree = item.marginals.degree
            if degree > len(chosen):
                raise ValueError(
                    f"{where}: marginals.degree ({degree}) exceeds the {len(chosen)} attributes"
                )
            tables = math.comb(len(chosen), degree)
            if tables > MAX_EXPANDED_MARGINALS:
                raise ValueError(
                    f"{where}: all {degree}-way marginals of {len(chosen)} attributes are "
                    f"{tables:,} tables; at most {MAX_EXPANDED_MARGINALS:,} per item"
                )
            rows = elementary_symmetric([sizes[a] for a in chosen], degree)
            if rows > MAX_EXPANDED_MARGINAL_ROWS:
                raise ValueError(
                    f"{where}: all {degree}-way marginals of {len(chosen)} attributes release "
                    f"{rows:,} cells; at most {MAX_EXPANDED_MARGINAL_ROWS:,} per item"
                )
            names += [name for name, _ in expansion_tables(self, item)]
        if repeated := sorted(name for name, count in Counter(names).items() if count > 1):
            raise ValueError(
                f"workload: marginals items expand to table names that repeat {repeated[:5]} "
                "(another item has that name, or attribute names differ only in characters "
                "outside A-Z a-z 0-9 _ -): rename an item"
            )
        return self

    @property
    def all_marginals(self) -> bool:
        """Every item a ``marginal``, ``marginals`` or ``total``: no product-domain limit."""
        return all(item.kind in MARGINAL_KINDS for item in self.workload)

    def expanded_workload(self) -> list[WorkloadItemSpec]:
        """The workload with every ``marginals`` item replaced by its marginal items (in order)."""
        return [part for item in self.workload for part in expand_item(self, item)]

    @property
    def domain_shape(self) -> tuple[int, ...]:
        return tuple(attribute.size for attribute in self.domain.values())

    @property
    def num_cells(self) -> int:
        return math.prod(self.domain_shape)

    def privacy_target(self) -> PrivacyCost:
        if self.privacy is None:
            raise ValueError(
                "a spec with accuracy targets has no privacy level until it is planned "
                "(planner.make_plan; then ReleaseSpec.with_privacy)"
            )
        return cost_from_dict(self.privacy)

    @property
    def noise(self) -> str:
        """``laplace`` (ε-DP) or ``gaussian`` (ρ-zCDP, (ε, δ)): from the privacy level, or the
        accuracy section before planning."""
        if self.privacy is None and self.accuracy is not None:
            return self.accuracy.noise
        return "laplace" if self.privacy_target().measure == "pure" else "gaussian"

    @property
    def effective_objective(self) -> Objective:
        """What the plan minimises: accuracy targets bound every cell (``max_variance``)."""
        return "max_variance" if self.accuracy is not None else self.objective

    @property
    def weighted(self) -> bool:
        """Whether some workload item has a ``weight`` other than 1 (then ``plan`` reports and
        ``auto`` chooses by the weighted total variance; weight 1 is no weight)."""
        return any(item.weight not in (None, 1.0) for item in self.workload)

    def item_targets(self) -> dict[str, float] | None:
        """Each output table's ``max_std_error`` (a ``max_half_width`` divided by the normal quantile
        of ``accuracy.confidence``; expanded ``marginals`` inherit theirs); None
        without an accuracy section."""
        if self.accuracy is None:
            return None
        targets = {}
        for item in self.workload:
            target = self.accuracy.std_error(
                std_error=item.max_std_error, half_width=item.max_half_width
            )
            for part in expand_item(self, item):
                targets[part.name] = float(target)  # type: ignore[arg-type]  # validated
        return targets

    def with_privacy(self, privacy: dict[str, float]) -> ReleaseSpec:
        """This spec at ``privacy`` (the level a plan found for its accuracy targets)."""
        return self.model_copy(update={"privacy": check_privacy_dict(privacy, field="privacy")})

    def canonical_json(self) -> str:
        # where a run counts changes no output; fields added later at their default change no hash
        data = self.model_dump(mode="json", exclude={"execution"})
        if not self.privacy_unit.persons_colocated:
            del data["privacy_unit"]["persons_colocated"]
        if self.dataset.partitions is None:
            del data["dataset"]["partitions"]
        if self.series is None:
            del data["series"]
        if self.on_unchanged == "skip":
            del data["on_unchanged"]
        if self.objective == "total_variance":
            del data["objective"]
        if self.accuracy is None:
            del data["accuracy"]
        elif self.accuracy.max_half_width is None:  # specs written before half-widths
            del data["accuracy"]["max_half_width"]
            del data["accuracy"]["confidence"]
        for item in data["workload"]:
            for field in ("max_std_error", "max_half_width", "weight"):
                if item[field] is None:
                    del item[field]
        if self.review is not None and not self.review.allow_self_approval:
            del data["review"]["allow_self_approval"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def series_key(self) -> str:
        """sha256 of the spec minus where the input lives (``dataset.source``) and the
        ``on_unchanged`` policy: with the keyed input fingerprint (names and bytes of the input
        files), what "unchanged since the last release of the series" compares."""
        data = json.loads(self.canonical_json())
        data["dataset"].pop("source", None)
        data.pop("on_unchanged", None)
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def fingerprint(self) -> str:
        """sha256 of the canonical spec (everything, including the dataset and privacy level,
        but not the domain's order: reordering the domain is not a new spec for skip-unchanged,
        the statistics released are the same; strategies and series plans, whose cell layout
        follows that order, are keyed by :meth:`workload_fingerprint`, which includes it)."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def workload_fingerprint(self) -> str:
        """sha256 of what determines strategies: domain sizes and order (the cell layout),
        workload (with item weights when given), noise kind, options and objective (plans, stored
        strategies and series plans are keyed by it)."""
        workload = [item.model_dump(mode="json", exclude_none=True) for item in self.workload]
        for item in workload:  # weight 1 is no weight: the same strategies (and public seed)
            if item.get("weight") == 1.0:
                del item["weight"]
        payload = {
            "domain": {name: attr.model_dump(mode="json") for name, attr in self.domain.items()},
            "workload": workload,
            "matrices": [_file_sha256(item.matrix) for item in self.workload if item.matrix],
            "noise": self.noise,
            "mechanism": self.mechanism,
            "options": self.mechanism_options,
        }
        if self.objective != "total_variance":  # the default leaves existing fingerprints
            payload["objective"] = self.objective
        if self.accuracy is not None:  # the targets weigh the tables
            payload["accuracy"] = self.accuracy.model_dump(mode="json")
        # The domain's order is the cell layout, which sort_keys would hide (a stored strategy of
        # one order must not serve another).  A domain already in sorted order adds nothing, so
        # fingerprints written before this key stay valid for it.
        if list(self.domain) != sorted(self.domain):
            payload["domain_order"] = list(self.domain)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _marginals_attributes(spec: ReleaseSpec, item: WorkloadItemSpec) -> list[str]:
    """A ``marginals`` item's attributes, in domain order."""
    selection = item.marginals
    if selection is None or selection.attributes == "all":
        return list(spec.domain)
    return [name for name in spec.domain if name in selection.attributes]


def expansion_tables(
    spec: ReleaseSpec, item: WorkloadItemSpec
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``(name, attributes)`` of each table of a ``marginals`` item, in :func:`expand_item`'s
    order, without building an item per table (names for validation, axes for the workload)."""
    chosen = _marginals_attributes(spec, item)
    safe = {a: re.sub(r"[^A-Za-z0-9_-]", "_", a) for a in chosen}  # once per attribute
    degree = item.marginals.degree  # type: ignore[union-attr]  # a marginals item
    for combo in itertools.combinations(chosen, degree):
        yield ".".join([item.name, *(safe[a] for a in combo)]), combo


def expand_item(spec: ReleaseSpec, item: WorkloadItemSpec) -> list[WorkloadItemSpec]:
    """A ``marginals`` item as one ``marginal`` item per k-subset of its attributes (domain order),
    named ``<item>.<a>.<b>`` (characters outside ``A-Za-z0-9_-`` of an attribute name become
    ``_``, so every name is a safe file name). O(C(attributes, k) · k).

    The parts are built without re-validation: their attributes and names are checked by the
    spec's validators (``_cross_checks``, ``_check_marginals_items``).  One part is made with
    ``model_construct``; the others are its field values with a new name and attributes (what
    ``model_construct`` stores, ~3 µs a table instead of ~90 µs: 166,750 tables of 100
    attributes' 1–3-way in about half a second).
    """
    if item.marginals is None:
        return [item]
    prototype = WorkloadItemSpec.model_construct(
        name=item.name,
        marginal=[],
        max_std_error=item.max_std_error,
        max_half_width=item.max_half_width,
        weight=item.weight,
    )
    fields, fields_set = prototype.__dict__, prototype.__pydantic_fields_set__
    new, assign = WorkloadItemSpec.__new__, object.__setattr__
    parts = []
    for name, combo in expansion_tables(spec, item):
        part = new(WorkloadItemSpec)
        assign(part, "__dict__", {**fields, "name": name, "marginal": list(combo)})
        assign(part, "__pydantic_fields_set__", fields_set)  # frozen: never mutated
        assign(part, "__pydantic_extra__", None)
        assign(part, "__pydantic_private__", None)
        parts.append(part)
    return parts


def item_num_queries(spec: ReleaseSpec, item: WorkloadItemSpec) -> int:
    """Rows of the item's output table, from the spec alone (a matrix item reads only the .npy
    header; a ``marginals`` item: of all its tables, the k-th elementary symmetric polynomial of
    its attributes' sizes, O(attributes · k), never listing the tables). O(attributes)."""
    if item.marginals is not None:
        chosen = _marginals_attributes(spec, item)
        return elementary_symmetric([spec.domain[a].size for a in chosen], item.marginals.degree)
    if item.marginal is not None:
        return math.prod(spec.domain[a].size for a in item.marginal)
    if item.derived_column is not None:
        return derived_support(spec, item).num_queries + derived_rows(spec, item)
    count = 1
    for name, attribute in spec.domain.items():
        n = attribute.size
        if item.prefix == name:
            count *= n
        elif item.all_ranges is not None and name in item.all_ranges:
            count *= n * (n + 1) // 2
        elif item.attributes is not None and name in item.attributes and item.matrix is not None:
            try:
                count *= int(np.load(item.matrix, mmap_mode="r", allow_pickle=False).shape[0])
            except (OSError, ValueError, IndexError) as exc:
                raise SpecError(
                    f"workload item {item.name!r}: cannot read {item.matrix!r}: {exc}"
                ) from None
        elif item.ranges is not None and name in item.ranges:
            count *= len(item.ranges[name])
    return count


def elementary_symmetric(sizes: list[int], degree: int) -> int:
    """``e_k(sizes)``: the sum over k-subsets of the product of their sizes (the cells of all
    k-way marginals), exact in Python integers. O(len(sizes) · k).

    >>> elementary_symmetric([2, 3, 4], 2)
    26
    """
    # e[j] after i sizes: sum of products over j-subsets of the first i (the standard recurrence)
    e = [1] + [0] * degree
    for n in sizes:
        for j in range(degree, 0, -1):
            e[j] += e[j - 1] * n
    return e[degree]


def derived_column(spec: ReleaseSpec, item: WorkloadItemSpec) -> BinnedColumn:
    """The public cells of a derived item's column (raises ``ValueError`` naming the rule)."""
    name = item.derived_column
    attribute = spec.domain[name] if name is not None else None
    if not isinstance(attribute, IntegerRange | NumericBins):
        raise ValueError(
            f"{item.kind} needs a numeric column (an integer range or numeric bins), but "
            f"{name!r} is {type(attribute).__name__.lower()}"
        )
    if item.representative is not None and len(item.representative) != attribute.size:
        raise ValueError(
            f"representative lists {len(item.representative)} values but {name!r} has "
            f"{attribute.size} cells"
        )
    rep = None if item.representative is None else np.asarray(item.representative, np.float64)
    if isinstance(attribute, IntegerRange):
        lower, upper = attribute.cell_bounds()
        return BinnedColumn.of_cells(lower, upper, rep, integer=True)
    pairs = attribute.pairs()
    return BinnedColumn.of_cells(pairs[:, 0], pairs[:, 1], rep, integer=False)


def derived_support(spec: ReleaseSpec, item: WorkloadItemSpec) -> WorkloadItem:
    """The support queries a derived item adds to the workload (``<name>.moments`` or
    ``<name>.cdf``; see :mod:`mechanisms.derived`)."""
    names = list(spec.domain)
    kind = "quantiles" if item.quantiles is not None else "mean"
    return support_item(
        name=f"{item.name}.{'cdf' if kind == 'quantiles' else 'moments'}",
        kind=kind,
        domain_shape=spec.domain_shape,
        column_axis=names.index(str(item.derived_column)),
        by_axes=tuple(names.index(a) for a in item.by or []),
        column=derived_column(spec, item),
    )


def derived_rows(spec: ReleaseSpec, item: WorkloadItemSpec) -> int:
    """Rows of a derived item's table: one per group and statistic."""
    groups = math.prod(spec.domain[a].size for a in item.by or [])
    return groups * (len(item.quantiles.q) if item.quantiles is not None else 1)


def _file_sha256(path: str) -> str:
    """Content hash of a workload matrix file (so an edited matrix never hits a stale cache)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return f"unreadable:{path}"
