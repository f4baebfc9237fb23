"""The BLAS thread policy: strategy work runs with one BLAS thread.

Strategy searches and decompositions multiply and factor matrices of at most a few thousand rows,
thousands of times.  On the 2-core machines this project targets, OpenBLAS's worker threads spin
and contend with each other and with the rest of the pipeline (Prefect, Dask workers, the
validation service): the same work ran many times slower with several BLAS threads than with one
(``benchmarks/strategy_bench.py --blas-threads``).  One thread is never much slower on these
sizes, so every mechanism that does heavy linear algebra runs under :func:`single_threaded_blas`.

``flows/cli/__init__.py`` sets the same policy for the whole command through ``OPENBLAS_NUM_THREADS=1``
(it must be set before numpy is imported; a user's own value wins); this context manager applies
it to library callers and tests too, whatever the environment says.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import threadpoolctl

BLAS_THREADS = 1


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit BLAS (and OpenMP) thread pools to :data:`BLAS_THREADS` inside the block; the previous
    limits come back on exit.  Usable as a decorator: ``@single_threaded_blas()``.  Costs one
    ``threadpoolctl`` scan of the loaded native libraries per entry."""
    with threadpoolctl.threadpool_limits(limits=BLAS_THREADS):
        yield
