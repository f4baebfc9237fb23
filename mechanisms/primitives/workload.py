"""Workloads: named items of linear queries over a product domain, each a Kronecker product.

An item with factors ``(W_1, …, W_d)`` asks the queries ``W_1 ⊗ … ⊗ W_d`` of the row-major
flattened cell vector.  A marginal over ``{a, b}`` is ``Identity`` on a and b and ``Total``
elsewhere; a CDF is ``Prefix`` on one attribute; rectangles are ``AllRanges`` on two.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

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

MAX_INDEXED_CELLS = 10**18
"""Largest domain a mechanism that works on the cell vector plans for: cell indices are int64
(2⁶³ ≈ 9.2e18) and products of sizes float64.  Only a workload of marginals, planned from
per-attribute sizes and measured subsets, goes past it."""


def magnitude(count: int) -> str:
    """``count`` as ``1.23e+45`` without converting it to float (which overflows past 1.8e308)
    or to decimal (Python refuses past 4,300 digits); exact ``{:,}`` below 10¹⁵. O(digits).

    >>> magnitude(10**400), magnitude(1500)
    ('1e+400', '1,500')
    """
    if count < 10**15:
        return f"{count:,}"
    exponent = math.floor(math.log10(count))
    mantissa = count / 10 ** (exponent - 15) / 1e15  # an int quotient is a correctly rounded float
    if round(mantissa, 2) >= 10:  # log10 rounded up to an exact power of ten
        exponent, mantissa = exponent + 1, mantissa / 10
    return f"{mantissa:.3g}e+{exponent:02d}"


def cell_vector_reason(workload: Workload) -> str | None:
    """Why a mechanism that plans over the full cell vector cannot serve ``workload`` (more than
    :data:`MAX_INDEXED_CELLS` cells), from sizes alone; None when it can. O(d)."""
    if workload.num_cells > MAX_INDEXED_CELLS:
        return (
            f"it works on the full cell vector, and this domain has {magnitude(workload.num_cells)} "
            f"cells; at most {MAX_INDEXED_CELLS:.0e} (cell indices are 64-bit integers)"
        )
    return None


def check_dense_gram_cells(num_cells: int, *, max_cells: int = DENSE_GRAM_MAX_CELLS) -> None:
    """Refuse, before any work, a dense N × N Gram over more than ``max_cells`` cells."""
    if num_cells > max_cells:
        raise ValueError(
            f"the dense Gram WᵀW of a {num_cells:,}-cell domain needs "
            f"{num_cells * num_cells * 8 / 2**30:.1f} GiB; the limit is {max_cells:,} cells"
        )


def check_weight(weight: float, *, where: str) -> None:
    """An item weight is a finite number > 0 (1: the item counts once)."""
    if not (math.isfinite(weight) and weight > 0):
        raise ValueError(f"{where}: weight ({weight}) must be a finite number > 0")


@functools.cache
def shared_identity(n: int) -> Identity:
    """The one ``Identity(n)`` marginal items share (factors are immutable operators)."""
    return Identity(n)


@functools.cache
def shared_total(n: int) -> Total:
    """The one ``Total(n)`` marginal items share."""
    return Total(n)


@functools.cache
def _shared_totals(domain_shape: tuple[int, ...]) -> tuple[Total, ...]:
    return tuple(shared_total(n) for n in domain_shape)


@dataclass(frozen=True, kw_only=True)
class WorkloadItem:
    """One output table: the Kronecker product of one factor per domain attribute.

    ``kept`` (set only by :meth:`marginal`) lists, ascending, the attributes of a marginal item, whose
    factors are then the shared ``Identity``/``Total`` instances: :func:`item_subset` reads it in
    O(k) and :class:`Workload` checks the item's shape with C-level identity tests.
    """

    name: str
    factors: tuple[Factor, ...]
    weight: float = 1.0
    """How much the item's total variance counts in what optimisers minimise (the spec's
    ``weight``): they see ``Σ_items weight · W_itemᵀW_item``.  Reported errors are unweighted.
    Checked by :class:`Workload` (not here: no per-item hook on the 166,750-table path)."""
    kept: tuple[int, ...] | None = field(default=None, init=False)
    """Set only by :meth:`marginal` (so always consistent with ``factors``); None otherwise."""

    @classmethod
    def marginal(
        cls,
        *,
        name: str,
        domain_shape: tuple[int, ...],
        kept: Iterable[int],
        weight: float = 1.0,
    ) -> WorkloadItem:
        """The marginal over the attributes ``kept``: shared ``Identity`` factors on them, shared
        ``Total`` elsewhere. O(d) in C plus O(k)."""
        axes = tuple(sorted(set(kept)))
        factors = list(_shared_totals(domain_shape))
        for axis in axes:
            factors[axis] = shared_identity(domain_shape[axis])
        item = cls(name=name, factors=tuple(factors), weight=weight)
        object.__setattr__(item, "kept", axes)  # frozen: set once, here
        return item

    def with_weight(self, weight: float) -> WorkloadItem:
        """This item with ``weight`` (``kept`` carried over: ``dataclasses.replace`` drops it)."""
        check_weight(weight, where=f"item {self.name!r}")
        item = WorkloadItem(name=self.name, factors=self.factors, weight=weight)
        object.__setattr__(item, "kept", self.kept)  # frozen: consistent with the same factors
        return item

    def has_shape(self, domain_shape: tuple[int, ...]) -> bool:
        """Whether the factor sizes are ``domain_shape``: O(d) identity tests in C for a
        :meth:`marginal` item of shared factors, O(d) Python otherwise."""
        if self.kept is not None and len(self.factors) == len(domain_shape):
            totals = _shared_totals(domain_shape)
            same = sum(map(operator.is_, self.factors, totals))
            if same + len(self.kept) == len(domain_shape) and all(
                self.factors[a] is shared_identity(domain_shape[a]) for a in self.kept
            ):
                return True
        return tuple(f.n for f in self.factors) == domain_shape

    @property
    def num_queries(self) -> int:
        """Rows of the table: O(k) for a marginal item (a Total factor has one row), else O(d)."""
        if self.kept is not None:
            return math.prod(self.factors[a].m for a in self.kept)
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
    """The union of a release's items over one domain.  Every figure reported of it is unweighted;
    the items' ``weight`` enters only what optimisers minimise (the ``weighted=True`` forms)."""

    domain_shape: tuple[int, ...]
    items: tuple[WorkloadItem, ...]

    def __post_init__(self) -> None:
        if not self.items:
            raise ValueError("a workload needs at least one item")
        for item in self.items:  # O(items · d) in C for marginal items of shared factors
            if item.weight != 1.0:
                check_weight(item.weight, where=f"item {item.name!r}")
            if not item.has_shape(self.domain_shape):
                shape = tuple(f.n for f in item.factors)
                raise ValueError(
                    f"item {item.name!r} has factor sizes {shape}, domain is {self.domain_shape}"
                )

    @property
    def num_cells(self) -> int:
        return math.prod(self.domain_shape)

    @property
    def num_queries(self) -> int:
        return sum(item.num_queries for item in self.items)

    @property
    def weighted(self) -> bool:
        """Whether some item has a weight other than 1. O(items)."""
        return any(item.weight != 1.0 for item in self.items)

    def gram_terms(self, *, weighted: bool = False) -> list[tuple[np.ndarray, ...]]:
        """``WᵀW = Σ_items ⊗_i G_{item,i}`` as a list of per-attribute Gram tuples; ``weighted``:
        ``Σ_items w_item ⊗_i G_{item,i}`` (the weight scales the first factor of its term)."""
        terms = [item.gram_factors() for item in self.items]
        if not weighted:
            return terms
        return [
            term if item.weight == 1.0 else (item.weight * term[0], *term[1:])
            for item, term in zip(self.items, terms, strict=True)
        ]

    def dense_gram(
        self, *, max_cells: int = DENSE_GRAM_MAX_CELLS, weighted: bool = False
    ) -> np.ndarray:
        """``WᵀW = Σ_items ⊗_i W_iᵀW_i`` as a dense N × N array (``weighted``: each item's term
        times its weight). O(items · N²), no ``m × N`` W.

        Raises ``ValueError`` naming the size before any work when N > ``max_cells``.
        """
        check_dense_gram_cells(self.num_cells, max_cells=max_cells)
        gram = np.zeros((self.num_cells, self.num_cells))
        for item in self.items:
            term = item.dense_gram(max_cells=max_cells)
            gram += item.weight * term if weighted and item.weight != 1.0 else term
        return gram

    def dense_matrix(
        self, *, max_entries: int = DENSE_MATRIX_MAX_ENTRIES, weighted: bool = False
    ) -> np.ndarray:
        """The explicit stacked ``m × N`` query matrix (items in order), for methods that need W
        itself (e.g. LRM's factorisation); ``weighted``: each item's rows times ``√weight`` (its
        Gram then counts ``weight`` times).  Raises ``ValueError`` naming the size before any
        work when ``m · N`` exceeds ``max_entries``.  O(m N)."""
        entries = self.num_queries * self.num_cells
        if entries > max_entries:
            raise ValueError(
                f"the explicit workload matrix is {self.num_queries:,} × {self.num_cells:,} "
                f"({entries * 8 / 2**30:.2f} GiB); the limit is {max_entries:,} entries"
            )
        blocks = []
        for item in self.items:
            block = kron_dense(item.factors)
            blocks.append(
                math.sqrt(item.weight) * block if weighted and item.weight != 1.0 else block
            )
        return np.vstack(blocks)

    def attribute_roles(self, ordered: tuple[bool, ...]) -> list[tuple[int, str]]:
        """Per attribute: ``total`` when every item sums it out, else ``ordered``/``categorical``."""
        # O(Σ k) over marginal items, O(d) per other item (not O(items · d) Python)
        used: set[int] = set()
        for item in self.items:
            if item.kept is not None:
                used.update(item.kept)
            else:
                used.update(a for a, f in enumerate(item.factors) if not isinstance(f, Total))
        roles = []
        for axis, n in enumerate(self.domain_shape):
            summed_out = axis not in used
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
    """Bitmask of the attributes a marginal item keeps; None when a factor is not Identity/Total.
    O(k) for a :meth:`WorkloadItem.marginal` item, O(d) otherwise."""
    if item.kept is not None:
        return mask_of(item.kept)
    mask = 0
    for axis, factor in enumerate(item.factors):
        if isinstance(factor, Identity):
            mask |= 1 << axis
        elif not isinstance(factor, Total):
            return None
    return mask
