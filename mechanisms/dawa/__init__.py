"""``dawa``: DAWA (Li thesis ch. 6): a private partition (ε₁), then GreedyH over its buckets (ε₂).

DAWA works on a 1-D ordered domain.  A workload qualifies when its domain is one ordered
attribute, or two ordered attributes (cells listed along a Hilbert curve without padding cells, so
no estimate lands on a cell that does not exist), and every query is an interval (in 2-D, a
rectangle) of cells.

Privacy: step 1 is a private *selection* run through ``ProtectedCells.select`` after its ε₁ is
charged; its output (bucket boundaries) is public and is kept with its ledger receipt in the
released-intermediates cache under a public key (dataset, keyed input fingerprint, settings), so a
re-run on the same input reuses it without paying again.  Step 2 is an ordinary measurement
through ``ProtectedCells.measure`` (cost from OpenDP's map).  Step 1's ε₁ comes from the DAWA proof
(Li thesis Thm 6.2, with the per-interval scales of Theorem 6.1's Remark), not from an OpenDP map.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dprelease.mechanisms.dawa.greedy_h import HierarchicalStrategy, greedy_h_strategy
from dprelease.mechanisms.dawa.hilbert import HilbertLayout
from dprelease.mechanisms.dawa.partition import (
    IntervalWorkload,
    Partition,
    PartitionSelector,
    split_budget,
)
from dprelease.mechanisms.dawa.uncertainty import cell_coordinates, query_uncertainty
from dprelease.mechanisms.primitives.noise import SENSITIVITY_NORM, NoiseKind
from dprelease.mechanisms.primitives.operators import Factor, Identity, Prefix, Ranges, Total
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import (
    CandidateUnavailable,
    Evaluation,
    ItemAnswers,
    MeasureContext,
    Measurement,
    MechanismOptions,
    OptionsError,
    PlanRequest,
    StoredStrategy,
    StrategyCache,
    cache_key,
    require_available,
    require_int,
    require_number,
)
from dprelease.mechanisms.primitives.workload import Workload

# Public shift of each Step-1 noisy cost by offset × its Laplace scale (privacy-neutral: the scale
# depends only on the interval length); 0 reproduces the thesis, whose Step 1 over-splits.
DEFAULT_NOISE_OFFSET = 3.0
MAX_VARIANCE_WORK = 2_000_000_000  # queries × buckets for exact per-query standard errors


@dataclass(frozen=True, kw_only=True)
class DawaOptions(MechanismOptions):
    ratio: float = 0.25
    """share of epsilon spent on the partition (0 < ratio < 1)"""
    intervals: str = "dyadic"
    """candidate bucket lengths: 'dyadic' or 'all'"""
    noise_offset: float = DEFAULT_NOISE_OFFSET
    """public shift of step-1 noisy costs, in Laplace scale units (>= 0)"""
    branching: int = 2
    """fan-out of GreedyH's tree over the buckets (integer >= 2)"""

    def __post_init__(self) -> None:
        ratio = self.ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio < 1:
            raise OptionsError(f"mechanism_options.ratio ({ratio!r}) must be a number in (0, 1)")
        if self.intervals not in ("dyadic", "all"):
            raise OptionsError(
                f"mechanism_options.intervals ({self.intervals!r}) must be 'dyadic' or 'all'"
            )
        require_number(self.noise_offset, option="noise_offset", low=0.0)
        require_int(self.branching, option="branching", minimum=2)


@dataclass(frozen=True, kw_only=True)
class DawaLayout:
    """Cell order DAWA works in: identity for 1-D, a Hilbert curve for 2-D (row-major ↔ DAWA)."""

    shape: tuple[int, ...]
    hilbert: HilbertLayout | None

    def to_dawa(self, cells: np.ndarray) -> np.ndarray:
        if self.hilbert is None:
            return np.asarray(cells, dtype=np.float64)
        return self.hilbert.to_1d(np.asarray(cells, dtype=np.float64).reshape(self.shape))

    def from_dawa(self, vector: np.ndarray) -> np.ndarray:
        if self.hilbert is None:
            return np.asarray(vector, dtype=np.float64)
        return self.hilbert.to_2d(vector).ravel()


@dataclass(frozen=True, kw_only=True)
class DawaDesign:
    """DAWA's public plan: settings, cell layout and the workload as intervals in DAWA's order."""

    name: str
    epsilon: float
    options: DawaOptions
    layout: DawaLayout
    intervals: IntervalWorkload
    parameters: dict[str, Any] = field(default_factory=dict)
    greedy: HierarchicalStrategy | None = None
    """Once measured: the GreedyH strategy over the released buckets."""

    @property
    def partition_epsilon(self) -> float:
        return split_budget(self.epsilon, ratio=self.options.ratio)[0]

    @property
    def measurement_epsilon(self) -> float:
        return split_budget(self.epsilon, ratio=self.options.ratio)[1]


