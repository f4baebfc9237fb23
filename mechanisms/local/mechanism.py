"""``optimized`` in the local model: the workload factorization mechanism of [McKenna20].

Each user randomises their own item on their device with a *published* ε-LDP strategy ``Q``
(:mod:`~mechanisms.local.strategy`); the server counts the responses into ``y`` and answers
``V y`` (Thm 3.10).  **plan** optimises ``Q`` at the per-user ε (Problem 3.12), data-free, cached
and seeded from public facts; **evaluate**: cost ε per user (pure), error the worst-case total
variance per user (Cor 3.5); **measure** takes :class:`ResponseCounts`, already ε-LDP (noise was
added on the devices, never here), and charges the ledger once per collection; **reconstruct**
is post-processing, ``V y`` with variance ``N/(N-1)·[(V∘V) y − (V y)²/N]``.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dprelease.mechanisms.local import optimizer
from dprelease.mechanisms.local.strategy import (
    MAX_TABLE_ENTRIES,
    NAME,
    LocalStrategy,
    ResponseCounts,
    describe,
    estimate_item,
    least_squares_operator,
    rounding_floor,
    workload_root,
)
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import (
    Evaluation,
    ItemAnswers,
    MeasureContext,
    Measurement,
    MechanismOptions,
    NoiseDescription,
    OptionsError,
    PlanRequest,
    StoredStrategy,
    StrategyCache,
    cache_key,
    require_available,
    require_int,
)
from dprelease.mechanisms.primitives.workload import Workload, magnitude

STORE_VERSION = "1"
MAX_LDP_CELLS = 2048  # one optimiser step is O(m n^2) with m = 4n (benchmarks/ldp_bench.py)
COLLECTION_LABEL = "local-model collection (epsilon per user)"
STD_ERROR = "sqrt of N/(N-1)[(V∘V)y - (Vy)^2/N], V of Thm 3.10"


@dataclass(frozen=True, kw_only=True)
class LocalOptions(MechanismOptions):
    """Optimiser settings (public; part of the strategy's cache key)."""

    rows_factor: int = 4
    """outputs of the random start per cell, m = rows_factor · n ([McKenna20] §4: 4)"""
    iterations: int = 500
    """maximum gradient steps"""
    tolerance: float = 1e-5
    """a phase stops when the objective fell by less than this fraction over 50 steps"""

    def __post_init__(self) -> None:
        require_int(self.rows_factor, option="rows_factor", minimum=1)
        require_int(self.iterations, option="iterations", minimum=0)
        value = self.tolerance
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
            raise OptionsError(
                f"mechanism_options.tolerance ({value!r}) must be a number in [0, 1)"
            )


def optimizer_settings(request: PlanRequest) -> dict[str, Any]:
    """The spec's optimiser settings plus the random start's seed, a hash of public facts
    (workload fingerprint and ε), recorded so the strategy can be reproduced."""
    options = LocalOptions.parse(request.options)
    raw = f"{request.workload_fingerprint}:{request.target.epsilon!r}"
    seed = int(hashlib.sha256(raw.encode()).hexdigest()[:15], 16)
    return {**options.as_dict(), "seed": seed}


def strategy_key(request: PlanRequest) -> str:
    """Strategy-cache key: workload fingerprint, per-user ε, optimiser settings, version."""
    return cache_key(
        "local-strategy",
        STORE_VERSION,
        request.workload_fingerprint,
        request.target.epsilon,
        optimizer_settings(request),
    )


def collection_key(*, dataset_id: str, strategy_fingerprint: str, responses: str) -> str:
    """Released-cache key of one collection: dataset, strategy, keyed responses fingerprint."""
    return cache_key("local-collection", dataset_id, strategy_fingerprint, responses)


class LocalMechanism:
    name = NAME
    summary = (
        "local model: workload factorization strategy optimised for the workload (McKenna et al. "
        "2020, Problem 3.12), estimates with the reconstruction of Thm 3.10"
    )
    model = "local"
    data_independent = True
    input_kind = "responses"
    options = LocalOptions

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        if request.target.measure != "pure":
            return "the local model needs privacy {epsilon} (the per-user epsilon)"
        n = request.workload.num_cells
        if n < 2:
            return f"the domain has {n} cell(s); local-model releases need >= 2"
        if n > MAX_LDP_CELLS:
            return (
                f"the domain has {magnitude(n)} cells; a local-model strategy is optimised over at most "
                f"{MAX_LDP_CELLS:,} cells (each step costs O(m n^2) with m = 4n)"
            )
        for item in request.workload.items:
            if item.num_queries * n > MAX_TABLE_ENTRIES:
                return (
                    f"workload item {item.name!r} has {item.num_queries:,} queries over {n:,} "
                    f"cells; a local-model release forms at most {MAX_TABLE_ENTRIES:,} query × "
                    "cell entries per item"
                )
        return None

    def predicted_seconds(self, request: PlanRequest) -> float:
        # Per step max(O(m n) projection passes, O(m n² + n³) algebra), single-threaded BLAS; the
        # constants: benchmarks/predict_bench.py --calibrate ldp.
        options = LocalOptions.parse(request.options)
        n = request.workload.num_cells
        if n > MAX_LDP_CELLS:  # refused; n³ overflows float64 past 5.6e102
            return math.inf
        step = max(
            2.5e-6 * n * n * options.rows_factor / 4, 1e-9 * (options.rows_factor + 1) * n**3
        )
        return 0.01 + options.iterations * step

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> LocalStrategy:
        require_available(self, request)
        settings = optimizer_settings(request)
        epsilon = request.target.epsilon
        key = strategy_key(request)
        stored = cache.load(key)
        if stored is not None:
            try:
                return self.restore(stored)
            except (TypeError, ValueError):
                pass  # an unreadable or tampered entry is recomputed, never used
        workload = request.workload
        root = workload_root(workload)
        n = workload.num_cells
        if request.progress is not None:
            request.progress(
                0.0,
                f"optimising the LDP strategy: n = {n}, m = {settings['rows_factor'] * n}, "
                f"epsilon = {epsilon:g}, up to {settings['iterations']} steps",
            )
        started = time.perf_counter()
        randomiser = optimizer.optimize_strategy(
            root,
            epsilon=epsilon,
            rng=np.random.default_rng(settings["seed"]),  # public randomness: the random start
            rows=settings["rows_factor"] * n,
            iterations=settings["iterations"],
            tolerance=settings["tolerance"],
            progress=request.progress,
            # no time limit: the published Q must be reproducible from its recorded seed
        )
        strategy = describe(
            randomiser,
            workload=workload,
            ordered=request.ordered,
            workload_fingerprint=request.workload_fingerprint,
            settings=settings,
            seconds=time.perf_counter() - started,
            root=root,
        )
        cache.save(key, strategy.stored())
        return strategy

    def restore(self, stored: StoredStrategy) -> LocalStrategy:
        """A stored or published strategy of this mechanism (:meth:`LocalStrategy.restore`)."""
        return LocalStrategy.restore(stored)

    def evaluate(self, strategy: LocalStrategy, request: PlanRequest) -> Evaluation:
        record = strategy.parameters
        return Evaluation(
            cost=strategy.cost,
            total_variance=float(record["worst_variance"]),
            num_queries=request.workload.num_queries,
            note=(
                f"per user (N = 1), worst case over the users' items (Cor 3.5): N responses give "
                f"N times it; average case {record['average_variance']:.6g}, lower bound of any "
                f"epsilon-LDP factorization {record['lower_bound']:.6g} (Cor 5.7); "
                f"{strategy.num_queries} outputs"
            ),
        )

    def cost_due(
        self,
        strategy: LocalStrategy,
        *,
        dataset_id: str,
        input_fingerprint: str,
        released: StrategyCache,
    ) -> PrivacyCost:
        """What measuring this input will charge: zero when an earlier release already charged
        this collection (its receipt is reused), else ε per user.  Public facts only."""
        key = collection_key(
            dataset_id=dataset_id,
            strategy_fingerprint=strategy.fingerprint,
            responses=input_fingerprint,
        )
        return PrivacyCost.zero("pure") if released.load(key) is not None else strategy.cost

    def measure(
        self, strategy: LocalStrategy, data: ResponseCounts, *, context: MeasureContext
    ) -> Measurement:
        """Record the collection's ε per user once; the responses are the measurement.

        Privacy: the responses are ε-LDP when they arrive (randomised on the devices); this charges
        their cost to the ledger (checked against the cap) once per collection; two releases
        racing on one new collection may both charge it (conservative)."""
        if data.strategy_fingerprint != strategy.fingerprint:
            raise ValueError(
                f"the responses were counted for strategy {data.strategy_fingerprint[:16]}…, "
                f"not the planned {strategy.fingerprint[:16]}…"
            )
        if data.counts.size != strategy.num_queries:
            raise ValueError(
                f"counts has {data.counts.size} entries; the strategy has {strategy.num_queries}"
            )
        key = collection_key(
            dataset_id=context.dataset_id,
            strategy_fingerprint=strategy.fingerprint,
            responses=context.input_fingerprint,
        )
        stored = context.reusable(key)
        if stored is None:
            receipt = context.accountant.charge(
                strategy.cost, label=f"{context.label}: {COLLECTION_LABEL} [collection {key[:32]}]"
            )
            context.released.save(
                key,
                StoredStrategy(parameters={"receipt_id": receipt, "epsilon": strategy.epsilon}),
            )
            charged = strategy.cost
        else:
            receipt = str(stored.parameters["receipt_id"])
            charged = PrivacyCost.zero("pure")
        record = strategy.parameters
        n_responses = data.num_responses
        num_queries = int(record["num_queries"])

        def rmse(per_user: float) -> float:
            return math.sqrt(max(per_user, 0.0) * n_responses / num_queries)

        return Measurement(
            values=data.counts.astype(np.float64),
            noise=NoiseDescription(
                kind="client-side epsilon-LDP randomiser",
                scale=strategy.epsilon,
                sensitivity=1.0,
                size=n_responses,
                variance=float(record["worst_variance"]) * n_responses / num_queries,
                sampler="on users' devices (mechanisms.local.randomizer.randomize, OS entropy)",
            ),
            strategy=strategy,
            receipts=(receipt,),
            charged=charged,
            details={
                "epsilon_per_user": strategy.epsilon,
                "num_responses": n_responses,
                "strategy_fingerprint": strategy.fingerprint,
                "strategy_rows": strategy.num_queries,
                "domain_size": strategy.randomiser.domain_size,
                "promised_worst_variance_per_user": record["worst_variance"],
                "promised_average_variance_per_user": record["average_variance"],
                "lower_bound_per_user": record["lower_bound"],
                "expected_worst_rmse": rmse(record["worst_variance"]),
                "lower_bound_rmse": rmse(record["lower_bound"])
                if record["lower_bound"] > 0
                else None,
                "baselines": {
                    name: {
                        "worst_variance": b["worst_variance"],
                        "average_variance": b["average_variance"],
                        "worst_rmse": rmse(b["worst_variance"]),
                    }
                    for name, b in record["baselines"].items()
                },
                "collection_key": key,
                "collection_receipt": receipt,
                "collection_reused": stored is not None,
                "std_error": STD_ERROR,
            },
        )

    def reconstruct(
        self, measurement: Measurement, *, workload: Workload
    ) -> dict[str, ItemAnswers]:
        """Every item's ``V y`` and its variance estimate (post-processing of ε-LDP responses)."""
        strategy: LocalStrategy = measurement.strategy
        counts = measurement.values
        num_responses = round(float(counts.sum()))
        operator = least_squares_operator(strategy.randomiser)
        answers = {}
        for item in workload.items:
            estimate = estimate_item(item, strategy.randomiser, operator, counts)
            floor = rounding_floor(estimate.answers, num_responses, strategy.num_queries)
            answers[item.name] = ItemAnswers(
                estimates=estimate.answers, variances=np.maximum(estimate.variance, floor**2)
            )
        return answers


MECHANISM = LocalMechanism()
