"""Hilbert-curve layouts: how a 2-D grid becomes the 1-D cell domain that DAWA partitions.

DAWA lists a 2-D grid's cells along a Hilbert curve (thesis §6.5.5) and runs the 1-D algorithm
unchanged; a rectangle query becomes a union of runs of consecutive positions.
:func:`hilbert_order` covers a 2^k × 2^k grid; :class:`HilbertLayout` any shape, padded to the
enclosing square with always-zero cells or, with ``keep_padding=False``, skipping them.  Public
and data-independent.  References: C. Li, PhD thesis, UMass Amherst, 2013, §6.5.5; Hilbert (1891).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dprelease.mechanisms.dawa.partition import _one_per


def hilbert_order(k: int) -> np.ndarray:
    """Row-major indices of the cells of a ``2^k × 2^k`` grid, in Hilbert-curve order.

    ``order[d] = row · 2^k + col`` of the ``d``-th cell on the curve.  The curve starts at (0, 0)
    and ends at (0, 2^k − 1); consecutive cells share an edge and every aligned ``2^j × 2^j`` block
    is a run of ``4^j`` consecutive positions.  O(4^k · k).

    Examples
    --------
    >>> hilbert_order(1).tolist()  # (0,0) (1,0) (1,1) (0,1)
    [0, 2, 3, 1]
    """
    if not isinstance(k, int | np.integer) or k < 0:
        raise ValueError(f"k ({k}) must be an integer >= 0")
    side = 1 << int(k)
    remaining = np.arange(side * side, dtype=np.int64)
    col = np.zeros_like(remaining)
    row = np.zeros_like(remaining)
    block = 1
    while block < side:  # O(k) passes over 4^k positions
        col_bit = (remaining >> 1) & 1
        row_bit = (remaining ^ col_bit) & 1
        # Rotate/reflect the sub-curve of the quadrant so the pieces join up.
        reflect = (row_bit == 0) & (col_bit == 1)
        col = np.where(reflect, block - 1 - col, col)
        row = np.where(reflect, block - 1 - row, row)
        transpose = row_bit == 0
        col, row = np.where(transpose, row, col), np.where(transpose, col, row)
        col += block * col_bit
        row += block * row_bit
        remaining >>= 2
        block <<= 1
    return row * side + col


@dataclass(frozen=True, kw_only=True, eq=False)
class HilbertLayout:
    """The 1-D domain of a ``rows × cols`` grid listed along a Hilbert curve.

    Position ``p`` of the 1-D domain holds grid cell ``cell_at[p]`` (row-major index into
    ``shape``), or is padding (``cell_at[p] == -1``, always an empty cell).
    """

    shape: tuple[int, int]
    cell_at: np.ndarray
    """Row-major grid index at each 1-D position; −1 for padding (read-only)."""

    def __post_init__(self) -> None:  # built by for_shape: frozen, not re-checked
        cell_at = np.array(self.cell_at, dtype=np.int64)
        cell_at.setflags(write=False)
        object.__setattr__(self, "shape", (int(self.shape[0]), int(self.shape[1])))
        object.__setattr__(self, "cell_at", cell_at)

    @classmethod
    def for_shape(cls, shape: Sequence[int], *, keep_padding: bool = True) -> HilbertLayout:
        """Layout of a ``rows × cols`` grid padded to the enclosing ``2^k × 2^k`` square.

        ``keep_padding=True`` keeps the padding positions in the 1-D domain (``4^k`` cells, the
        padding always empty); ``False`` drops them (``rows · cols`` cells), so no estimate mass
        can land on cells that do not exist.
        """
        if len(shape) != 2 or not all(isinstance(s, int | np.integer) and s >= 1 for s in shape):
            raise ValueError(f"shape ({tuple(shape)}) must be two integers >= 1")
        rows, cols = int(shape[0]), int(shape[1])
        k = max(rows - 1, cols - 1, 0).bit_length()
        side = 1 << k
        order = hilbert_order(k)
        row, col = np.divmod(order, side)
        inside = (row < rows) & (col < cols)
        cell_at = np.where(inside, row * cols + col, -1)
        if not keep_padding:
            cell_at = cell_at[inside]
        return cls(shape=(rows, cols), cell_at=cell_at)

    @property
    def n_positions(self) -> int:
        """Size of the 1-D domain (including padding)."""
        return int(self.cell_at.size)

    def position_of_cell(self) -> np.ndarray:
        """``rows × cols`` array: the 1-D position of every grid cell."""
        position = np.empty(self.shape[0] * self.shape[1], dtype=np.int64)
        real = self.cell_at >= 0
        position[self.cell_at[real]] = np.flatnonzero(real)
        return position.reshape(self.shape)

    def to_1d(self, grid: np.ndarray) -> np.ndarray:
        """The grid's values in Hilbert order (padding positions are 0)."""
        values = np.asarray(grid, dtype=np.float64)
        if values.shape != self.shape:
            raise ValueError(f"grid (shape {values.shape}) must have shape {self.shape}")
        out = np.zeros(self.n_positions)
        real = self.cell_at >= 0
        out[real] = values.ravel()[self.cell_at[real]]
        return out

    def to_2d(self, vector: np.ndarray) -> np.ndarray:
        """The grid from a 1-D vector in Hilbert order (padding positions are dropped)."""
        values = _one_per(vector, self.n_positions, name="vector", per="position")
        out = np.zeros(self.shape[0] * self.shape[1])
        real = self.cell_at >= 0
        out[self.cell_at[real]] = values[real]
        return out.reshape(self.shape)

    def rectangle_pieces(
        self,
        row_lo: np.ndarray | Sequence[int],
        row_hi: np.ndarray | Sequence[int],
        col_lo: np.ndarray | Sequence[int],
        col_hi: np.ndarray | Sequence[int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rectangles ``[row_lo, row_hi] × [col_lo, col_hi]`` (inclusive) as runs of 1-D positions.

        Returns ``(query, lo, hi)``: rectangle ``query`` covers positions ``lo … hi`` of each of its
        runs (ready for ``IntervalWorkload(row=query, lo=lo, hi=hi, weight=1, ...)``).
        O(Σ area · log area).
        """
        bounds = [
            np.atleast_1d(np.asarray(b, dtype=np.int64)) for b in (row_lo, row_hi, col_lo, col_hi)
        ]
        if len({b.shape for b in bounds}) != 1 or bounds[0].ndim != 1:
            raise ValueError("row_lo, row_hi, col_lo and col_hi must be 1-D of one length")
        r0, r1, c0, c1 = bounds
        if np.any((r0 < 0) | (r1 >= self.shape[0]) | (c0 < 0) | (c1 >= self.shape[1])):
            raise ValueError(f"rectangles must lie inside the grid {self.shape}")
        if np.any((r0 > r1) | (c0 > c1)):
            raise ValueError("every rectangle needs row_lo <= row_hi and col_lo <= col_hi")
        position = self.position_of_cell()
        queries, los, his = [], [], []
        for query, (a, b, c, d) in enumerate(zip(r0, r1, c0, c1, strict=True)):
            covered = np.sort(position[a : b + 1, c : d + 1], axis=None)
            run_start = np.flatnonzero(np.diff(covered, prepend=-2) != 1)
            run_end = np.append(run_start[1:], covered.size) - 1
            queries.append(np.full(run_start.size, query))
            los.append(covered[run_start])
            his.append(covered[run_end])
        return np.concatenate(queries), np.concatenate(los), np.concatenate(his)
