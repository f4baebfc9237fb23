"""Workloads: named items of linear queries over a product domain, each a Kronecker product.

An item with factors ``(W_1, …, W_d)`` asks the queries ``W_1 ⊗ … ⊗ W_d`` of the row-major
flattened cell vector.  A marginal over ``{a, b}`` is ``Identity`` on a and b and ``Total``
elsewhere; a CDF is ``Prefix`` on one attribute; rectangles are ``AllRanges`` on two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mechanisms.operators import Factor, Total, kron_apply, kron_matrices


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

    def dense_gram(self) -> np.ndarray:
        """``WᵀW`` as a dense N × N array (small domains only). O(items · N²)."""
        return sum(
            (kron_matrices(term) for term in self.gram_terms()),
            start=np.zeros((self.num_cells, self.num_cells)),
        )

    def attribute_roles(self, ordered: tuple[bool, ...]) -> list[tuple[int, str]]:
        """Per attribute: ``total`` when every item sums it out, else ``ordered``/``categorical``."""
        roles = []
        for axis, n in enumerate(self.domain_shape):
            summed_out = all(isinstance(item.factors[axis], Total) for item in self.items)
            role = "total" if summed_out else ("ordered" if ordered[axis] else "categorical")
            roles.append((n, role))
        return roles
