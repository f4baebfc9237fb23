"""Reference implementations of the weighted-marginals Gram algebra applied to data-sized vectors.

The product never needs these (strategies are measured through
:class:`~mechanisms.primitives.union.UnionStrategy` or marginal by marginal); the tests check the subset-space
algebra of :mod:`mechanisms.primitives.marginal_strategies` against them and the dense matrices, and
``benchmarks/strategy_bench.py`` times the pseudo-inverse apply.  Ideas: McKenna et al., HDMM,
PVLDB 11(10) 2018, §6; the code is ours.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from dprelease.mechanisms.primitives.marginal_strategies import (
    eigenspace_multiplicities,
    validate_domain_sizes,
)
from dprelease.mechanisms.primitives.subset_family import (
    _lattice_transform,
    per_subset_product,
    superset_sums,
)


def summed_out_sizes(domain_sizes: Sequence[int]) -> np.ndarray:
    """``m_S = Π_{i ∉ S} n_i``: the eigenvalue of ``B_S`` on the all-means eigenspace."""
    return per_subset_product([1.0] * len(domain_sizes), [float(n) for n in domain_sizes])


def gram_eigenvalues(coefficients: np.ndarray, domain_sizes: Sequence[int]) -> np.ndarray:
    """Eigenvalues ``λ_U`` of ``Σ_S c_S B_S`` (one per eigenspace U). O(d 2^d)."""
    return superset_sums(coefficients * summed_out_sizes(domain_sizes), len(domain_sizes))


def superset_differences(values: np.ndarray, num_attributes: int) -> np.ndarray:
    """Inverse of ``superset_sums`` (Möbius transform over supersets). O(d 2^d)."""
    return _lattice_transform(values, num_attributes, upward=False, sign=-1.0)


def gram_coefficients(eigenvalues: np.ndarray, domain_sizes: Sequence[int]) -> np.ndarray:
    """Coefficients ``c_S`` of the algebra element with eigenvalues ``λ_U``. O(d 2^d)."""
    return superset_differences(eigenvalues, len(domain_sizes)) / summed_out_sizes(domain_sizes)


def pseudo_inverse_coefficients(
    coefficients: np.ndarray, domain_sizes: Sequence[int]
) -> np.ndarray:
    """Coefficients of the Moore–Penrose pseudo-inverse of ``Σ_S c_S B_S``. O(d 2^d)."""
    eigenvalues = gram_eigenvalues(coefficients, domain_sizes)
    inverted = np.zeros_like(eigenvalues)
    keep = np.abs(eigenvalues) > 1e-12 * max(float(np.abs(eigenvalues).max()), 1e-300)
    inverted[keep] = 1.0 / eigenvalues[keep]
    return gram_coefficients(inverted, domain_sizes)


def _check_vector(vector: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float64)
    size = int(np.prod(sizes, dtype=np.int64))
    if array.shape != (size,):
        raise ValueError(f"vector (shape {array.shape}) must have shape ({size},) = Π domain_sizes")
    return array.reshape(sizes)


def _apply_into(coefficients: np.ndarray, tensor: np.ndarray, axis: int, out: np.ndarray) -> None:
    """``out += (Σ_S c_S ⊗_{i ≥ axis} (I | J)) tensor`` over attributes ``axis …``, broadcasting.

    ``coefficients`` is indexed by the bits of attributes ``axis …`` (bit 0 = ``axis``).  The J
    branch sums ``tensor`` over ``axis`` first, so the work is O(N Π (1 + 1/n_i)) overall.
    """
    if coefficients.size == 1:
        if coefficients[0] != 0.0:
            out += coefficients[0] * tensor
        return
    kept, summed = coefficients[1::2], coefficients[0::2]  # bit 0 (this axis) set / not set
    if np.any(kept):
        _apply_into(kept, tensor, axis + 1, out)
    if np.any(summed):
        partial = np.zeros((*out.shape[:axis], 1, *out.shape[axis + 1 :]))
        _apply_into(summed, tensor.sum(axis=axis, keepdims=True), axis + 1, partial)
        out += partial  # broadcast along `axis`: J x = 1 (1ᵀ x)


def marginals_gram_apply(
    coefficients: np.ndarray, domain_sizes: Sequence[int], vector: np.ndarray
) -> np.ndarray:
    """``(Σ_S c_S B_S) v`` for a length-N vector, without forming the N × N matrix.

    O(N Π (1 + 1/n_i)) time, about 2N extra memory.
    """
    sizes = validate_domain_sizes(domain_sizes)
    coefficients = np.asarray(coefficients, dtype=np.float64)
    if coefficients.shape != (2 ** len(sizes),):
        raise ValueError(
            f"coefficients (shape {coefficients.shape}) must have length 2^d = {2 ** len(sizes)}"
        )
    tensor = _check_vector(vector, sizes)
    out = np.zeros(sizes)
    _apply_into(coefficients, tensor, 0, out)
    return out.ravel()


def marginals_gram_pinv_apply(
    weights: np.ndarray, domain_sizes: Sequence[int], vector: np.ndarray
) -> np.ndarray:
    """``(AᵀA)⁺ v`` for the weighted-marginals strategy ``A`` (``AᵀA = Σ_S w_S² B_S``).

    The pseudo-inverse lives in the same algebra (O(d 2^d) to find), then is applied like
    :func:`marginals_gram_apply`.  Least squares from answers ``y`` is
    ``x̂ = (AᵀA)⁺ Aᵀ y`` with :func:`marginal_measurements_transpose`.
    """
    sizes = validate_domain_sizes(domain_sizes)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (2 ** len(sizes),):
        raise ValueError(
            f"weights (shape {weights.shape}) must have length 2^d = {2 ** len(sizes)}"
        )
    return marginals_gram_apply(pseudo_inverse_coefficients(weights**2, sizes), sizes, vector)


def _summed_axes(mask: int, num_attributes: int) -> tuple[int, ...]:
    return tuple(i for i in range(num_attributes) if not mask >> i & 1)


def marginal_measurements(
    weights: np.ndarray, domain_sizes: Sequence[int], vector: np.ndarray
) -> np.ndarray:
    """``A x``: the concatenated weighted marginals ``w_S · M_S x`` for ``w_S ≠ 0``, S ascending.

    Each marginal is flattened row-major over its kept attributes (in attribute order).
    """
    sizes = validate_domain_sizes(domain_sizes)
    tensor = _check_vector(vector, sizes)
    parts = [
        weight * tensor.sum(axis=_summed_axes(mask, len(sizes))).ravel()
        for mask, weight in enumerate(np.asarray(weights, dtype=np.float64))
        if weight != 0.0
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


def marginal_measurements_transpose(
    weights: np.ndarray, domain_sizes: Sequence[int], answers: np.ndarray
) -> np.ndarray:
    """``Aᵀ y`` for answers laid out as :func:`marginal_measurements` returns them."""
    sizes = validate_domain_sizes(domain_sizes)
    answers = np.asarray(answers, dtype=np.float64)
    out = np.zeros(sizes)
    offset = 0
    for mask, weight in enumerate(np.asarray(weights, dtype=np.float64)):
        if weight == 0.0:
            continue
        shape = tuple(n if mask >> i & 1 else 1 for i, n in enumerate(sizes))
        count = int(np.prod(shape, dtype=np.int64))
        if offset + count > answers.size:
            raise ValueError(f"answers (length {answers.size}) are too short for these weights")
        out += weight * answers[offset : offset + count].reshape(shape)
        offset += count
    if offset != answers.size:
        raise ValueError(f"answers (length {answers.size}) must have length {offset}")
    return out.ravel()


def subset_mask(subset: Iterable[int], num_attributes: int) -> int:
    """Bitmask of a subset of attribute indices (bit i ⇔ attribute i kept)."""
    mask = 0
    for attribute in subset:
        index = int(attribute)
        if not 0 <= index < num_attributes:
            raise ValueError(f"attribute index ({index}) must be in [0, {num_attributes})")
        mask |= 1 << index
    return mask


def subsets_projections(
    subsets: Sequence[Iterable[int]], domain_sizes: Sequence[int]
) -> np.ndarray:
    """``tr(WᵀW Q_T)`` for the workload of all marginals over ``subsets`` (unit weight each)."""
    sizes = validate_domain_sizes(domain_sizes)
    d = len(sizes)
    coefficients = np.zeros(2**d)
    for subset in subsets:
        coefficients[subset_mask(subset, d)] += 1.0
    return eigenspace_multiplicities(sizes) * gram_eigenvalues(coefficients, sizes)