class DawaMechanism:
    name = "dawa"
    summary = "DAWA: private data-aware partition, then GreedyH over the buckets (Li thesis ch. 6)"
    model = "central"
    data_independent = False
    input_kind = "cells"
    options = DawaOptions

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        shape = request.workload.domain_shape
        if len(shape) not in (1, 2):
            return (
                f"DAWA needs a domain of one or two ordered attributes (this one has {len(shape)})"
            )
        if not all(request.ordered):
            return "DAWA needs ordered attributes (integer ranges, bins, or ordered categories)"
        if request.noise != "laplace":
            return "DAWA uses Laplace noise: give privacy as {epsilon}"
        for item in request.workload.items:
            for factor in item.factors:
                if not isinstance(factor, Identity | Total | Prefix | Ranges):
                    return (
                        f"DAWA answers interval queries only; item {item.name!r} has other queries"
                    )
        work = request.workload.num_queries * request.workload.num_cells
        if work > MAX_VARIANCE_WORK:
            return (
                f"DAWA's exact standard errors cost queries × cells = {work:,} operations here; "
                f"at most {MAX_VARIANCE_WORK:,} (reduce the workload)"
            )
        return None

    def predicted_seconds(self, request: PlanRequest) -> float:
        return 0.01 + request.workload.num_queries * 1e-6

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> DawaDesign:
        require_available(self, request)
        options = DawaOptions.parse(request.options)
        shape = request.workload.domain_shape
        hilbert = None if len(shape) == 1 else HilbertLayout.for_shape(shape, keep_padding=False)
        layout = DawaLayout(shape=shape, hilbert=hilbert)
        return DawaDesign(
            name=self.name,
            epsilon=request.target.epsilon,
            options=options,
            layout=layout,
            intervals=interval_workload(request.workload, layout),
            parameters=options.as_dict(),
        )

    def evaluate(self, design: DawaDesign, request: PlanRequest) -> Evaluation:
        return Evaluation(
            cost=PrivacyCost(measure="pure", epsilon=request.target.epsilon),
            total_variance=None,
            num_queries=request.workload.num_queries,
            note=(
                "data-dependent: its error depends on the data, so it is not predicted (auto "
                f"never picks it; ask for it with mechanism: {self.name})"
            ),
        )

    def measure(self, design: DawaDesign, data: Any, *, context: MeasureContext) -> Measurement:
        partition_cost = PrivacyCost(measure="pure", epsilon=design.partition_epsilon)
        key = cache_key(
            "dawa-partition",
            context.dataset_id,
            context.input_fingerprint,
            list(design.layout.shape),
            context.contribution_bound,
            design.epsilon,
            design.options.as_dict(),
        )
        stored = context.reusable(key)
        reused = stored is not None
        if not reused:
            boundaries, receipt = self._select(design, data, context=context, cost=partition_cost)
            stored = StoredStrategy(parameters={"boundaries": boundaries, "receipt_id": receipt})
            context.released.save(key, stored)
        charged = PrivacyCost.zero("pure") if reused else partition_cost
        boundaries = [int(b) for b in stored.parameters["boundaries"]]
        partition_receipt = str(stored.parameters["receipt_id"])
        partition = Partition(boundaries=np.asarray(boundaries, dtype=np.int64))
        strategy = greedy_h_strategy(
            design.intervals, partition, branching=design.options.branching
        )
        noisy = data.measure(
            _CellOrderStrategy(strategy, design.layout),
            target=PrivacyCost(measure="pure", epsilon=design.measurement_epsilon),
            accountant=context.accountant,
            label=(
                f"{context.label}: DAWA GreedyH measurement over {partition.n_buckets} buckets "
                f"(epsilon2={design.measurement_epsilon:g})"
            ),
        )
        return Measurement.of(
            noisy,
            strategy=dataclasses.replace(design, greedy=strategy),
            receipts=(partition_receipt, noisy.receipt_id),
            charged=charged + noisy.noise.cost,
            details={
                "buckets": len(boundaries) - 1,
                "boundaries": boundaries,
                "partition_receipt": partition_receipt,
                "partition_reused": reused,
                "partition_cost": partition_cost.as_dict(),
            },
        )

    def _select(
        self,
        design: DawaDesign,
        data: Any,
        *,
        context: MeasureContext,
        cost: PrivacyCost,
    ) -> tuple[list[int], str]:
        """Charge ε₁, then run DAWA's private partition selector on the protected cells."""
        selector = PartitionSelector(
            epsilon=design.partition_epsilon,
            measurement_epsilon=design.measurement_epsilon,
            intervals=design.options.intervals,
            contribution_bound=context.contribution_bound,
            noise_offset=design.options.noise_offset,
        )
        layout = design.layout
        partition, receipt_id = data.select(
            lambda cells, sampler: selector(layout.to_dawa(cells), sampler),
            cost=cost,
            accountant=context.accountant,
            label=(
                f"{context.label}: DAWA private partition (epsilon1={design.partition_epsilon:g})"
            ),
        )
        return [int(b) for b in partition.boundaries], receipt_id

    def reconstruct(
        self, measurement: Measurement, *, workload: Workload
    ) -> dict[str, ItemAnswers]:
        """Bucket least squares, uniform expansion, and each query's honest uncertainty.

        ``std_error`` covers the noise and the estimated bias of assuming uniform buckets, both
        from released values only (:func:`mechanisms.dawa.uncertainty.query_uncertainty`); rows whose bias
        cannot be estimated get a noise-only figure and no interval.
        """
        measured: DawaDesign = measurement.strategy
        layout = measured.layout
        buckets = measured.greedy.least_squares(measurement.values)
        cells = layout.from_dawa(measured.greedy.partition.expand(buckets))
        uncertainty = query_uncertainty(
            measured.intervals,
            measured.greedy,
            buckets,
            noise_variance=measurement.noise.variance,
            coordinates=cell_coordinates(
                layout.shape, None if layout.hilbert is None else layout.hilbert.cell_at
            ),
        )
        answers = {}
        offset = 0
        for item in workload.items:
            rows = slice(offset, offset + item.num_queries)
            answers[item.name] = ItemAnswers(
                estimates=item.answer(cells),
                variances=uncertainty.variance[rows],
                interval=uncertainty.interval[rows],
                uncertainty=uncertainty.uncertainty[rows],
            )
            offset += item.num_queries
        return answers


