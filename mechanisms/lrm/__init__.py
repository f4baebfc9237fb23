"""``lrm``: the Low-Rank Mechanism (Yuan et al., VLDB 2012): ``W ≈ B·L``, measure ``L·x``.

ε-DP (Laplace) only.  Factors the explicit stacked workload matrix, so it is limited to small
workloads; the estimate is LRM's own ``B·y`` (its relaxed factorisation's bias ``(W − BL)x`` is
bounded by ``bias_sq · ‖x‖²`` and reported in the plan, not in ``rmse``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import threadpoolctl

from mechanisms.dense import FactorizationStrategy
from mechanisms.lrm.decomposition import decompose, predict_seconds
from mechanisms.protocol import (
    CandidateUnavailable,
    Evaluation,
    MatrixMechanism,
    PlanRequest,
    StoredStrategy,
    Strategy,
    StrategyCache,
    cache_key,
)

MAX_CELLS = 4096
MAX_QUERIES = 4096
AUTO_MAX = 1024  # auto considers LRM only on small workloads (a decomposition costs seconds)


class LowRankMechanism(MatrixMechanism):
    name = "lrm"
    summary = "Low-Rank Mechanism: W ≈ B·L, measure L·x with Laplace noise (Yuan et al. 2012)"

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        workload = request.workload
        if request.noise != "laplace":
            return "the Low-Rank Mechanism is an epsilon-DP (Laplace) mechanism: give privacy as {epsilon}"
        if workload.num_cells > MAX_CELLS or workload.num_queries > MAX_QUERIES:
            return (
                f"LRM factors the explicit workload matrix: at most {MAX_QUERIES} queries over "
                f"{MAX_CELLS} cells (this one is {workload.num_queries} × {workload.num_cells})"
            )
        if not request.requested and max(workload.num_cells, workload.num_queries) > AUTO_MAX:
            return f"skipped by auto above {AUTO_MAX} cells or queries (ask for it with mechanism: {self.name})"
        return None

    def predicted_seconds(self, request: PlanRequest) -> float:
        workload = request.workload
        return predict_seconds(workload.num_queries, workload.num_cells)

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> FactorizationStrategy:
        reason = self.unavailable_reason(request)
        if reason is not None:
            raise CandidateUnavailable(reason)
        workload = request.workload
        key = cache_key("lrm", request.workload_fingerprint)
        stored = cache.load(key)
        if stored is None:
            matrix = workload.dense_matrix()  # O(m N); refused past its size limit
            with threadpoolctl.threadpool_limits(limits=1):
                decomposition = decompose(
                    matrix,
                    rng=np.random.default_rng(request.seed),
                    time_limit=request.time_limit,
                    progress=request.progress,
                )
            stored = StoredStrategy(
                parameters={
                    "template": "lrm",
                    "rank": decomposition.rank,
                    "iterations": decomposition.iterations,
                    "converged": decomposition.converged,
                    "bias_sq": decomposition.bias_sq,
                    "stopped_early": decomposition.stopped_early,
                    "seed": request.seed,
                },
                arrays={"B": decomposition.B, "L": decomposition.L},
            )
            cache.save(key, stored)
        rows: dict[str, tuple[int, int]] = {}
        start = 0
        for item in workload.items:
            rows[item.name] = (start, start + item.num_queries)
            start += item.num_queries
        return FactorizationStrategy(
            name=self.name,
            B=stored.arrays["B"],
            L=stored.arrays["L"],
            item_rows=rows,
            bias_sq=float(stored.parameters["bias_sq"]),
            parameters=stored.parameters,
        )

    def evaluate(self, strategy: Strategy, request: PlanRequest) -> Evaluation:
        evaluation = super().evaluate(strategy, request)
        note = (
            f"plus bias up to {strategy.parameters['bias_sq']:.3g} × Σx² (relaxed W ≈ BL; "
            f"data-dependent, not in rmse); rank {strategy.parameters.get('rank')}"
        )
        return dataclasses.replace(evaluation, note=note)


MECHANISM = LowRankMechanism()
