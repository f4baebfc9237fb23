"""``wavelet``: Haar wavelet coefficients per ordered attribute (Privelet, Xiao et al. 2010).

Sizes that are not powers of two are padded with empty cells whose columns are dropped."""

from __future__ import annotations

from dprelease.mechanisms.primitives.protocol import PlanRequest
from dprelease.mechanisms.primitives.strategies import KronFamily
from dprelease.mechanisms.primitives.workload import cell_vector_reason


class WaveletMechanism(KronFamily):
    name = "wavelet"
    summary = "Haar wavelet coefficients per ordered attribute (Privelet)"
    family = "wavelet"

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        # its evaluation walks every item's factors: refused from sizes past int64 cell indices
        return cell_vector_reason(request.workload)


MECHANISM = WaveletMechanism()