@dataclass(frozen=True)
class _CellOrderStrategy:
    """GreedyH strategy seen from row-major cells (the session applies it to its own cells)."""

    strategy: HierarchicalStrategy
    layout: DawaLayout
    name: str = "dawa"

    @property
    def num_queries(self) -> int:
        return self.strategy.num_queries

    def sensitivity(self, *, noise: NoiseKind) -> float:
        return self.strategy.sensitivity(norm=SENSITIVITY_NORM[noise])

    def apply(self, x: np.ndarray) -> np.ndarray:
        return self.strategy.apply(self.layout.to_dawa(x))


def _factor_intervals(factor: Factor) -> tuple[np.ndarray, np.ndarray]:
    n = factor.n
    if isinstance(factor, Identity):
        return np.arange(n), np.arange(n)
    if isinstance(factor, Total):
        return np.array([0]), np.array([n - 1])
    if isinstance(factor, Prefix):
        return np.zeros(n, dtype=np.int64), np.arange(n)
    if isinstance(factor, Ranges):
        return factor.lo, factor.hi
    raise CandidateUnavailable(
        f"DAWA answers interval queries only; {type(factor).__name__} is not one"
    )


def interval_workload(workload: Workload, layout: DawaLayout) -> IntervalWorkload:
    """All items' queries as interval pieces in DAWA's cell order (items stacked in order)."""
    rows, los, his = [], [], []
    start = 0
    n_cells = int(np.prod(layout.shape))
    for item in workload.items:
        if layout.hilbert is None:
            lo, hi = _factor_intervals(item.factors[0])
            query = np.arange(lo.size)
        else:
            (r_lo, r_hi), (c_lo, c_hi) = (_factor_intervals(f) for f in item.factors)
            rr, cc = np.meshgrid(np.arange(r_lo.size), np.arange(c_lo.size), indexing="ij")
            rr, cc = rr.ravel(), cc.ravel()
            query, lo, hi = layout.hilbert.rectangle_pieces(r_lo[rr], r_hi[rr], c_lo[cc], c_hi[cc])
        rows.append(query + start)
        los.append(lo)
        his.append(hi)
        start += item.num_queries
    row = np.concatenate(rows)
    return IntervalWorkload(
        n_cells=n_cells,
        n_rows=start,
        row=row,
        lo=np.concatenate(los),
        hi=np.concatenate(his),
        weight=np.ones(row.size),
    )


MECHANISM = DawaMechanism()
