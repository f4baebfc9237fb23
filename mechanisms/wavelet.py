"""``wavelet``: Haar wavelet coefficients per ordered attribute (Privelet, Xiao et al. 2010).

Sizes that are not powers of two are padded with empty cells whose columns are dropped."""

from __future__ import annotations

from dprelease.mechanisms.primitives.strategies import KronFamily


class WaveletMechanism(KronFamily):
    name = "wavelet"
    summary = "Haar wavelet coefficients per ordered attribute (Privelet)"
    family = "wavelet"


MECHANISM = WaveletMechanism()
