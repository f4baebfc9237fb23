"""The two protocols every mechanism is written against: :class:`Mechanism` and :class:`Strategy`.

A **strategy** is the public, data-independent part of a measurement: a set of linear queries
``A`` (shape, sensitivity per noise kind, ``A·x``, ``Aᵀy``) together with the estimator that
answers the workload from ``A·x + noise`` and that estimator's variance per unit noise.

A **mechanism** is one algorithm of the papers: it declares its name, its typed options, whether
it is data-independent and which privacy model it serves; it plans a strategy for a workload
(raising :class:`CandidateUnavailable` with a reason when it cannot serve it), predicts what that
costs, measures through the privacy choke point (:class:`~catalog.confidential.choke_point.ProtectedCells`
for the central model) and reconstructs the workload's answers.  The pipeline in ``catalog`` and
``flows`` only iterates over :mod:`mechanisms.registry`; it never names a mechanism.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, Self, runtime_checkable

import numpy as np

from dprelease.mechanisms.primitives.compute_limits import Progress
from dprelease.mechanisms.primitives.noise import (
    NoiseKind,
    NoiseMechanism,
    calibrate,
    noise_kind_for,
)
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protected import Accountant, NoisyMeasurement
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

Model = Literal["central", "local"]
InputKind = Literal["cells", "responses", "marginals"]
Interval = Literal["normal", "laplace", "none"]
Objective = Literal["total_variance", "max_variance"]
"""What a plan minimises: the sum of the variances of every released cell (the matrix mechanism's
total squared error), or the largest variance of any released cell."""
STORE_VERSION = "2"
# OpenDP's slack depends on the vector size; beyond 1e8 answers (plan-only domains) the calibration
# at 1e8 values is used (the slack is then ~1e-7 relative).
CALIBRATION_SIZE_LIMIT = 100_000_000


class CandidateUnavailable(Exception):
    """This mechanism cannot serve this workload; ``reason`` says why (public text).

    It is the *only* exception a planner treats as "not a candidate": anything else raised while
    planning is a bug and fails the plan.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def require_available(mechanism: Mechanism, request: PlanRequest) -> None:
    """Raise :class:`CandidateUnavailable` with the mechanism's reason when it cannot serve
    ``request``."""
    reason = mechanism.unavailable_reason(request)
    if reason is not None:
        raise CandidateUnavailable(reason)


class OptionsError(ValueError):
    """A ``mechanism_options`` value breaks its rule (the message names the option and the rule)."""


