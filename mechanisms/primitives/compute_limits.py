"""Bounded, visible long work: a deadline, a progress callback, interruptible heavy calls, costs.

Every strategy optimiser (LRM, the optimised templates, the union weights, the LDP optimiser)
takes keyword-only ``time_limit: float | None`` and ``progress: Progress | None``.  It builds one
:class:`WorkLimit` at entry and passes that same object (an absolute deadline) down to every
stage, checks it at safe points at least every ~0.5 s of work, and when it has expired returns its
best strategy so far with ``stopped_early`` set.  Ctrl-C (``KeyboardInterrupt``) is never caught:

* Python delivers it between bytecodes, so long BLAS products are split into row blocks of at
  most :data:`BLOCK_FLOPS` (:func:`blocked_matmul`);
* one LAPACK call (an eigendecomposition, an SVD) cannot be split, so calls predicted to take
  longer than about a second run in a worker thread while the caller waits in short slices
  (:func:`interruptible`).

Also the machine constants the optimisers' ``predict_seconds`` are calibrated against, and
:func:`predict_eigen_design_seconds`.  Pure: no global state, no I/O, no data; the clock is
``time.monotonic``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import TypeVar

import numpy as np

Progress = Callable[[float, str], None]
"""``progress(fraction, message)``: fraction done in [0, 1] (NaN when unknown) and a short public
message (sizes, iteration counts, achieved error: never data)."""

_Result = TypeVar("_Result")

# One core, OpenBLAS with one thread (benchmarks/predict_bench.py --calibrate machine): an eigh
# costs about 9·n³ DGEMM flops, a thin SVD with both factors about 27·m·n·k.
DGEMM_FLOPS_PER_SECOND = 4.0e10
"""Sustained float64 matrix-product speed of one core (flops per second)."""
_EIGH_SECONDS_PER_CUBE = 2.5e-10  # eigh of n×n: 2.5e-10·n³ s
_SVD_SECONDS_PER_MNK = 7.5e-10  # thin SVD of m×n, k = min(m, n): 7.5e-10·m·n·k s

BLOCK_FLOPS = 1.0e10
"""Largest product :func:`blocked_matmul` issues as one BLAS call (about 0.25 s on one core)."""

LAPACK_THREAD_FLOPS = 4.0e10
"""Calls predicted above this many flop-equivalents (about 1 s) run in :func:`interruptible`."""

MIN_TIME_LIMIT = 1e-3
"""Seconds given to an optimiser whose planning budget has passed: it still takes one step and
returns one valid strategy."""


def _now() -> float:
    """The clock every :class:`WorkLimit` reads (``time.monotonic``; tests substitute it)."""
    return time.monotonic()


class TimeLimitReached(Exception):
    """Raised by :meth:`WorkLimit.check` inside an optimiser; its public function catches it at
    the last safe point and returns the best strategy so far (it never escapes to callers)."""


@dataclass(frozen=True, kw_only=True)
class WorkLimit:
    """An absolute deadline ``time_limit`` seconds after ``started`` (``None``: no limit).

    Built once per public optimiser call and passed down unchanged, so nested stages share it.
    """

    time_limit: float | None = None
    started: float = field(default_factory=lambda: _now())

    def __post_init__(self) -> None:
        limit = self.time_limit
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, Real)
            or not math.isfinite(limit)
            or limit < 0
        ):
            raise ValueError(f"time_limit ({limit!r}) must be None or a finite number >= 0")
        if not (isinstance(self.started, Real) and math.isfinite(self.started)):
            raise ValueError(f"started ({self.started!r}) must be a finite clock value")
        if limit is not None:
            object.__setattr__(self, "time_limit", float(limit))

    def elapsed(self) -> float:
        """Seconds since ``started``."""
        return _now() - self.started

    def remaining(self) -> float:
        """Seconds left (``inf`` without a limit, 0 once expired)."""
        if self.time_limit is None:
            return math.inf
        return max(0.0, self.time_limit - self.elapsed())

    def expired(self) -> bool:
        """True once the limit has passed (never without a limit)."""
        return self.time_limit is not None and self.elapsed() >= self.time_limit

    def check(self) -> None:
        """Raise :class:`TimeLimitReached` if the limit has passed."""
        if self.expired():
            raise TimeLimitReached(f"time limit of {self.time_limit:g} s reached")

    def nested_limit(self) -> float | None:
        """The time limit for a stage inside this one: None without a limit, else what remains
        (at least :data:`MIN_TIME_LIMIT`)."""
        if self.time_limit is None:
            return None
        return max(MIN_TIME_LIMIT, self.remaining())

    def fraction_used(self) -> float:
        """Share of the limit already spent, in [0, 1]; NaN without a limit."""
        if self.time_limit is None:
            return math.nan
        if self.time_limit == 0:
            return 1.0
        return min(1.0, self.elapsed() / self.time_limit)


def report(progress: Progress | None, fraction: float, message: str) -> None:
    """Call ``progress`` (if any) with ``fraction`` clamped to [0, 1] (NaN passed through)."""
    if progress is None:
        return
    value = float(fraction)
    if not math.isnan(value):
        value = min(1.0, max(0.0, value))
    progress(value, message)


def scaled(progress: Progress | None, start: float, stop: float) -> Progress | None:
    """``progress`` for a stage that covers [start, stop] of the whole: maps the stage's own
    fraction f to ``start + f·(stop − start)`` (NaN stays NaN).  None stays None."""
    if progress is None:
        return None
    target = progress

    def stage(fraction: float, message: str) -> None:
        report(target, start + float(fraction) * (stop - start), message)

    return stage


def blocked_matmul(
    left: np.ndarray, right: np.ndarray, *, limit: WorkLimit | None = None
) -> np.ndarray:
    """``left @ right`` in row blocks of at most :data:`BLOCK_FLOPS`; checks ``limit`` first and
    between blocks.

    One BLAS call (bit-identical to ``left @ right``) when the product is small.  Between blocks
    Python handles Ctrl-C, and ``limit.check()`` may raise :class:`TimeLimitReached`.
    O(2·p·q·s) for (p×q)·(q×s).
    """
    if limit is not None:
        limit.check()
    rows, inner = left.shape
    columns = right.shape[1]
    flops = 2.0 * rows * inner * columns
    if flops <= BLOCK_FLOPS:
        return left @ right
    step = max(1, int(BLOCK_FLOPS // max(2.0 * inner * columns, 1.0)))
    out = np.empty((rows, columns), dtype=np.result_type(left.dtype, right.dtype))
    for start in range(0, rows, step):
        if limit is not None and start > 0:
            limit.check()
        np.matmul(left[start : start + step], right, out=out[start : start + step])
    return out


def interruptible(function: Callable[[], _Result], *, flops: float) -> _Result:
    """``function()``, run in a daemon worker thread when ``flops`` is large.

    LAPACK releases the GIL but cannot be interrupted, so the calling thread waits in 0.1 s
    slices and a Ctrl-C raises ``KeyboardInterrupt`` there at once; the abandoned worker finishes
    its call in the background and its result is dropped (it is a daemon: it never delays the
    process's exit).  ``flops`` is the call's predicted cost in DGEMM flop-equivalents; below
    :data:`LAPACK_THREAD_FLOPS` the call runs directly.  Exceptions are re-raised in the caller.
    """
    if flops <= LAPACK_THREAD_FLOPS:
        return function()
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["value"] = function()
        except BaseException as exc:  # handed back to the caller below
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="dprelease-lapack", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.1)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def eigh_seconds(n: int) -> float:
    """Predicted seconds of a dense symmetric eigendecomposition of an n×n matrix (one core)."""
    return _EIGH_SECONDS_PER_CUBE * float(n) ** 3


def svd_seconds(m: int, n: int) -> float:
    """Predicted seconds of a thin SVD (with both factors) of an m×n matrix (one core)."""
    return _SVD_SECONDS_PER_MNK * float(m) * float(n) * float(min(m, n))


# Eigen-Design as the planner calls it: dense O(n³) work (the spectrum, the error of each
# candidate) dominates the weighting program; 0.9-4.2 eighs measured at n = 512-2048
# (benchmarks/predict_bench.py --calibrate eigen), kept at 5 so the planner's candidate order and
# time-limit refusals are those of earlier releases.
_EIGEN_DESIGN_EIGHS = 5.0


def predict_eigen_design_seconds(num_cells: int) -> float:
    """Predicted seconds of :func:`mechanisms.eigen.design.eigen_design` on an n-cell Gram: five
    n×n eighs (one BLAS thread, an idle core).  O(1)."""
    if isinstance(num_cells, bool) or not isinstance(num_cells, int | np.integer) or num_cells < 1:
        raise ValueError(f"num_cells ({num_cells!r}) must be an integer >= 1")
    return 0.005 + _EIGEN_DESIGN_EIGHS * eigh_seconds(int(num_cells))
