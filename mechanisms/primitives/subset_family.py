"""The attribute subsets a subset-space strategy is computed on, and the lattice sums over them.

:mod:`~mechanisms.primitives.marginal_strategies` keeps one number per attribute subset ``T``
(bit i of the bitmask ⇔ attribute i): projections ``g_T``, eigenvalues ``μ_T``, weights ``w_T``.
A :class:`SubsetFamily` says which subsets those arrays hold and in what order:

* **every subset** (``d ≤ MAX_MARGINAL_ATTRIBUTES``): position = bitmask, 2^d entries, the lattice
  sums are the O(d 2^d) transforms below.  HDMM's marginals template searches this whole lattice.
* **a downward-closed family** (any ``d``): the subsets of the workload's own marginals, ascending
  bitmasks (Python ints: more than 63 attributes are fine).  A workload of marginals has no mass
  outside the downward closure of its tables (``g_T = 0`` unless ``T ⊆ R`` for some table ``R``),
  so the centred design, the largest-variance design and every error are the same as on the whole
  lattice; the sums cost O(Σ_S 2^|S|), never 2^d.

Values that are products over all attributes (``c_T = Π_{i∉T} n_i``, the cell count ``N``) are
float64: the spec bounds ``N`` well below 1e308.

*Privacy*: public sizes and masks only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import sparse

MAX_MARGINAL_ATTRIBUTES = 20
"""Largest ``d`` whose family is the whole lattice (2^d subsets: the marginals template's)."""
MAX_FAMILY_SUBSETS = 20_000_000
"""Largest downward closure planned (Σ 2^|R| over the tables bounds it; ~1 GB of pairs)."""
_ENUMERATED_BITS = 16


def set_bits(mask: int) -> list[int]:
    """Ascending attribute indices of ``mask``. O(bits set), any number of attributes.

    >>> set_bits(1 << 70 | 0b101)
    [0, 2, 70]
    """
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def submasks(mask: int) -> Iterable[int]:
    """Every subset of ``mask``, ``mask`` first and 0 last. O(2^|mask|)."""
    sub = mask
    while True:
        yield sub
        if sub == 0:
            return
        sub = (sub - 1) & mask


def down_closure(masks: Iterable[int]) -> list[int]:
    """Every subset of every mask, ascending. O(Σ 2^|R|).

    >>> down_closure([0b101])
    [0, 1, 4, 5]
    """
    closed: set[int] = set()
    for mask in set(masks):
        if mask not in closed:
            closed.update(submasks(mask))
    return sorted(closed)


def maximal_masks(masks: Iterable[int]) -> list[int]:
    """The masks contained in no other mask of the list (ascending, duplicates removed).

    Larger masks first; a mask is dropped when a kept one covers it.  O(Σ 2^|R|) over masks of
    at most ``_ENUMERATED_BITS`` attributes (their subsets are recorded), plus one test per wider
    kept mask.

    >>> maximal_masks([0b011, 0b001, 0b110])
    [3, 6]
    """
    unique = sorted({int(m) for m in masks}, key=lambda m: (-m.bit_count(), m))
    covered: set[int] = set()
    wide: list[int] = []
    out = []
    for mask in unique:
        if mask in covered or any(mask & ~other == 0 for other in wide):
            continue
        out.append(mask)
        if mask.bit_count() <= _ENUMERATED_BITS:
            covered.update(submasks(mask))
        else:
            wide.append(mask)
    return sorted(out)


def closure_size_bound(masks: Iterable[int]) -> int:
    """``Σ 2^|R|`` over the distinct masks: an upper bound on the downward closure, O(masks)."""
    return sum(1 << mask.bit_count() for mask in set(masks))


@dataclass(frozen=True, eq=False)
class SubsetFamily:
    """The subsets one subset-space computation holds, in array order."""

    sizes: tuple[int, ...]
    closed_masks: tuple[int, ...] | None = None
    """Ascending downward-closed masks; None for every subset (position = mask)."""

    @classmethod
    def every_subset(cls, sizes: Sequence[int]) -> SubsetFamily:
        sizes = tuple(int(n) for n in sizes)
        if len(sizes) > MAX_MARGINAL_ATTRIBUTES:
            raise ValueError(
                f"the whole lattice of {len(sizes)} attributes has 2^{len(sizes)} subsets; at "
                f"most {MAX_MARGINAL_ATTRIBUTES} attributes"
            )
        return cls(sizes=sizes)

    @classmethod
    def below(cls, sizes: Sequence[int], masks: Iterable[int]) -> SubsetFamily:
        """Every subset of ``masks`` (the workload's or the strategy's own); refused over
        ``MAX_FAMILY_SUBSETS``, naming the bound."""
        sizes = tuple(int(n) for n in sizes)
        masks = list(masks)
        bound = closure_size_bound(masks)
        if bound > MAX_FAMILY_SUBSETS:
            raise ValueError(
                f"the marginals have up to {bound:,} attribute subsets below them; at most "
                f"{MAX_FAMILY_SUBSETS:,} are planned: use fewer or lower-order marginals"
            )
        if any(mask >> len(sizes) for mask in masks):
            raise ValueError(f"a mask names an attribute beyond the {len(sizes)} of the domain")
        return cls(sizes=sizes, closed_masks=tuple(down_closure(masks)))

    @classmethod
    def for_masks(cls, sizes: Sequence[int], masks: Iterable[int]) -> SubsetFamily:
        """The whole lattice up to ``MAX_MARGINAL_ATTRIBUTES`` attributes, else the closure."""
        if len(sizes) <= MAX_MARGINAL_ATTRIBUTES:
            return cls.every_subset(sizes)
        return cls.below(sizes, masks)

    @property
    def is_lattice(self) -> bool:
        return self.closed_masks is None

    def __len__(self) -> int:
        return 1 << len(self.sizes) if self.closed_masks is None else len(self.closed_masks)

    @property
    def num_cells(self) -> float:
        return float(math.prod(self.sizes))

    def masks_at(self, positions: Iterable[int]) -> list[int]:
        """The bitmasks at array ``positions``."""
        if self.closed_masks is None:
            return [int(p) for p in positions]
        return [self.closed_masks[int(p)] for p in positions]

    @cached_property
    def _position(self) -> dict[int, int]:
        return {mask: p for p, mask in enumerate(self.closed_masks or ())}

    def position(self, mask: int) -> int | None:
        """Array position of ``mask``; None when the family does not hold it."""
        if self.closed_masks is None:
            return mask if 0 <= mask < 1 << len(self.sizes) else None
        return self._position.get(mask)

    def value_at(self, values: np.ndarray, mask: int) -> float:
        """``values[mask]``, 0 for a subset outside the family (where every quantity is 0)."""
        position = self.position(mask)
        return 0.0 if position is None else float(values[position])

    # --- products over the attributes of each subset ----------------------------------------
    @cached_property
    def _members(self) -> tuple[np.ndarray, np.ndarray]:
        """(position, attribute) for every attribute of every closed subset. O(Σ |S|)."""
        rows, columns = [], []
        for position, mask in enumerate(self.closed_masks or ()):
            bits = set_bits(mask)
            rows.extend([position] * len(bits))
            columns.extend(bits)
        return np.asarray(rows, dtype=np.int64), np.asarray(columns, dtype=np.int64)

    def products(self, kept: Sequence[float], summed: Sequence[float]) -> np.ndarray:
        """``out[S] = Π_i (kept[i] if i ∈ S else summed[i])``. O(d 2^d) on the lattice, O(Σ |S|)
        on a closed family (``summed`` must be non-zero there)."""
        kept_values = np.asarray(kept, dtype=np.float64)
        summed_values = np.asarray(summed, dtype=np.float64)
        if self.closed_masks is None:
            return per_subset_product(kept_values, summed_values)
        if np.any(summed_values == 0):
            raise ValueError("products over a closed family need non-zero summed-out factors")
        rows, columns = self._members
        out = np.full(len(self), float(np.prod(summed_values)))
        np.multiply.at(out, rows, kept_values[columns] / summed_values[columns])
        return out

    def summed_out_sizes(self) -> np.ndarray:
        """``c_T = Π_{i∉T} n_i``."""
        return self.products([1.0] * len(self.sizes), [float(n) for n in self.sizes])

    def multiplicities(self) -> np.ndarray:
        """``r_T = Π_{i∈T} (n_i − 1)``: the dimension of the eigenspace ``Q_T``."""
        return self.kept_products([float(n - 1) for n in self.sizes])

    def kept_products(self, values: Sequence[float]) -> np.ndarray:
        """``Π_{i∈T} values[i]``."""
        return self.products(list(values), [1.0] * len(values))

    # --- sums over the lattice order --------------------------------------------------------
    @cached_property
    def _pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(superset position, subset position) for every pair ``T ⊆ S`` of the closed family.
        O(Σ_S 2^|S|) lookups once."""
        position = self._position
        supersets, subsets = [], []
        for p, mask in enumerate(self.closed_masks or ()):
            for sub in submasks(mask):
                supersets.append(p)
                subsets.append(position[sub])
        return np.asarray(supersets, dtype=np.int64), np.asarray(subsets, dtype=np.int64)

    def superset_sums(self, values: np.ndarray) -> np.ndarray:
        """``out[T] = Σ_{S ⊇ T} values[S]`` over the family (zeta transform over supersets)."""
        values = self._checked(values)
        if self.closed_masks is None:
            return superset_sums(values, len(self.sizes))
        supersets, subsets = self._pairs
        return np.bincount(subsets, weights=values[supersets], minlength=len(self))

    def subset_sums(self, values: np.ndarray) -> np.ndarray:
        """``out[S] = Σ_{T ⊆ S} values[T]`` (the adjoint of :meth:`superset_sums`)."""
        values = self._checked(values)
        if self.closed_masks is None:
            return subset_sums(values, len(self.sizes))
        supersets, subsets = self._pairs
        return np.bincount(supersets, weights=values[subsets], minlength=len(self))

    def subset_rows(self, positions: np.ndarray, values: np.ndarray) -> sparse.csr_array:
        """Rows ``positions`` of the family × family matrix ``(S, T) ↦ values[T]`` for ``T ⊆ S``
        (a closed family only: its pairs are stored by superset). O(pairs of those rows)."""
        if self.closed_masks is None:
            raise ValueError("subset_rows needs a closed family (the lattice has 3^d pairs)")
        supersets, subsets = self._pairs
        starts = np.concatenate([[0], np.cumsum(np.bincount(supersets, minlength=len(self)))])
        matrix = sparse.csr_array(
            (np.asarray(values, dtype=np.float64)[subsets], subsets, starts),
            shape=(len(self), len(self)),
        )
        return matrix[np.asarray(positions, dtype=np.int64)]

    def maximal_positions(self) -> list[int]:
        """Positions of the subsets no other member contains (the full set on the lattice)."""
        if self.closed_masks is None:
            return [(1 << len(self.sizes)) - 1]
        return [self._position[mask] for mask in maximal_masks(self.closed_masks)]

    def _checked(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (len(self),):
            raise ValueError(f"values (shape {values.shape}) must have one entry per subset")
        return values


def _lattice_transform(
    values: np.ndarray, num_attributes: int, *, upward: bool, sign: float
) -> np.ndarray:
    """One pass per bit, each a contiguous 3-D view: ``low += sign · high`` (``upward=False``) or
    ``high += sign · low``. O(d 2^d)."""
    out = np.array(values, dtype=np.float64, copy=True)
    if out.shape != (1 << num_attributes,):
        raise ValueError(f"values (shape {out.shape}) must have length 2^d = {1 << num_attributes}")
    for bit in range(num_attributes):
        pairs = out.reshape(-1, 2, 1 << bit)  # (2^(d−1−bit), 2, 2^bit): the middle axis is `bit`
        target, source = (pairs[:, 1, :], pairs[:, 0, :]) if upward else (pairs[:, 0], pairs[:, 1])
        target += sign * source  # sign is ±1: exact
    return out


def superset_sums(values: np.ndarray, num_attributes: int) -> np.ndarray:
    """``out[U] = Σ_{S ⊇ U} values[S]`` over the whole lattice (zeta transform). O(d 2^d)."""
    return _lattice_transform(values, num_attributes, upward=False, sign=1.0)


def subset_sums(values: np.ndarray, num_attributes: int) -> np.ndarray:
    """``out[S] = Σ_{U ⊆ S} values[U]`` (zeta transform over subsets; adjoint of supersets)."""
    return _lattice_transform(values, num_attributes, upward=True, sign=1.0)


def per_subset_product(kept: Sequence[float], summed: Sequence[float]) -> np.ndarray:
    """``out[S] = Π_i (kept[i] if i ∈ S else summed[i])`` for every bitmask S. O(2^d)."""
    out = np.ones(1)
    for kept_value, summed_value in zip(kept, summed, strict=True):
        out = np.concatenate([out * summed_value, out * kept_value])
    return out
