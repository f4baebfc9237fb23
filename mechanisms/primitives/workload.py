"""Workloads: named items of linear queries over a product domain, each a Kronecker product.

An item with factors ``(W_1, …, W_d)`` asks the queries ``W_1 ⊗ … ⊗ W_d`` of the row-major
flattened cell vector.  A marginal over ``{a, b}`` is ``Identity`` on a and b and ``Total``
elsewhere; a CDF is ``Prefix`` on one attribute; rectangles are ``AllRanges`` on two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from dprelease.mechanisms.primitives.operators import (
    Factor,
    Identity,
    Total,
    kron_apply,
    kron_dense,
    kron_matrices,
)

DENSE_GRAM_MAX_CELLS = 8192
"""Largest domain whose N × N Gram is formed densely (8,192² float64 = 512 MiB)."""

DENSE_MATRIX_MAX_ENTRIES = 1 << 25
"""Largest explicit ``m × N`` workload matrix formed (2^25 float64 = 256 MiB)."""


def check_dense_gram_cells(num_cells: int, *, max_cells: int = DENSE_GRAM_MAX_CELLS) -> None:
    """Refuse, before any work, a dense N × N Gram over more than ``max_cells`` cells."""
    if num_cells > max_cells:
        raise ValueError(
            f"the dense Gram WᵀW of a {num_cells:,}-cell domain needs "
            f"{num_cells * num_cells * 8 / 2**30:.1f} GiB; the limit is {max_cells:,} cells"
        )


@dataclass(frozen=True, kw_only=True)
class WorkloadItem:
    """One output table: the Kronecker product of one factor per domain attribute."""

    name: str
    factors: tuple[Factor, ...]

    @property
    def num_queries(self) -> int:
        return math.prod(f.m for f in self.factors)

    def answer(self, x: np.ndarray) -> np.ndarray:
        """Exact answers ``W x`` for a flattened cell vector. O(N Σ cost(W_i)/n_i)."""
        return kron_apply(self.factors, x)

    def gram_factors(self) -> tuple[np.ndarray, ...]:
        """Per-attribute ``W_iᵀW_i``: the item's Gram is their Kronecker product."""
        return tuple(f.gram() for f in self.factors)

    def dense_gram(self, *, max_cells: int = DENSE_GRAM_MAX_CELLS) -> np.ndarray:
        """``WᵀW = ⊗_i W_iᵀW_i`` as a dense N × N array from closed-form factor Grams, O(N²).

        Never forms the item's ``m × N`` query matrix (2,098,176 × 2,048 for all ranges of 2,048
        cells; its Gram is 2,048 × 2,048).
        """
        check_dense_gram_cells(math.prod(f.n for f in self.factors), max_cells=max_cells)
        return kron_matrices(self.gram_factors())


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The union of a release's items over one domain (all queries, unweighted)."""

    domain_shape: tuple[int, ...]
    items: tuple[WorkloadItem, ...]

    def __post_init__(self) -> None:
        if not self.items:
            raise ValueError("a workload needs at least one item")
        for item in self.items:
            shape = tuple(f.n for f in item.factors)
            if shape != self.domain_shape:
                raise ValueError(
                    f"item {item.name!r} has factor sizes {shape}, domain is {self.domain_shape}"
                )

    @property
    def num_cells(self) -> int:
        return math.prod(self.domain_shape)

    @property
    def num_queries(self) -> int:
        return sum(item.num_queries for item in self.items)

    def gram_terms(self) -> list[tuple[np.ndarray, ...]]:
        """``WᵀW = Σ_items ⊗_i G_{item,i}`` as a list of per-attribute Gram tuples."""
        return [item.gram_factors() for item in self.items]

    def dense_gram(self, *, max_cells: int = DENSE_GRAM_MAX_CELLS) -> np.ndarray:
        """``WᵀW = Σ_items ⊗_i W_iᵀW_i`` as a dense N × N array. O(items · N²), no ``m × N`` W.

        Raises ``ValueError`` naming the size before any work when N > ``max_cells``.
        """
        check_dense_gram_cells(self.num_cells, max_cells=max_cells)
        gram = np.zeros((self.num_cells, self.num_cells))
        for item in self.items:
            gram += item.dense_gram(max_cells=max_cells)
        return gram

    def dense_matrix(self, *, max_entries: int = DENSE_MATRIX_MAX_ENTRIES) -> np.ndarray:
        """The explicit stacked ``m × N`` query matrix (items in order), for methods that need W
        itself (e.g. LRM's factorisation).  Raises ``ValueError`` naming the size before any work
        when ``m · N`` exceeds ``max_entries``.  O(m N)."""
        entries = self.num_queries * self.num_cells
        if entries > max_entries:
            raise ValueError(
                f"the explicit workload matrix is {self.num_queries:,} × {self.num_cells:,} "
                f"({entries * 8 / 2**30:.2f} GiB); the limit is {max_entries:,} entries"
            )
        return np.vstack([kron_dense(item.factors) for item in self.items])

    def attribute_roles(self, ordered: tuple[bool, ...]) -> list[tuple[int, str]]:
        """Per attribute: ``total`` when every item sums it out, else ``ordered``/``categorical``."""
        roles = []
        for axis, n in enumerate(self.domain_shape):
            summed_out = all(isinstance(item.factors[axis], Total) for item in self.items)
            role = "total" if summed_out else ("ordered" if ordered[axis] else "categorical")
            roles.append((n, role))
        return roles


def axes_of(mask: int, num_attributes: int) -> tuple[int, ...]:
    """Ascending attribute indices of a bitmask.

    >>> axes_of(0b101, 3)
    (0, 2)
    """
    return tuple(i for i in range(num_attributes) if mask >> i & 1)


def mask_of(axes: Iterable[int]) -> int:
    return sum(1 << int(a) for a in set(axes))


def item_subset(item: WorkloadItem) -> int | None:
    """Bitmask of the attributes a marginal item keeps; None when a factor is not Identity/Total."""
    mask = 0
    for axis, factor in enumerate(item.factors):
        if isinstance(factor, Identity):
            mask |= 1 << axis
        elif not isinstance(factor, Total):
            return None
    return mask
