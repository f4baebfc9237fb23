"""``identity``: measure every cell once (the Kronecker product of per-attribute identities).

The baseline of every paper; optimal for workloads of single cells.  An estimate of one cell is
one noisy answer, so its interval uses the noise distribution itself (Laplace quantile under ε-DP).
"""

from __future__ import annotations

from dprelease.mechanisms.primitives.protocol import PlanRequest
from dprelease.mechanisms.primitives.strategies import KronFamily
from dprelease.mechanisms.primitives.workload import cell_vector_reason


class IdentityMechanism(KronFamily):
    name = "identity"
    summary = "every cell, once (Kronecker product of identities)"
    family = "identity"

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        # its evaluation walks every item's factors: refused from sizes past int64 cell indices
        return cell_vector_reason(request.workload)


MECHANISM = IdentityMechanism()
