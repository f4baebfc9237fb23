"""``identity``: measure every cell once (the Kronecker product of per-attribute identities).

The baseline of every paper; optimal for workloads of single cells.  An estimate of one cell is
one noisy answer, so its interval uses the noise distribution itself (Laplace quantile under ε-DP).
"""

from __future__ import annotations

from dprelease.mechanisms.primitives.strategies import KronFamily


class IdentityMechanism(KronFamily):
    name = "identity"
    summary = "every cell, once (Kronecker product of identities)"
    family = "identity"


MECHANISM = IdentityMechanism()
