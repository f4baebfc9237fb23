"""``eigen``: Eigen-Design (Li thesis ch. 5): weighted eigen-queries of the workload Gram.

Near-optimal under Gaussian noise (ρ-zCDP, (ε, δ)); the ε-DP variant (L1 constraint) is also
built.  Works on the dense N × N Gram, so it is limited to small domains (``auto`` considers it up
to :data:`AUTO_MAX_CELLS`, a spec may ask for it up to :data:`MAX_CELLS`)."""

from __future__ import annotations

import math

from dprelease.mechanisms.eigen.design import eigen_design
from dprelease.mechanisms.primitives.compute_limits import predict_eigen_design_seconds
from dprelease.mechanisms.primitives.dense import DenseStrategy
from dprelease.mechanisms.primitives.noise import SENSITIVITY_NORM
from dprelease.mechanisms.primitives.protocol import (
    MatrixMechanism,
    PlanRequest,
    StoredStrategy,
    StrategyCache,
    cache_key,
    require_available,
)
from dprelease.mechanisms.primitives.threads import single_threaded_blas
from dprelease.mechanisms.primitives.workload import magnitude

MAX_CELLS = 4096
AUTO_MAX_CELLS = 2048


class EigenDesignMechanism(MatrixMechanism):
    name = "eigen"
    summary = "Eigen-Design: weighted eigenvectors of the workload Gram (Li thesis ch. 5)"

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        cells = request.workload.num_cells
        if cells > MAX_CELLS:
            return (
                f"Eigen-Design works on the dense {magnitude(cells)}-cell Gram matrix; "
                f"at most {MAX_CELLS} cells"
            )
        if not request.requested and cells > AUTO_MAX_CELLS:
            return f"skipped by auto above {AUTO_MAX_CELLS} cells (ask for it with mechanism: {self.name})"
        return None

    def predicted_seconds(self, request: PlanRequest) -> float:
        if request.workload.num_cells > MAX_CELLS:  # refused; N³ overflows float64 past 5.6e102
            return math.inf
        return predict_eigen_design_seconds(request.workload.num_cells)  # O(N³) eigendecompositions

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> DenseStrategy:
        require_available(self, request)
        norm = f"l{SENSITIVITY_NORM[request.noise]}"  # the token entries have always stored
        key = cache_key("eigen", request.workload_fingerprint, {"norm": norm})
        stored = cache.load(key)
        if stored is None:
            gram = request.workload.dense_gram(weighted=True)  # Σ_t w_t W_tᵀW_t
            with single_threaded_blas():
                design = eigen_design(gram, noise=request.noise)
            stored = StoredStrategy(
                parameters={
                    "template": "eigen-design",
                    "sensitivity_norm": norm,
                    "source": design.source,
                    "eigenvalues_kept": int(design.eigenvalues_kept.size),
                    "solver_relative_gap": float(design.solver_relative_gap),
                },
                arrays={"A": design.A},
            )
            cache.save(key, stored)
        return DenseStrategy(
            name=self.name, matrix=stored.arrays["A"], parameters=stored.parameters
        )


MECHANISM = EigenDesignMechanism()
