"""Whether a dense strategy supports a workload, from Grams only.

A least-squares answer ``W·x̂`` is unbiased iff ``W`` lies in the row space of the strategy ``A``
(Li thesis §3.2.1); then its variance is ``v · w (AᵀA)⁺ wᵀ`` per query (Prop 3.4), which each
strategy computes itself.  The SVD lower bound lives in :mod:`mechanisms.lower_bound`.
"""

from __future__ import annotations

import math

import numpy as np

from mechanisms.workload import Workload


def dense_support_residual(workload: Workload, projector: np.ndarray) -> float:
    """Support check of a dense strategy from Grams only; ≈ 0 iff ``A`` supports every item.

    ``projector`` is ``P = (AᵀA)⁺AᵀA`` (N × N).  Per item, the largest column norm of ``W(I − P)``,
    ``√max_j ((I − P)ᵀ WᵀW (I − P))_jj``, relative to ``max(1, max|W|)``: it bounds every entry
    of the residual ``W − WP`` (the previous, W-based measure) from above.  O(N³) per item with
    ``WᵀW`` from closed-form factor Grams; the item's ``m × N`` matrix is never formed.
    """
    complement = np.eye(projector.shape[0]) - projector
    worst = 0.0
    for item in workload.items:
        columns = np.einsum("kj,kj->j", complement, item.dense_gram() @ complement)
        scale = max(1.0, math.prod(factor.max_abs() for factor in item.factors))
        worst = max(worst, math.sqrt(max(float(columns.max()), 0.0)) / scale)
    return worst