@dataclass(frozen=True, kw_only=True)
class MechanismOptions:
    """Base of every mechanism's typed options: frozen, keyword-only, validated on construction.

    Subclasses declare fields with defaults and validate in ``__post_init__`` (raise
    :class:`OptionsError` naming ``mechanism_options.<field>``, the value and the rule).
    """

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Self:
        """The options this mechanism declares, taken from ``raw`` (other keys are ignored)."""
        return cls(**{name: raw[name] for name in cls.names() if name in raw})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def require_int(value: Any, *, option: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionsError(
            f"mechanism_options.{option} ({value!r}) must be an integer >= {minimum}"
        )


def require_number(value: Any, *, option: str, low: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and value >= low):
        raise OptionsError(f"mechanism_options.{option} ({value!r}) must be a number >= {low:g}")


@dataclass(frozen=True, kw_only=True)
class NoOptions(MechanismOptions):
    """For mechanisms without settings."""


@dataclass(frozen=True, kw_only=True)
class StoredStrategy:
    """A strategy as the strategy store keeps it: JSON-able parameters and named arrays."""

    parameters: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


class StrategyCache(Protocol):
    """Public, data-independent results keyed by :func:`cache_key` (in memory and on disk)."""

    def load(self, key: str) -> StoredStrategy | None: ...

    def save(self, key: str, stored: StoredStrategy) -> None: ...


def cache_key(*parts: Any) -> str:
    """sha256 of the JSON of ``parts`` (public values only: fingerprints, names, settings).

    >>> cache_key("eigen", "ab12", {"norm": "l2"}) == cache_key("eigen", "ab12", {"norm": "l2"})
    True
    >>> cache_key("eigen", "ab12", {"norm": "l2"}) == cache_key("eigen", "ab12", {"norm": "l1"})
    False
    """
    raw = json.dumps([STORE_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """Everything public a mechanism needs to plan: the workload, the domain's order, the noise.

    ``requested`` is true when the spec named this mechanism (the size limits that keep ``auto``
    fast then do not apply); ``time_limit`` bounds optimisers (seconds, None = unbounded).
    """

    workload: Workload
    ordered: tuple[bool, ...]
    target: PrivacyCost
    contribution_bound: int
    options: Mapping[str, Any]
    workload_fingerprint: str
    requested: bool = False
    time_limit: float | None = None
    progress: Progress | None = None
    objective: Objective = "total_variance"
    item_scales: Mapping[str, float] | None = None
    """Per item, what its cells' variances are multiplied by before the largest is taken
    (``1/target²`` for accuracy targets); None: 1 for every item."""

    @property
    def noise(self) -> NoiseKind:
        return noise_kind_for(self.target.measure)

    @property
    def seed(self) -> int:
        """Public randomness for optimisers, derived from the workload fingerprint (recorded)."""
        return int(self.workload_fingerprint[:15], 16)


@runtime_checkable
class Strategy(Protocol):
    """A public measurement strategy ``A`` and its estimator (see the module docstring)."""

    name: str
    parameters: Mapping[str, object]

    @property
    def num_queries(self) -> int: ...

    def sensitivity(self, *, noise: NoiseKind) -> float: ...

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``A·x`` (confidential in, confidential out: only the choke point calls it on data)."""

    def answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        """Each item's estimate from the noisy answers ``y`` (least squares unless stated)."""

    def item_unit_variances(self, item: WorkloadItem, workload: Workload) -> np.ndarray:
        """Per-query variance of the estimate of ``item`` when each answer gets unit noise."""

    def item_unit_total(self, item: WorkloadItem, workload: Workload) -> float: ...

    def support_residual(self, workload: Workload) -> float:
        """≈ 0 iff the estimator answers every workload query without bias."""


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """A planned strategy's privacy cost and expected error at the spec's privacy level.

    ``total_variance``/``rmse`` are None for data-dependent mechanisms (their error depends on the
    data and is not predicted).
    """

    cost: PrivacyCost
    total_variance: float | None
    num_queries: int
    sensitivity: float | None = None
    noise_scale: float | None = None
    note: str | None = None

    @property
    def rmse(self) -> float | None:
        if self.total_variance is None:
            return None
        return float(np.sqrt(self.total_variance / self.num_queries))


@dataclass(frozen=True, kw_only=True)
class ItemAnswers:
    """One workload item's released estimates with their uncertainty.

    ``variances`` are per-query squared standard errors; ``interval`` names the distribution the
    95% interval is taken from (``none``: no interval is claimed, e.g. a noise-only figure).
    """

    estimates: np.ndarray
    variances: np.ndarray
    interval: Interval | np.ndarray = "normal"
    """One value, or one per row (e.g. Laplace only for rows that are one measured answer)."""
    uncertainty: str | np.ndarray = "noise"
    """What ``variances`` cover, one label or one per row: noise, noise+bias or noise-only."""


@dataclass(frozen=True, kw_only=True)
class NoiseDescription:
    """Public description of the noise in a measurement (for the error model and the manifest)."""

    kind: str
    scale: float
    sensitivity: float
    size: int
    variance: float
    sampler: str = "opendp (vetted, floating-point safe)"

    @classmethod
    def of(cls, noisy: NoisyMeasurement) -> NoiseDescription:
        noise = noisy.noise
        return cls(
            kind=noise.kind,
            scale=noise.scale,
            sensitivity=noise.sensitivity,
            size=noise.size,
            variance=noise.variance,
        )


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What a mechanism released: noisy answers, how they were noised, receipts, public details.

    ``strategy`` is what was measured (a data-dependent mechanism builds it while measuring);
    ``details`` go to the manifest and report under ``mechanism.details``.  ``charged`` is what
    this release paid (an intermediate reused from an earlier release was paid then).
    """

    values: np.ndarray
    noise: NoiseDescription
    strategy: Any
    receipts: tuple[str, ...]
    charged: PrivacyCost
    details: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        noisy: NoisyMeasurement,
        *,
        strategy: Any,
        receipts: tuple[str, ...] | None = None,
        charged: PrivacyCost | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> Measurement:
        """From one choke-point measurement (receipts and charge default to that measurement's)."""
        return cls(
            values=noisy.values,
            noise=NoiseDescription.of(noisy),
            strategy=strategy,
            receipts=receipts if receipts is not None else (noisy.receipt_id,),
            charged=charged if charged is not None else noisy.noise.cost,
            details=dict(details or {}),
        )


@dataclass(frozen=True, kw_only=True)
class MeasureContext:
    """Public facts and services a measurement needs (no confidential value in here).

    ``released`` keeps privately released intermediates (e.g. DAWA's partition) with the receipt
    that paid for them, keyed by public values including the keyed ``input_fingerprint``, so a
    re-run on the same input reuses them instead of paying again.
    """

    target: PrivacyCost
    accountant: Accountant
    label: str
    contribution_bound: int
    input_fingerprint: str
    dataset_id: str
    released: StrategyCache

    def reusable(self, key: str) -> StoredStrategy | None:
        """The released intermediate under ``key``; None when there is none or its receipt is not
        on this catalog's ledger (then it is released, and paid for, again)."""
        stored = self.released.load(key)
        if stored is None or not self.accountant.holds(str(stored.parameters["receipt_id"])):
            return None
        return stored


class Mechanism(Protocol):
    """One algorithm of the papers, as the pipeline sees it (see the module docstring)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    model: ClassVar[Model]
    data_independent: ClassVar[bool]
    input_kind: ClassVar[InputKind]
    options: ClassVar[type[MechanismOptions]]

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        """Why this mechanism cannot serve ``request`` (cheap: sizes and kinds only), or None."""

    def predicted_seconds(self, request: PlanRequest) -> float:
        """Predicted planning time from sizes alone (never by running the optimiser)."""

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> Strategy:
        """The strategy for ``request`` (cached in ``cache``); :class:`CandidateUnavailable`."""

    def evaluate(self, strategy: Strategy, request: PlanRequest) -> Evaluation:
        """Privacy cost and expected error of measuring ``strategy``."""

    def measure(self, strategy: Strategy, data: Any, *, context: MeasureContext) -> Measurement:
        """Charge the ledger, then release noisy answers (through the choke point)."""

    def reconstruct(
        self, measurement: Measurement, *, workload: Workload
    ) -> dict[str, ItemAnswers]:
        """Every item's estimates and uncertainty (post-processing of ``measurement``)."""


# Optional hook, for mechanisms whose charge can be smaller than the plan's cost because part of it
# was paid by an earlier release (checked before any data is read, from public facts only):
#
#     def cost_due(self, strategy, *, dataset_id: str, input_fingerprint: str,
#                  released: StrategyCache) -> PrivacyCost


class MatrixMechanism:
    """Shared behaviour of data-independent central mechanisms (the matrix mechanism).

    Measure ``A·x + noise`` through :class:`~catalog.confidential.choke_point.ProtectedCells` (charge before
    noise), answer with the strategy's estimator; error is the closed form ``v·w(AᵀA)⁺wᵀ``.
    Subclasses set the class attributes and implement :meth:`plan`.
    """

    model: ClassVar[Model] = "central"
    data_independent: ClassVar[bool] = True
    input_kind: ClassVar[InputKind] = "cells"
    options: ClassVar[type[MechanismOptions]] = NoOptions

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        return None

    def predicted_seconds(self, request: PlanRequest) -> float:
        # Kronecker algebra: per-attribute pseudo-inverses, O(Σ n_i³) at ~1e9 flop/s.
        return 1e-3 + sum(n**3 for n in request.workload.domain_shape) * 1e-9

    def evaluate(self, strategy: Strategy, request: PlanRequest) -> Evaluation:
        noise = _calibrated(strategy, request)
        workload = request.workload
        total = noise.variance * sum(
            strategy.item_unit_total(item, workload) for item in workload.items
        )
        return Evaluation(
            cost=noise.cost,
            total_variance=float(total),
            num_queries=workload.num_queries,
            sensitivity=noise.sensitivity,
            noise_scale=noise.scale,
            note=describe_template(strategy),
        )

    def largest_variances(self, strategy: Strategy, request: PlanRequest) -> dict[str, float]:
        """Per item, the largest variance of any of its cells at the spec's privacy level.

        O(2^k) per marginal of a subset-space strategy (all its cells share one variance), else
        the cost of the strategy's ``item_unit_variances``."""
        variance = _calibrated(strategy, request).variance
        workload = request.workload
        return {
            item.name: variance * largest_unit_variance(strategy, item, workload)
            for item in workload.items
        }

    def measure(self, strategy: Strategy, data: Any, *, context: MeasureContext) -> Measurement:
        noisy = data.measure(
            strategy,
            target=context.target,
            accountant=context.accountant,
            label=f"{context.label}: {strategy.name} measurement of {strategy.num_queries} answers",
        )
        return Measurement.of(noisy, strategy=strategy)

    def reconstruct(
        self, measurement: Measurement, *, workload: Workload
    ) -> dict[str, ItemAnswers]:
        strategy = measurement.strategy
        noise = measurement.noise
        estimates = strategy.answers(measurement.values, workload)
        return {
            item.name: ItemAnswers(
                estimates=estimates[item.name],
                variances=noise.variance * strategy.item_unit_variances(item, workload),
                interval=_intervals(strategy, item, laplace=noise.kind == "laplace"),
            )
            for item in workload.items
        }


def _calibrated(strategy: Strategy, request: PlanRequest) -> NoiseMechanism:
    """The noise a release of ``strategy`` at the spec's privacy level gets."""
    return calibrate(
        target=request.target,
        sensitivity=strategy.sensitivity(noise=request.noise) * request.contribution_bound,
        size=min(strategy.num_queries, CALIBRATION_SIZE_LIMIT),
    )


def largest_unit_variance(strategy: Strategy, item: WorkloadItem, workload: Workload) -> float:
    """The largest of ``item``'s per-cell variances per unit noise variance; a strategy whose
    cells of ``item`` share one variance may say so with ``uniform_unit_variance(item)``."""
    uniform = getattr(strategy, "uniform_unit_variance", None)
    value = uniform(item) if uniform is not None else None
    if value is None:
        value = float(np.max(strategy.item_unit_variances(item, workload)))
    return float(value)


class LeastSquaresAnswers:
    """``answers`` for strategies with ``least_squares``: x̂ = (AᵀA)⁺Aᵀy, then each item's W·x̂."""

    def least_squares(self, y: np.ndarray, workload: Workload) -> np.ndarray:
        raise NotImplementedError

    def answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        estimate = self.least_squares(y, workload)
        return {item.name: item.answer(estimate) for item in workload.items}


def _intervals(strategy: Strategy, item: WorkloadItem, *, laplace: bool) -> Interval | np.ndarray:
    """``laplace`` for the rows whose estimate is one measured answer plus one Laplace draw (the
    strategy says which, if it can), ``normal`` for every other row."""
    rows = getattr(strategy, "single_answer_rows", None)
    if not laplace or rows is None:
        return "normal"
    return np.where(rows(item), "laplace", "normal").astype(object)


def describe_template(strategy: Strategy) -> str | None:
    template = strategy.parameters.get("template")
    return f"template: {template}" if template else None
