"""The SVD lower bound of a union of dense Kronecker Gram terms (Li thesis §4.2.1), for tests.

The product bounds a :class:`~mechanisms.primitives.workload.Workload` (:func:`mechanisms.primitives.lower_bound.svd_bound`)
by the same split method; this entry point takes the per-attribute Grams directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dprelease.mechanisms.primitives.lower_bound import AttributePart, _svd_bound, validate_gram
from dprelease.mechanisms.primitives.operators import gram_ij_parts


def svd_bound_terms(terms: Sequence[Sequence[np.ndarray]]) -> float:
    """SVDB of ``WᵀW = Σ_t ⊗_i terms[t][i]`` (per-attribute Grams, all terms the same sizes).

    Exact; raises ``ValueError`` naming the size when the attributes that are not ``a·I + b·J``
    have more than :data:`DENSE_BOUND_LIMIT` cells together (or there are more than
    :data:`MAX_SPLIT_ATTRIBUTES` marginal-like attributes).
    """
    if isinstance(terms, np.ndarray) or len(terms) == 0:
        raise ValueError("terms must be a non-empty sequence of tuples of Gram matrices")
    grams = [
        tuple(validate_gram(g, name=f"terms[{t}][{i}]") for i, g in enumerate(term))
        for t, term in enumerate(terms)
    ]
    sizes = tuple(g.shape[0] for g in grams[0])
    for t, term in enumerate(grams):
        if tuple(g.shape[0] for g in term) != sizes:
            raise ValueError(
                f"terms[{t}] has attribute sizes {tuple(g.shape[0] for g in term)}, "
                f"terms[0] has {sizes}"
            )
    parts = [[_gram_part(term[i]) for term in grams] for i in range(len(sizes))]
    return _svd_bound(parts, sizes, dense_grams=lambda t, i: grams[t][i])


def _gram_part(gram: np.ndarray) -> AttributePart:
    return gram_ij_parts(gram) or gram
