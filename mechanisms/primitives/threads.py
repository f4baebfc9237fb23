"""The BLAS thread policy: strategy work runs with one BLAS thread.

On 2-core machines OpenBLAS's spinning worker threads contend with each other and the pipeline
(Prefect, Dask, the validation service): strategy work on matrices of a few thousand rows ran many
times slower with several threads than with one (``benchmarks/strategy_bench.py --blas-threads``).
``flows/cli/__init__.py`` sets ``OPENBLAS_NUM_THREADS=1`` before numpy loads (a user's value wins);
:func:`single_threaded_blas` applies the policy to library callers and tests whatever the environment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import threadpoolctl

BLAS_THREADS = 1


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS and OpenMP pools limited to :data:`BLAS_THREADS` inside the block (also a decorator);
    costs one ``threadpoolctl`` scan of the loaded native libraries per entry."""
    with threadpoolctl.threadpool_limits(limits=BLAS_THREADS):
        yield
