"""mechanisms.primitives.threads: the one BLAS thread policy applies inside the block and is undone after."""

from __future__ import annotations

import numpy as np
import threadpoolctl

from dprelease.mechanisms.primitives.threads import BLAS_THREADS, single_threaded_blas


def _blas_threads() -> list[int]:
    np.ones(1) @ np.ones(1)  # numpy's BLAS is loaded
    return [
        pool["num_threads"]
        for pool in threadpoolctl.threadpool_info()
        if pool["user_api"] == "blas"
    ]


def test_blas_runs_on_one_thread_inside_and_as_before_after() -> None:
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        with single_threaded_blas():
            assert _blas_threads() and set(_blas_threads()) == {BLAS_THREADS}
        assert _blas_threads() == before


def test_as_a_decorator_each_call_is_limited() -> None:
    @single_threaded_blas()
    def inside() -> list[int]:
        return _blas_threads()

    assert set(inside()) == {1}
    assert set(inside()) == {1}  # a fresh limit per call
